"""The gateway's secrets stay in the gateway (DESIGN.md, Secrets; docs/security.md): what a
stdio server it starts can read of its environment, and where an HTTP upstream's
configured headers may go."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import structlog
from aiohttp import web
from conftest import free_port, listening, wait_until_ready
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from mcp_http import BASIC, text_of

from gateway.settings import ConfigError
from gateway.settings.load import from_mapping
from gateway.upstream.sse_client import same_origin
from gateway.upstream.stdio import DEFAULT_ENV


async def test_a_stdio_server_starts_with_a_short_environment(gateway, client, monkeypatch
                                                              ) -> None:
    """Before: every stdio server read the gateway's whole environment (its token, the
    replica secret, the store's URL with its password) from /proc/self/environ."""
    for name, value in {"GATEWAY_TOKEN": "s3cret-token", "GATEWAY_SECRET": "replica-key",
                        "REDIS_URL": "redis://:pw@store:6379", "PASS_ME_ON": "wanted"}.items():
        monkeypatch.setenv(name, value)
    url = await gateway(upstream={"env": {"GIVEN": "by config", "PATH": "/usr/bin:/bin"},
                                  "inherit_env": ["PASS_ME_ON", "NOT_SET_ANYWHERE"]})
    mcp = client(url)
    await mcp.initialize()
    env = json.loads(text_of(await mcp.call("environ")))
    assert not {"GATEWAY_TOKEN", "GATEWAY_SECRET", "REDIS_URL"} & set(env)
    assert "s3cret-token" not in json.dumps(env) and "pw@" not in json.dumps(env)
    assert set(env) <= {*DEFAULT_ENV, "PASS_ME_ON", "GIVEN"}
    assert (env["PASS_ME_ON"], env["GIVEN"], env["PATH"]) == ("wanted", "by config",
                                                              "/usr/bin:/bin")


@pytest.mark.parametrize("name", ["1ABC", "A-B", "A B", ""])
def test_inherit_env_takes_variable_names_only(name: str) -> None:
    with pytest.raises(ConfigError):
        from_mapping({"upstreams": {"main": {"command": "x", "inherit_env": [name]}}})


# -- upstream credentials go to the configured origin only ------------------------------------
async def collector(aiohttp_server) -> tuple[str, list[dict[str, str]]]:
    """Another origin, recording the headers of whatever reaches it."""
    seen: list[dict[str, str]] = []

    async def record(request: web.Request) -> web.Response:
        seen.append(dict(request.headers))
        return web.json_response({})
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", record)
    return str((await aiohttp_server(app)).make_url("")).rstrip("/"), seen


async def start_refused(gateway, http, url: str) -> tuple[dict[str, Any], list[Any]]:
    """A gateway in front of `url` (with an API key header): its initialize's answer to a
    client, and the log events of its start."""
    with structlog.testing.capture_logs() as events:
        mcp_url = await gateway(url=url, wait_ready=False, upstream={
            "headers": {"X-Api-Key": "k-123"}, "startup_timeout_ms": 2000})
        async with http.post(mcp_url, json={
                "jsonrpc": "2.0", "id": 0, "method": "initialize",
                "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                           "clientInfo": {"name": "t", "version": "1"}}},
                headers={"Accept": "application/json, text/event-stream"}) as resp:
            body = await resp.json()
            assert resp.status == 503, body
    return body, events


async def test_a_redirect_to_another_origin_is_not_followed(gateway, http, aiohttp_server
                                                            ) -> None:
    """Before: a 307 from a Streamable HTTP server was followed with the configured
    headers, the upstream's API key with them."""
    other, seen = await collector(aiohttp_server)
    async def redirect(_: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect(other + "/mcp")
    app = web.Application()
    app.router.add_route("*", "/mcp", redirect)
    origin = str((await aiohttp_server(app)).make_url("")).rstrip("/")
    body, events = await start_refused(gateway, http, origin + "/mcp")
    assert not seen  # nothing reached the other origin, the key least of all
    assert "follows no redirect" in body["error"]["message"]
    # Where it points is the operator's to read, no client's (the inside of the network).
    assert other.removeprefix("http://") not in json.dumps(body)
    refused = [e for e in events if e["event"] == "upstream.redirect_refused"]
    assert refused and refused[0]["to"] == other and refused[0]["status"] == 307
    assert any(e["event"] == "upstream.start_failed" for e in events)


async def test_an_sse_endpoint_on_another_origin_is_refused(gateway, http, aiohttp_server
                                                            ) -> None:
    """Before: an HTTP+SSE server's endpoint event could name any URL, and the gateway
    posted its configured headers there."""
    other, seen = await collector(aiohttp_server)

    async def stream(request: web.Request) -> web.StreamResponse:
        if request.method == "POST":  # not Streamable HTTP: the gateway tries HTTP+SSE
            return web.Response(status=405)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(f"event: endpoint\ndata: {other}/messages?s=1\n\n".encode())
        await asyncio.sleep(5)
        return resp
    app = web.Application()
    app.router.add_route("*", "/mcp", stream)
    origin = str((await aiohttp_server(app)).make_url("")).rstrip("/")
    body, events = await start_refused(gateway, http, origin + "/mcp")
    assert not seen
    assert "names another origin" in body["error"]["message"]
    assert other.removeprefix("http://") not in json.dumps(body)  # the operator's log has it
    assert any(e["event"] == "upstream.start_failed" and other in e["said"] for e in events)


def test_an_endpoint_of_the_same_origin_is_taken() -> None:
    base = "http://127.0.0.1:8000/mcp"
    assert same_origin(base, "http://127.0.0.1:8000/messages?s=1").endswith("?s=1")
    for elsewhere in ("https://127.0.0.1:8000/m", "http://127.0.0.1:8001/m",
                      "http://evil.example:8000/m", "http://user@127.0.0.2:8000/m"):
        with pytest.raises(ValueError, match="another origin"):
            same_origin(base, elsewhere)


# -- what an unreadable request gets, and what the log keeps of it ---------------------------
def command_line_gateway(tmp_path: Path, listen: dict[str, Any], **conf: Any
                         ) -> tuple[int, subprocess.Popen[bytes]]:
    """A gateway started as its users start it (`python -m gateway --config`), in front of
    tests/servers/basic.py; its port and process (stderr piped: its log)."""
    port = free_port()
    path = tmp_path / "gw.yaml"
    path.write_text(json.dumps({"listen": {"port": port, **listen}, **conf, "upstreams": {
        "main": {"command": BASIC[0], "args": BASIC[1:]}}}))
    return port, subprocess.Popen([sys.executable, "-m", "gateway", "--config", str(path)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


async def test_long_headers_pass_and_longer_ones_are_refused_unechoed(tmp_path, http) -> None:
    """A JWT past 8 KiB (Entra ID tokens with groups) is read; a header past
    `listen.max_header_bytes` is refused, and the log holds one line, not its bytes."""
    port, proc = command_line_gateway(
        tmp_path, {"max_header_bytes": 16384},
        auth={"bearer_tokens": ["a-token-of-thirty-two-characters"]})
    try:
        await listening(port)
        await wait_until_ready(f"http://127.0.0.1:{port}")
        url = f"http://127.0.0.1:{port}/mcp"
        jwt_like = "eyJhbGciOiJSUzI1NiJ9." + "A" * 12_000
        async with http.post(url, json={}, headers={"Authorization": f"Bearer {jwt_like}"}
                             ) as resp:
            assert resp.status == 401  # read and judged: a wrong token, not a bad request
        secret = "eyJzZWNyZXQiOiJ0b2tlbiJ9." + "B" * 20_000
        async with http.post(url, json={}, headers={"Authorization": f"Bearer {secret}"}
                             ) as resp:
            assert resp.status == 400
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    log = err.decode()
    assert "http.bad_request" in log and "LineTooLong" in log
    assert "eyJzZWNyZXQ" not in log and "Traceback" not in log


def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_file, key_file


async def test_the_gateway_serves_https_with_its_own_certificate(tmp_path, http) -> None:
    """listen.tls_cert / tls_key: bearer tokens never cross a network in clear (RFC 6750
    section 5.3) where the gateway ends TLS itself."""
    cert, key = self_signed(tmp_path)
    port, proc = command_line_gateway(tmp_path, {"tls_cert": str(cert), "tls_key": str(key)})
    try:
        await listening(port)
        trusted = ssl.create_default_context(cafile=str(cert))
        async with http.get(f"https://127.0.0.1:{port}/healthz", ssl=trusted) as resp:
            assert resp.status == 200
        init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "tls", "version": "1"}}}
        async with http.post(f"https://127.0.0.1:{port}/mcp", json=init, ssl=trusted,
                             headers={"Accept": "application/json, text/event-stream"}
                             ) as resp:  # served below the web layer (serving.py)
            assert resp.status == 200 and "Mcp-Session-Id" in resp.headers
            assert (await resp.json())["result"]["protocolVersion"] == "2025-06-18"
        with pytest.raises(aiohttp.ClientError):  # no plain HTTP beside it
            async with http.get(f"http://127.0.0.1:{port}/healthz") as resp:
                await resp.read()
    finally:
        proc.terminate()
        proc.communicate(timeout=10)


def test_tls_needs_both_files() -> None:
    with pytest.raises(ConfigError, match="go together"):
        from_mapping({"listen": {"tls_cert": "c.pem"},
                      "upstreams": {"main": {"command": "x"}}})


def test_short_static_tokens_are_refused_beyond_loopback() -> None:
    beyond = {"listen": {"host": "0.0.0.0"}, "upstreams": {"main": {"command": "x"}}}
    with pytest.raises(ConfigError, match="shorter than 32 characters") as refused:
        from_mapping({**beyond, "auth": {"bearer_tokens": ["s3cret-token"]}})
    assert "s3cret" not in str(refused.value)  # the token itself is never shown
    from_mapping({**beyond, "auth": {"bearer_tokens": ["x" * 32]}})
    from_mapping({"upstreams": {"main": {"command": "x"}},
                  "auth": {"bearer_tokens": ["short-on-loopback"]}})  # a warning at start


def test_check_config_shows_urls_without_credentials(tmp_path, capsys) -> None:
    """A configuration error quoting a URL back shows it without userinfo or query."""
    from gateway.cli import main

    conf = tmp_path / "bad.yaml"
    conf.write_text('upstreams:\n  main: {url: "ftp://user:hunter2@example.com/mcp?api_key=z"}\n')
    assert main(["--check-config", str(conf)]) != 0
    err = capsys.readouterr().err
    assert "ftp://example.com/mcp" in err and "hunter2" not in err and "api_key" not in err
