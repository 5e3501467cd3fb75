"""The gateway as an OAuth 2.1 resource server (MCP authorization spec) in front of the stdio
test server, with node's oidc-provider as the authorization server: metadata and
challenges, JWTs checked against the issuer's keys, opaque tokens introspected, tasks owned
by the principal across tokens, per-tool scopes, and every bad token refused clearly."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jwt
import pytest
import redis.asyncio
import structlog
from aiohttp import web
from conftest import free_port, listening, node_env, settings_for, wait_until_ready
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from idp import Idp, Key
from mcp_http import McpHttp
from test_http_upstream import basic_http
from test_modern import modern
from test_operations import scrape, value
from test_tasks import POLICY, call, tasks_op, wait_for

from gateway.app import create_app
from gateway.settings.load import from_mapping

pytestmark = pytest.mark.node
ROOT = Path(__file__).parents[2]
SCOPED = {**POLICY, "tools": {**POLICY["tools"], "sleep": {"mode": "always"},
                              "slow*": {"scopes": ["deploy"]}, "whoami": {"mode": "always",
                                                                          "scopes": ["deploy"]}}}


@pytest.fixture(scope="module")
def gw_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def idp(gw_port: int) -> Any:
    server = Idp(free_port(), f"http://127.0.0.1:{gw_port}/mcp", Key("k1")).start()
    yield server
    server.close()


@pytest.fixture
async def oauth(aiohttp_server: Any, idp: Idp, gw_port: int) -> Any:
    """Start a gateway on the resource's port with `auth.oauth` for `idp` (and overrides)."""

    async def start(oauth: dict[str, Any] | None = None, **overrides: Any) -> str:
        conf = {"resource": idp.resource, "issuers": [idp.issuer], "key_refresh_s": 1,
                **(oauth or {})}
        raw = settings_for(tasks=SCOPED, auth={"oauth": conf}, **overrides)
        server = await aiohttp_server(create_app(from_mapping(raw)), port=gw_port)
        base = str(server.make_url(""))
        await wait_until_ready(base)
        return base + "/mcp"

    return start


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def challenge(reply: Any) -> dict[str, str]:
    """The auth-params of a `WWW-Authenticate: Bearer k="v", ...` header."""
    scheme, _, rest = reply.headers["WWW-Authenticate"].partition(" ")
    assert scheme == "Bearer"
    return dict((k.strip(), v.strip('"')) for k, _, v in
                (p.partition("=") for p in rest.split('", ')))


# -- metadata and challenges ----------------------------------------------------------------
async def test_metadata_names_the_resource_and_its_authorization_server(oauth, idp, http
                                                                         ) -> None:
    url = await oauth({"scopes": ["tools"]})
    base = url.removesuffix("/mcp")
    for path in ("/.well-known/oauth-protected-resource",
                 "/.well-known/oauth-protected-resource/mcp"):
        async with http.get(base + path, headers={"Origin": "https://elsewhere.example"}) as r:
            assert r.status == 200 and r.headers["Access-Control-Allow-Origin"] == "*"
            doc = await r.json()
        assert doc["resource"] == idp.resource
        assert doc["authorization_servers"] == [idp.issuer]
        assert doc["scopes_supported"] == ["deploy", "tools"]
        # RFC 9728 section 2: that is for what the resource signs; this one signs nothing.
        assert "resource_signing_alg_values_supported" not in doc


async def test_no_token_gets_401_pointing_to_the_metadata_in_both_eras(oauth, http) -> None:
    url = await oauth({"scopes": ["tools"]})
    metadata = url.replace("/mcp", "/.well-known/oauth-protected-resource/mcp")
    legacy = await McpHttp(http, url).send({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                                            "params": {}})
    fresh = await call(http, url, "echo", {"text": "x"})
    async with http.get(url, headers={"Mcp-Session-Id": "x"}) as stream:
        got = stream.status, dict(stream.headers)
    for status, headers in [(legacy.status, legacy.headers), (fresh.status, fresh.headers),
                            got]:
        assert status == 401
        assert challenge(type("R", (), {"headers": headers})) == {
            "resource_metadata": metadata, "scope": "tools"}
    async with http.get(metadata) as resp:  # where the challenge points, something answers
        assert resp.status == 200


# -- tokens from the real server ------------------------------------------------------------
async def test_a_client_credentials_token_opens_both_eras(oauth, idp, http) -> None:
    url = await oauth()
    token = await idp.token(http)
    mcp = McpHttp(http, url)
    init = await mcp.initialize(headers=bearer(token))
    assert init.status == 200
    echoed = await mcp.call("echo", {"text": "legacy"}, **bearer(token))
    assert echoed.message["result"]["content"][0]["text"] == "legacy"
    reply = await call(http, url, "echo", {"text": "modern"}, headers=bearer(token))
    assert reply.status == 200 and reply.body["result"]["content"][0]["text"] == "modern"


async def test_a_token_for_another_resource_is_refused(oauth, idp, http) -> None:
    """RFC 8707 and the confused-deputy rule: the server mints it; the gateway refuses it."""
    url = await oauth()
    other = await idp.token(http, resource="http://other.example/mcp")
    reply = await call(http, url, "echo", {"text": "x"}, headers=bearer(other))
    assert reply.status == 401 and challenge(reply)["error"] == "invalid_token"
    assert "not issued for this resource" in reply.body["error"]["message"]


async def test_tasks_belong_to_the_principal_across_its_tokens(oauth, idp, http) -> None:
    url = await oauth()
    first, refreshed = await idp.token(http), await idp.token(http)
    assert first != refreshed
    task = (await call(http, url, "sleep", {"ms": 300}, headers=bearer(first))).body["result"]
    done = await wait_for(http, url, task["taskId"], "completed", bearer(refreshed))
    assert done["result"]["content"][0]["text"] == "slept 300"
    # Another principal (another client of the same server) gets what an unknown id gets.
    stranger = bearer(await idp.token(http, client="robot2"))
    foreign = await tasks_op(http, url, "tasks/get", task["taskId"], stranger)
    unknown = await tasks_op(http, url, "tasks/get", "no-such-task", stranger)
    assert foreign.status == unknown.status == 400
    assert foreign.body["error"]["message"] == unknown.body["error"]["message"]
    cancel = await tasks_op(http, url, "tasks/cancel", task["taskId"], stranger)
    assert cancel.body["error"]["message"] == unknown.body["error"]["message"]


async def test_a_legacy_session_survives_a_token_refresh(oauth, idp, http) -> None:
    url = await oauth()
    mcp = McpHttp(http, url)
    await mcp.initialize(headers=bearer(await idp.token(http)))
    again = await mcp.call("echo", {"text": "after refresh"}, **bearer(await idp.token(http)))
    assert again.message["result"]["content"][0]["text"] == "after refresh"
    stranger = await mcp.call("echo", {"text": "x"},
                              **bearer(await idp.token(http, client="robot2")))
    assert stranger.status == 404  # another principal cannot use the session


async def test_opaque_tokens_are_introspected(oauth, idp, http) -> None:
    url = await oauth({"introspection": {"url": f"{idp.issuer}/token/introspection",
                                         "client_id": "gateway",
                                         "client_secret": "gateway-secret"}})
    opaque = await idp.token(http, client="opaque-robot")
    assert opaque.count(".") != 2
    reply = await call(http, url, "echo", {"text": "opaque"}, headers=bearer(opaque))
    assert reply.status == 200 and reply.body["result"]["content"][0]["text"] == "opaque"
    wrong = await call(http, url, "echo", {"text": "x"}, headers=bearer("not-a-real-token"))
    assert wrong.status == 401 and "not active" in wrong.body["error"]["message"]


# -- scopes ---------------------------------------------------------------------------------
async def test_tools_need_their_scopes_in_both_eras(oauth, idp, http) -> None:
    url = await oauth()
    plain, deployer = await idp.token(http), await idp.token(http, scope="tools deploy")
    listed = await modern(http, url, "tools/list", {}, {}, headers=bearer(plain))
    names = {t["name"] for t in listed.body["result"]["tools"]}
    assert "echo" in names and "whoami" not in names
    refused = await call(http, url, "whoami", headers=bearer(plain))
    assert refused.status == 403
    assert challenge(refused)["error"] == "insufficient_scope"
    assert challenge(refused)["scope"] == "deploy"
    assert refused.body["error"]["data"] == {"requiredScopes": ["deploy"]}
    mcp = McpHttp(http, url)
    await mcp.initialize(version="2025-11-25", headers=bearer(plain))
    legacy_list = await mcp.send({"jsonrpc": "2.0", "id": 5, "method": "tools/list"},
                                 **bearer(plain))
    assert "whoami" not in {t["name"] for t in legacy_list.message["result"]["tools"]}
    legacy = await mcp.call("whoami", **bearer(plain))
    assert legacy.status == 403 and challenge(legacy)["scope"] == "deploy"
    allowed = await call(http, url, "whoami", headers=bearer(deployer))
    task = allowed.body["result"]
    assert task["resultType"] == "task"
    # Its tasks/* need the tool's scopes too: the same principal with a narrower token.
    narrower = await tasks_op(http, url, "tasks/get", task["taskId"], bearer(plain))
    assert narrower.status == 403 and challenge(narrower)["scope"] == "deploy"
    await wait_for(http, url, task["taskId"], "completed", bearer(deployer))
    # Finished and read, its answer is kept (tasks/kept.py): still its tool's scopes only.
    narrower = await tasks_op(http, url, "tasks/get", task["taskId"], bearer(plain))
    assert narrower.status == 403 and challenge(narrower)["scope"] == "deploy"


async def test_scopes_every_request_needs(oauth, idp, http) -> None:
    url = await oauth({"scopes": ["deploy"]})
    reply = await call(http, url, "echo", {"text": "x"}, headers=bearer(await idp.token(http)))
    assert reply.status == 403 and challenge(reply) == {
        "error": "insufficient_scope", "scope": "deploy",
        "resource_metadata": url.replace("/mcp", "/.well-known/oauth-protected-resource/mcp"),
        "error_description": "Forbidden: this resource needs the scope(s) deploy"}
    ok = await call(http, url, "echo", {"text": "x"},
                    headers=bearer(await idp.token(http, scope="tools deploy")))
    assert ok.status == 200


# -- bad tokens -----------------------------------------------------------------------------
def _unsigned(claims: dict[str, Any]) -> str:
    def part(obj: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()
    return f"{part({'alg': 'none', 'typ': 'JWT'})}.{part(claims)}."


def _tampered(token: str) -> str:
    head, body, sig = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    claims["sub"] = "someone-else"
    forged = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    return f"{head}.{forged}.{sig}"


def _hs256_with_public_key(idp: Idp) -> str:
    """The algorithm-confusion attack: the issuer's public key used as an HMAC secret."""
    pem = idp.key.private.public_key().public_bytes(Encoding.PEM,
                                                    PublicFormat.SubjectPublicKeyInfo)
    def part(obj: dict[str, Any]) -> bytes:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=")
    signing = part({"alg": "HS256", "kid": idp.key.kid}) + b"." + part(idp.claims())
    sig = base64.urlsafe_b64encode(hmac.new(pem, signing, hashlib.sha256).digest())
    return (signing + b"." + sig.rstrip(b"=")).decode()


async def test_every_bad_token_is_a_clear_401_and_counted(oauth, idp, http) -> None:
    url = await oauth({"admin_scopes": ["deploy"]})
    now = idp.claims()["iat"]
    stranger_key = Key("k-unknown")
    bad = {
        "expired": idp.key.sign(idp.claims(exp=now - 600)),
        "not_yet_valid": idp.key.sign(idp.claims(nbf=now + 600)),
        "audience": idp.key.sign(idp.claims(aud="http://other.example/mcp")),
        "issuer": idp.key.sign(idp.claims(iss="http://evil.example")),
        "unknown_key": stranger_key.sign(idp.claims()),
        "algorithm": _unsigned(idp.claims()),
        "signature": _tampered(idp.key.sign(idp.claims())),
        "malformed": "this.is-not.a-jwt",
        "claims": idp.key.sign({k: v for k, v in idp.claims().items() if k != "exp"}),
    }
    with structlog.testing.capture_logs() as events:
        for cause, token in bad.items():
            reply = await call(http, url, "echo", {"text": "x"}, headers=bearer(token))
            assert reply.status == 401, (cause, reply.body)
            assert challenge(reply)["error"] == "invalid_token", cause
            assert reply.body["error"]["code"] == -32600
        confused = await call(http, url, "echo", {"text": "x"},
                              headers=bearer(_hs256_with_public_key(idp)))
        assert confused.status == 401
        basic = await call(http, url, "echo", {"text": "x"},
                           headers={"Authorization": "Basic cm9ib3Q6cm9ib3Qtc2VjcmV0"})
        assert basic.status == 401 and challenge(basic)["error"] == "invalid_token"
    audits = [e for e in events if e["event"] == "auth.failed"]
    assert [e["reason"] for e in audits] == [*bad, "algorithm", "malformed"]
    assert not any(token in json.dumps(e, default=str) for e in audits for token in bad.values())
    samples = await scrape(http, url, bearer(await idp.token(http, scope="tools deploy")))
    for cause in bad:
        expected = 2 if cause in ("algorithm", "malformed") else 1
        assert value(samples, "mcp_gateway_rejections_total", reason="auth",
                     cause=cause) == expected, cause


async def test_access_tokens_may_be_required_to_say_so(oauth, idp, http) -> None:
    """`require_at_jwt` (RFC 9068 section 4): a JWT of the issuer whose `typ` is not at+jwt
    (an ID token, say) is not taken for an access token; oidc-provider's are at+jwt."""
    url = await oauth({"require_at_jwt": True})
    assert jwt.get_unverified_header(await idp.token(http))["typ"] == "at+jwt"
    ok = await call(http, url, "echo", {"text": "x"}, headers=bearer(await idp.token(http)))
    assert ok.status == 200, ok.body
    media_type = idp.key.sign(idp.claims(), typ="application/at+jwt")
    assert (await call(http, url, "echo", {"text": "x"}, headers=bearer(media_type))
            ).status == 200
    for typ in ("JWT", None):
        token = idp.key.sign(idp.claims(), typ=typ)
        with structlog.testing.capture_logs() as events:
            reply = await call(http, url, "echo", {"text": "x"}, headers=bearer(token))
        assert reply.status == 401 and "typ must be at+jwt" in reply.body["error"]["message"]
        assert [e["reason"] for e in events if e["event"] == "auth.failed"] == ["typ"]


async def test_key_rotation_needs_no_gateway_restart(oauth, idp, http) -> None:
    url = await oauth()
    old = await idp.token(http)
    assert (await call(http, url, "echo", {"text": "x"}, headers=bearer(old))).status == 200
    idp.start(Key("k2"))  # the server now signs with a key the gateway has not seen
    try:
        new = await idp.token(http)
        assert jwt.get_unverified_header(new)["kid"] == "k2"
        await asyncio.sleep(1.1)  # key_refresh_s: an unknown key id fetches keys at most so often
        reply = await call(http, url, "echo", {"text": "rotated"}, headers=bearer(new))
        assert reply.status == 200 and reply.body["result"]["content"][0]["text"] == "rotated"
    finally:
        idp.start(Key("k1"))


async def test_an_authorization_server_that_is_down_is_a_503_never_a_pass(oauth, idp, http
                                                                          ) -> None:
    url = await oauth({"fetch_timeout_ms": 500})
    token = await idp.token(http)
    idp.stop()
    try:
        with structlog.testing.capture_logs() as events:
            reply = await call(http, url, "echo", {"text": "x"}, headers=bearer(token))
        assert reply.status == 503 and "Cannot check the access token" in \
            reply.body["error"]["message"]
        # Where the authorization server is, is the operator's to know (logged), not the
        # caller's.
        assert "127.0.0.1" not in json.dumps(reply.body)
        assert any(e["event"] == "auth.server_unavailable" and e["url"].startswith(idp.issuer)
                   for e in events)
    finally:
        idp.start()
    await asyncio.sleep(1.1)  # the gateway asks again a second after a failure
    assert (await call(http, url, "echo", {"text": "x"}, headers=bearer(token))).status == 200


@pytest.mark.parametrize("keys", ["hang", "garbage", "not-a-key-set"])
async def test_a_key_endpoint_that_hangs_or_talks_garbage_is_a_503(gateway, aiohttp_server,
                                                                   http, keys) -> None:
    """The issuer's metadata is fine, its jwks_uri is not: the gateway's dependency is down
    (503 and a log event), the caller is not wrong, and nobody gets through."""
    async def metadata(request: web.Request) -> web.Response:
        base = str(request.url.origin())
        return web.json_response({"issuer": base, "jwks_uri": base + "/jwks"})

    async def jwks(_: web.Request) -> web.Response:
        if keys == "hang":
            await asyncio.sleep(30)
        return web.Response(text="<html>oops</html>" if keys == "garbage" else '{"k": 1}')

    app = web.Application()
    app.router.add_get("/.well-known/oauth-authorization-server", metadata)
    app.router.add_get("/jwks", jwks)
    issuer = str((await aiohttp_server(app)).make_url("")).rstrip("/")
    url = await gateway(auth={"oauth": {"resource": "http://gw.test/mcp", "issuers": [issuer],
                                        "fetch_timeout_ms": 300}})
    now = int(time.time())
    token = Key("k1").sign({"iss": issuer, "sub": "me", "aud": "http://gw.test/mcp",
                            "exp": now + 60})
    with structlog.testing.capture_logs() as events:
        reply = await call(http, url, "echo", {"text": "x"}, headers=bearer(token))
    assert reply.status == 503, reply.body
    assert reply.body["error"]["data"] == {"reason": "auth_unavailable"}
    assert [e["url"] for e in events if e["event"] == "auth.server_unavailable"] == [
        issuer + "/jwks"]


async def test_an_introspection_endpoint_that_is_down_is_a_503(gateway, http) -> None:
    url = await gateway(auth={"oauth": {
        "resource": "http://gw.test/mcp", "issuers": ["http://127.0.0.1:9"],
        "fetch_timeout_ms": 300,
        "introspection": {"url": f"http://127.0.0.1:{free_port()}/introspect",
                          "client_id": "gateway", "client_secret": "s3cret-not-logged"}}})
    with structlog.testing.capture_logs() as events:
        reply = await call(http, url, "echo", {"text": "x"}, headers=bearer("opaque-token"))
    assert reply.status == 503 and reply.body["error"]["data"]["reason"] == "auth_unavailable"
    assert any(e["event"] == "auth.server_unavailable" for e in events)
    assert "s3cret" not in json.dumps(events, default=str)


# -- what reaches upstreams -----------------------------------------------------------------
async def test_the_callers_token_never_goes_upstream_its_exchange_does(gateway, idp, http
                                                                       ) -> None:
    """No token passthrough (MCP authorization spec): an HTTP upstream sees no Authorization
    by default, and with `token_exchange` a token the server minted for it (RFC 8693) that
    names the caller as subject, never the caller's own token."""
    exchange = {"url": f"{idp.issuer}/token", "client_id": "gateway",
                "client_secret": "gateway-secret", "audience": "http://upstream.test"}
    oauth = {"resource": idp.resource, "issuers": [idp.issuer]}
    async with basic_http() as base:
        for upstream in ({}, {"token_exchange": exchange}):
            url = await gateway(url=base + "/mcp", upstream=upstream, auth={"oauth": oauth})
            token = await idp.token(http)
            for era in ("modern", "legacy"):
                if era == "modern":
                    reply = await call(http, url, "echo", {"text": "hi"}, headers=bearer(token))
                    assert reply.status == 200, reply.body
                else:
                    mcp = McpHttp(http, url)
                    await mcp.initialize(headers=bearer(token))
                    await mcp.call("echo", {"text": "hi"}, **bearer(token))
                async with http.get(base + "/seen") as resp:
                    seen = {k.lower(): v for k, v in (await resp.json()).items()}
                if not upstream:
                    assert "authorization" not in seen
                    continue
                sent = seen["authorization"].removeprefix("Bearer ")
                assert sent != token
                claims = jwt.decode(sent, options={"verify_signature": False})
                assert claims["aud"] == "http://upstream.test" and claims["sub"] == "robot"
                assert claims["act"] == {"sub": "gateway"}


async def test_the_readme_oauth_walkthrough(http) -> None:
    """docs/oauth.md (once README, OAuth): its commands as they stand (ports moved to free
    ones), against the shipped config/oauth.yaml and server-everything through npx."""
    readme = (ROOT / "docs" / "oauth.md").read_text()
    block = readme.split("client credentials grant:\n\n", 1)[1].split("\n\n", 1)[0]
    gw, idp_port = free_port(), free_port()
    lines = block.replace("8080", str(gw)).replace("9000", str(idp_port)).replace(
        "\\\n", "").splitlines()
    server, export, start, *curls = (line.strip() for line in lines)
    assert server.endswith("&") and export.startswith("export OAUTH_ISSUER=")
    assert start == "mcp-task-gateway --config config/oauth.yaml"
    env = {**node_env(), "OAUTH_ISSUER": export.partition("=")[2],
           "GATEWAY_RESOURCE": f"http://127.0.0.1:{gw}/mcp"}
    idp = subprocess.Popen(server.rstrip("& ").split(), cwd=ROOT, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    gateway = subprocess.Popen([str(Path(sys.executable).parent / "mcp-task-gateway"),
                                "--config", "config/oauth.yaml", "--port", str(gw)],
                               cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        await listening(idp_port)
        await wait_until_ready(f"http://127.0.0.1:{gw}", 120)
        shell = await asyncio.create_subprocess_exec(
            "bash", "-euc", "\n".join(curls), cwd=ROOT, env=env,
            stdout=asyncio.subprocess.PIPE)
        out, _ = await shell.communicate()
        assert shell.returncode == 0
        text, decoder = out.decode(), json.JSONDecoder()
        metadata, end = decoder.raw_decode(text)  # curl -s ends no answer with a newline
        initialized, _ = decoder.raw_decode(text[end:].lstrip())
        assert metadata["authorization_servers"] == [env["OAUTH_ISSUER"]]
        assert initialized["result"]["serverInfo"]["name"]
    finally:
        for proc in (gateway, idp):
            proc.terminate()
            proc.wait(10)


async def test_the_shared_store_holds_owners_as_digests_only(oauth, idp, http, redis_server,
                                                             key_prefix) -> None:
    """A session id is a bearer secret and a subject is personal: neither, nor a token,
    is written to Redis; what is written (a digest) still finds the owner's tasks."""
    url = await oauth(store={"backend": "redis", "url": redis_server.url,
                             "key_prefix": key_prefix},
                      replica={"secret": "a secret every replica shares"})
    token = await idp.token(http)
    modern_task = (await call(http, url, "sleep", {"ms": 100}, headers=bearer(token))
                   ).body["result"]
    mcp = McpHttp(http, url)
    await mcp.initialize(version="2025-11-25", headers=bearer(token))
    core = await mcp.send({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
        "name": "sleep", "arguments": {"ms": 100}, "task": {"ttl": 60000}}}, **bearer(token))
    core_task = core.message["result"]["task"]
    await wait_for(http, url, modern_task["taskId"], "completed", bearer(token))
    store = redis.asyncio.Redis.from_url(redis_server.url)
    try:
        dumped = b""
        async for key in store.scan_iter(match=f"{key_prefix}*"):
            kind = await store.type(key)
            if kind == b"string":
                dumped += key + await store.get(key)
            elif kind == b"hash":
                dumped += key + b"".join(k + v for k, v in (await store.hgetall(key)).items())
            elif kind == b"zset":
                dumped += key + b"".join(await store.zrange(key, 0, -1))
            elif kind == b"set":
                dumped += key + b"".join(await store.smembers(key))
    finally:
        await store.aclose()
    assert core_task["taskId"].encode() in dumped and modern_task["taskId"].encode() in dumped
    for secret in (mcp.session_id, token, "robot"):
        assert secret is not None and secret.encode() not in dumped, secret


async def test_every_mcp_path_has_its_metadata_and_challenge(aiohttp_server, idp, http
                                                             ) -> None:
    basic = settings_for()["upstreams"]["main"]
    raw = {"upstreams": {"a": {**basic, "path": "/a/mcp"}, "b": {**basic, "path": "/b/mcp"}},
           "auth": {"oauth": {"resource": "http://gw.test", "issuers": [idp.issuer]}},
           "logging": {"level": "warning"}}
    server = await aiohttp_server(create_app(from_mapping(raw)))
    base = str(server.make_url("")).rstrip("/")
    await wait_until_ready(base)
    for path in ("/a/mcp", "/b/mcp"):
        reply = await call(http, base + path, "echo", {"text": "x"})
        assert reply.status == 401
        where = challenge(reply)["resource_metadata"]
        assert where == f"http://gw.test/.well-known/oauth-protected-resource{path}"
        async with http.get(base + where.removeprefix("http://gw.test")) as resp:
            assert (await resp.json())["resource"] == "http://gw.test"
        ok = await call(http, base + path, "echo", {"text": path},
                        headers=bearer(await idp.token(http, resource="http://gw.test")))
        assert ok.body["result"]["content"][0]["text"] == path


async def test_passing_the_token_on_takes_saying_so_and_is_warned_of(gateway, http) -> None:
    """Token passthrough only where `forward_headers` names Authorization, with a warning
    at start (the spec forbids it; some deployments front an upstream that checks the same
    tokens)."""
    async with basic_http() as base:
        with structlog.testing.capture_logs() as events:
            url = await gateway(url=base + "/mcp", upstream={"forward_headers": ["Authorization"]},
                                auth={"bearer_tokens": ["passed-on-token"]})
        assert [e["upstream"] for e in events
                if e["event"] == "upstream.forwards_authorization"] == ["main"]
        reply = await call(http, url, "echo", {"text": "x"}, headers=bearer("passed-on-token"))
        assert reply.status == 200
        async with http.get(base + "/seen") as resp:
            seen = {k.lower(): v for k, v in (await resp.json()).items()}
    assert seen["authorization"] == "Bearer passed-on-token"
