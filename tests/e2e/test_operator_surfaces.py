"""The operator's surfaces (issue 29, item 5), over real loopback HTTP in front of the stdio
test server: /status, /metrics and /readyz's detail for operators only (an admin token, an
OAuth admin scope; with no auth at all this machine's unproxied peers), /readyz open but saying
nothing beyond ready; an upstream URL's credentials shown nowhere; Host names checked
against DNS rebinding."""

from __future__ import annotations

import asyncio
import base64
import json
import socket
from pathlib import Path

import aiohttp
import pytest
import structlog
import yaml
from aiohttp import web
from conftest import settings_for, wait_until_ready
from idp import Idp
from mcp_http import McpHttp
from test_oauth import gw_port, idp, oauth  # noqa: F401 (fixtures)
from test_operations import scrape, value
from test_tasks import POLICY, call, tasks_op
from yarl import URL

from gateway.app import create_app
from gateway.settings.load import from_mapping

# 32 characters at least: one test serves beyond loopback, where shorter ones are refused.
ALICE_TOKEN, BOB_TOKEN = "alice-token-" + "a" * 24, "bob-token-" + "b" * 24
OPERATOR_TOKEN = "operator-token-" + "o" * 24
ALICE, BOB = {"Authorization": f"Bearer {ALICE_TOKEN}"}, {"Authorization": f"Bearer {BOB_TOKEN}"}
ADMIN = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
CLIENTS = {"bearer_tokens": [ALICE_TOKEN, BOB_TOKEN]}
OPERATOR_ROUTES = ("/status", "/metrics", "/readyz?detail")
SECRETS = ("pa55word", "s3cretkey")
ROOT = Path(__file__).parents[2]


async def get(http: aiohttp.ClientSession, url: str, path: str,
              headers: dict[str, str] | None = None) -> tuple[int, str]:
    async with http.get(url.removesuffix("/mcp") + path, headers=headers) as resp:
        return resp.status, await resp.text()


async def slow_task_of_alice(http: aiohttp.ClientSession, url: str) -> str:
    task = (await call(http, url, "sleep", {"ms": 20_000}, headers=ALICE)).body["result"]
    assert task["resultType"] == "task"
    return str(task["taskId"])


async def test_a_client_token_opens_no_operator_route(gateway, http) -> None:
    url = await gateway(tasks=POLICY, auth={**CLIENTS, "admin_tokens": [OPERATOR_TOKEN]})
    task_id = await slow_task_of_alice(http, url)
    for path in OPERATOR_ROUTES:
        for who in (BOB, ALICE):  # a valid client, even the task's owner, is no operator
            status, body = await get(http, url, path, who)
            assert status == 403, (path, body)
            assert "operator" in json.loads(body)["error"]["message"]
            assert task_id not in body and "sleep" not in body
        status, _ = await get(http, url, path)  # on this machine, but named operators only
        assert status == 401
        status, _ = await get(http, url, path, {"Authorization": "Bearer wrong"})
        assert status == 401
    status, page = await get(http, url, "/status", ADMIN)
    assert status == 200 and task_id in page and "<td>sleep</td><td>working</td>" in page
    samples = await scrape(http, url, ADMIN)
    assert value(samples, "mcp_gateway_tasks_live", status="working") == 1
    assert value(samples, "mcp_gateway_rejections_total", reason="auth", cause="operator") == 6
    status, detail = await get(http, url, "/readyz?detail", ADMIN)
    assert status == 200 and json.loads(detail)["tasks"]["running"] == 1
    # Alice's task went on untouched, and the admin token is no client's.
    got = await tasks_op(http, url, "tasks/get", task_id, ALICE)
    assert got.body["result"]["status"] == "working"
    assert (await call(http, url, "echo", {"text": "x"}, headers=ADMIN)).status == 401


async def test_readyz_says_ready_and_nothing_else_without_the_guard(gateway, http) -> None:
    url = await gateway(tasks=POLICY, auth={**CLIENTS, "admin_tokens": [OPERATOR_TOKEN]})
    await slow_task_of_alice(http, url)
    for who in (None, BOB):
        status, body = await get(http, url, "/readyz", who)
        assert status == 200 and json.loads(body) == {"ready": True}
    status, body = await get(http, url, "/readyz?detail", ADMIN)
    detail = json.loads(body)
    assert detail["ready"] is True and detail["upstreams"]["main"]["state"] == "ready"
    assert detail["store"]["backend"] == "memory"


async def test_with_client_auth_a_loopback_peer_is_no_operator(gateway, http) -> None:
    """Issue 41: a reverse proxy on the same host makes every client a loopback peer; with
    client auth and no operator named, nobody reads the operator's routes on this port."""
    url = await gateway(tasks=POLICY, auth=CLIENTS)
    task_id = await slow_task_of_alice(http, url)
    for path in OPERATOR_ROUTES:
        for who, expected in ((None, 401), ({"Authorization": "Bearer wrong"}, 401),
                              (ALICE, 403), (BOB, 403)):
            status, body = await get(http, url, path, who)
            assert status == expected, (path, who, body)
            assert task_id not in body and "sleep" not in body


async def test_without_auth_this_machine_is_the_operator(gateway, http) -> None:
    url = await gateway(tasks=POLICY)
    task_id = await slow_task_of_alice(http, url)
    status, page = await get(http, url, "/status")  # no token: a loopback peer
    assert status == 200 and task_id in page
    status, _ = await get(http, url, "/metrics")
    assert status == 200
    status, body = await get(http, url, "/readyz?detail")
    assert status == 200 and json.loads(body)["tasks"]["running"] == 1
    # A proxy on this machine speaks for someone else: loopback no longer says who.
    for forwarded in ({"X-Forwarded-For": "203.0.113.7"}, {"Forwarded": "for=203.0.113.7"},
                      {"X-Real-IP": "203.0.113.7"}):
        status, body = await get(http, url, "/status", forwarded)
        assert status == 403 and task_id not in body


def address_beyond_loopback() -> str:
    """This machine's address on its default route (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))
        except OSError:
            pytest.fail("this machine has no address beyond loopback to test from")
        address = str(s.getsockname()[0])
    assert not address.startswith("127."), address
    return address


async def test_a_peer_beyond_loopback_is_no_operator_unless_named(aiohttp_server, http
                                                                 ) -> None:
    """Bound beyond loopback, a peer on another address (here this machine's own, which is
    not loopback) reads no operator route, whatever client token it holds, until an admin
    token says who it is."""
    host = address_beyond_loopback()
    for admins, expected in (([], 403), ([OPERATOR_TOKEN], 200)):
        raw = settings_for(tasks=POLICY, listen={"host": host},
                           auth={**CLIENTS, "admin_tokens": admins})
        server = await aiohttp_server(create_app(from_mapping(raw)), host=host)
        base = str(server.make_url(""))
        await wait_until_ready(base)
        for path in OPERATOR_ROUTES:
            status, _ = await get(http, base, path, ADMIN if admins else BOB)
            assert status == expected, (path, admins)
        status, body = await get(http, base, "/readyz")  # the probe stays open
        assert status == 200 and json.loads(body) == {"ready": True}


@pytest.mark.node
async def test_an_oauth_admin_scope_makes_an_operator(oauth, idp: Idp, http) -> None:  # noqa: F811
    url = await oauth({"admin_scope": "deploy"})
    client = {"Authorization": f"Bearer {await idp.token(http, scope='tools')}"}
    operator = {"Authorization": f"Bearer {await idp.token(http, scope='tools deploy')}"}
    for path in OPERATOR_ROUTES:
        status, _ = await get(http, url, path, client)
        assert status == 403, path
        status, _ = await get(http, url, path, operator)
        assert status == 200, path
    # The operator's token is a client's too (its principal holds the scope it needs).
    assert (await call(http, url, "echo", {"text": "x"}, headers=operator)).status == 200


@pytest.mark.node
async def test_the_oauth_try_out_reaches_the_operator_pages(oauth, idp: Idp, http  # noqa: F811
                                                           ) -> None:
    """Issue 41: config/oauth.yaml's admin scope, which the demo authorization server
    (tests/node/idp.mjs) grants to its client `operator` and to no other."""
    shipped = yaml.safe_load((ROOT / "config" / "oauth.yaml").read_text())["auth"]["oauth"]
    url = await oauth({"admin_scopes": shipped["admin_scopes"], "scopes": shipped["scopes"]})
    operator = {"Authorization": "Bearer " + await idp.token(
        http, client="operator", scope=" ".join(shipped["admin_scopes"]))}
    client = {"Authorization": f"Bearer {await idp.token(http, scope='tools deploy')}"}
    for path in OPERATOR_ROUTES:
        assert (await get(http, url, path, operator))[0] == 200, path
        assert (await get(http, url, path, client))[0] == 403, path
    # `robot` asking for the admin scope gets no token that carries it.
    form = {"grant_type": "client_credentials", "scope": "tools gateway:admin",
            "resource": idp.resource}
    async with http.post(f"{idp.issuer}/token", data=form,
                         headers={"Authorization": "Basic " + base64.b64encode(
                             b"robot:robot-secret").decode()}) as resp:
        body = await resp.json()
    if resp.status == 200:
        asked = {"Authorization": f"Bearer {body['access_token']}"}
        assert (await get(http, url, "/status", asked))[0] == 403
    else:
        assert body["error"] == "invalid_scope", body


@pytest.fixture
async def looping_upstream(aiohttp_server) -> str:
    """A real HTTP server that redirects every request to itself: aiohttp gives up, and its
    error quotes the URL it was given, credentials and all."""

    async def again(request: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect(str(request.rel_url))

    app = web.Application()
    app.router.add_route("*", "/mcp", again)
    server = await aiohttp_server(app)
    return f"http://gw:{SECRETS[0]}@127.0.0.1:{server.port}/mcp?api_key={SECRETS[1]}"


def shows_no_secret(text: str) -> bool:
    return not any(secret in text for secret in SECRETS)


async def test_an_upstream_url_is_shown_without_its_credentials(gateway, http,
                                                                looping_upstream) -> None:
    with structlog.testing.capture_logs() as events:
        url = await gateway(url=looping_upstream, wait_ready=False,
                            upstream={"restart_backoff_max_ms": 100})
        reply = await asyncio.wait_for(McpHttp(http, url).send({
            "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {}}}), 5)
        await asyncio.sleep(0.3)
        status, body = await get(http, url, "/readyz")
        assert status == 503 and json.loads(body) == {"ready": False}
        status, body = await get(http, url, "/readyz?detail")
        shown = json.loads(body)["upstreams"]["main"]["url"]
        assert shown == f"http://127.0.0.1:{URL(looping_upstream).port}/mcp"
        _, page = await get(http, url, "/status")
    error = reply.body["error"]["message"]
    # It names the upstream, not where it is (nor, then, the URL's secrets).
    assert "upstream 'main'" in error and "127.0.0.1" not in error, error
    assert shows_no_secret(error)
    assert shows_no_secret(page)
    started = [e for e in events if e["event"] == "upstream.start_failed"]
    assert started and started[0]["url"] == shown
    assert all(shows_no_secret(repr(e)) for e in events), events


async def test_an_upstream_url_with_credentials_still_gets_them(gateway, client, http) -> None:
    """Shown without them, the URL is still used with them: the server gets its query."""
    from test_http_upstream import basic_http, text_of

    async with basic_http() as base:
        url = await gateway(url=f"{base.replace('//', f'//gw:{SECRETS[0]}@')}/mcp"
                                f"?api_key={SECRETS[1]}")
        mcp = client(url)
        await mcp.initialize()
        assert text_of(await mcp.call("echo", {"text": "through"})) == "through"
        _, body = await get(http, url, "/readyz?detail")
        assert json.loads(body)["upstreams"]["main"]["url"] == base + "/mcp"


async def test_a_foreign_host_is_refused_on_every_route(gateway, http) -> None:
    """DNS rebinding: a page on evil.example resolved to 127.0.0.1 reaches the gateway with
    its own name in Host (and, same-origin, no Origin on a GET)."""
    url = await gateway(tasks=POLICY, auth={**CLIENTS, "admin_tokens": [OPERATOR_TOKEN]})
    port = url.split(":")[2].split("/")[0]
    evil = {"Host": "evil.example"}
    for path in ("/status", "/metrics", "/readyz?detail"):
        status, body = await get(http, url, path, evil)
        assert status == 421 and "evil.example" in json.loads(body)["error"]["message"]
    refused = await call(http, url, "echo", {"text": "x"}, headers={**ALICE, **evil})
    assert refused.status == 421
    for host in (f"evil.example:{port}", f"localhost.evil.example:{port}"):
        assert (await call(http, url, "echo", {"text": "x"},
                           headers={**ALICE, "Host": host})).status == 421
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", "localhost", f"[::1]:{port}"):
        served = await call(http, url, "echo", {"text": "x"}, headers={**ALICE, "Host": host})
        assert served.status == 200, host
        status, _ = await get(http, url, "/status", {**ADMIN, "Host": host})
        assert status == 200, host
    status, _ = await get(http, url, "/healthz", evil)  # probes send the Host they like
    assert status == 200
    status, body = await raw_request(url, "/status", b"\xff\xfe.example")  # not even text
    assert status == 421 and "does not serve the host (" in json.loads(body)["error"]["message"]
    samples = await scrape(http, url, ADMIN)
    assert value(samples, "mcp_gateway_rejections_total", reason="host", cause="") == 7


async def test_an_absolute_form_target_is_checked_by_its_own_name(gateway) -> None:
    """RFC 9112, 3.2.2: for `GET http://name/path` an origin server MUST ignore Host and use
    the target's name. A foreign name there is refused as in Host, whatever Host says (it
    was served when Host named the gateway); the gateway's own name there is served."""
    url = await gateway(tasks=POLICY)
    port = URL(url).port
    mine = f"127.0.0.1:{port}".encode()
    for method, path in (("GET", "/status"), ("POST", "/mcp")):
        status, body = await raw_request(url, "http://evil.example" + path, mine, method)
        assert status == 421 and "evil.example" in json.loads(body)["error"]["message"]
    status, _ = await raw_request(url, f"http://127.0.0.1:{port}/status", b"evil.example")
    assert status == 200


async def raw_request(url: str, path: str, host: bytes, method: str = "GET") -> tuple[int, bytes]:
    """A request without a body whose Host may be any bytes (no HTTP client sends bytes that
    are not text), its target any form."""
    target = URL(url)
    reader, writer = await asyncio.open_connection(target.host, target.port)
    writer.write(f"{method} {path} HTTP/1.1\r\n".encode() + b"Host: " + host +
                 b"\r\nConnection: close\r\n\r\n")
    raw = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    head, _, rest = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), rest


async def test_allowed_hosts_names_the_hosts_served(gateway, http) -> None:
    url = await gateway(tasks=POLICY, security={"allowed_hosts": ["mcp.example.com:8443"]})
    mine = {"Host": "mcp.example.com:8443"}
    assert (await call(http, url, "echo", {"text": "x"}, headers=mine)).status == 200
    for host in ("mcp.example.com:9000", "127.0.0.1"):
        assert (await call(http, url, "echo", {"text": "x"},
                           headers={"Host": host})).status == 421
    anyone = await gateway(tasks=POLICY, security={"allowed_hosts": ["*"]})
    assert (await call(http, anyone, "echo", {"text": "x"},
                       headers={"Host": "evil.example"})).status == 200


async def test_a_path_or_method_no_route_takes_still_meets_the_guard(gateway, http) -> None:
    """Issue 34: the app has no middleware (the MCP POST calls the guard itself); what no
    route takes is guarded by a last route, so a stranger learns nothing of the routes."""
    url = await gateway(tasks=POLICY, auth=CLIENTS)
    base = url.removesuffix("/mcp")
    for method, target in (("GET", base + "/nowhere"), ("PUT", url), ("POST", base + "/nowhere")):
        async with http.request(method, target) as resp:
            assert resp.status == 401, (method, target)
        async with http.request(method, target, headers={"Host": "evil.example"}) as resp:
            assert resp.status == 421, (method, target)
    for path in ("/nowhere", "/{tail}"):  # the last route's own spelling names no route
        async with http.get(base + path, headers=ALICE) as resp:
            assert resp.status == 404, path
    async with http.put(url, headers=ALICE) as resp:
        assert resp.status == 405 and {"GET", "POST", "DELETE"} <= set(
            resp.headers["Allow"].split(","))


async def test_with_no_auth_at_all_a_foreign_host_still_reads_nothing(gateway, http) -> None:
    """Issue 49 (N4): no credential configured and `allowed_hosts` unset, on loopback: the
    loopback names are the Host allow-list, so a DNS-rebinding page reads no operator page
    and calls no tool."""
    url = await gateway(tasks=POLICY)
    evil = {"Host": "evil.example"}
    for path in ("/status", "/metrics", "/readyz?detail"):
        status, _ = await get(http, url, path, evil)
        assert status == 421, path
    assert (await call(http, url, "echo", {"text": "x"}, headers=evil)).status == 421
    status, _ = await get(http, url, "/status", {})
    assert status == 200  # the machine's own user, on loopback
