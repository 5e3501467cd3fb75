"""A Streamable HTTP server as the upstream: the same SDK transcripts as direct, a modern
client with MRTR over it, two upstreams behind one gateway, and an upstream restart."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from aiohttp import web
from conftest import free_port, listening, serve_fixture, served, wait_until_ready
from mcp import Client
from mcp_http import BASIC, McpHttp, Reply, next_event, text_of
from test_modern import modern
from test_sdk_modern import on_elicit
from test_sdk_python import session_transcript
from test_tasks import wait_for
from test_tenancy import TOKENS, As


async def test_python_sdk_transcript_matches_through_an_http_upstream(gateway,
                                                                      direct_url) -> None:
    through = await session_transcript(await gateway(url=direct_url))
    assert through == await session_transcript(direct_url)
    assert through["elicit"].startswith("User response: action=accept")
    assert [p[0] for p in through["progress"]] == [0, 50, 100]


async def test_modern_client_with_mrtr_over_an_http_upstream(gateway, direct_url) -> None:
    async with Client(await gateway(url=direct_url), elicitation_callback=on_elicit) as client:
        assert client.protocol_version == "2026-07-28"
        result = await client.call_tool("test_input_required_result_elicitation", {})
        assert result.content[0].text.startswith("Hello, Ada")


async def test_two_upstreams_behind_one_gateway(gateway, direct_url, client, http) -> None:
    raw = {"upstreams": {
        "local": {"command": BASIC[0], "args": BASIC[1:]},
        "remote": {"url": direct_url, "path": "/remote/mcp"}}, "logging": {"level": "warning"}}
    local = await gateway(raw=raw)
    base = local.removesuffix("/mcp")
    async with http.get(base + "/readyz?detail") as resp:
        upstreams = (await resp.json())["upstreams"]
    assert set(upstreams) == {"local", "remote"} and upstreams["remote"]["url"] == direct_url
    one, two = client(local), client(base + "/remote/mcp")
    await one.initialize()
    await two.initialize()
    assert text_of(await one.call("echo", {"text": "stdio"})) == "stdio"
    assert text_of(await two.call("test_simple_text")) == \
        "This is a simple text response for testing."


class SdkServer:
    """The Python SDK fixture server over its own Streamable HTTP, on a port it keeps
    across restarts."""

    def __init__(self) -> None:
        self.port = free_port()
        self.proc = serve_fixture(self.port)
        self.url = f"http://127.0.0.1:{self.port}/mcp"

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)

    async def restart(self) -> None:
        """Stopped (if it runs) and started again, without the sessions it had."""
        self.stop()
        self.proc = serve_fixture(self.port)
        await listening(self.port)


@pytest.fixture
async def sdk_server() -> AsyncIterator[SdkServer]:
    server = SdkServer()
    try:
        await listening(server.port)
        yield server
    finally:
        server.stop()


async def test_upstream_restart_mid_session(gateway, client, sdk_server) -> None:
    url = await gateway(url=sdk_server.url)
    mcp = client(url)
    await mcp.initialize()
    assert text_of(await mcp.call("test_simple_text")).startswith("This is")
    sdk_server.stop()
    failed = await asyncio.wait_for(mcp.call("test_simple_text"), 10)
    assert failed.message["error"]["data"]["upstream"] == "main"  # a clear error, no hang
    await sdk_server.restart()  # the same server comes back, without the old session
    await wait_until_ready(url.removesuffix("/mcp"))
    for _ in range(50):
        reply = await mcp.call("test_simple_text")
        if "result" in reply.message:
            break
        await asyncio.sleep(0.2)
    assert text_of(reply).startswith("This is")  # same client session, new upstream one


async def test_a_restarted_upstream_is_reinitialized_and_the_call_sent_again(gateway, client,
                                                                           sdk_server) -> None:
    """Issue 11: the next call after an HTTP upstream lost its session (it restarted) gets
    its answer, not "upstream ended its session": the gateway begins a new upstream session
    and sends the request once more (a 404 means the server did not process it)."""
    mcp = client(await gateway(url=sdk_server.url))
    await mcp.initialize()
    assert text_of(await mcp.call("test_simple_text")).startswith("This is")
    for _ in range(2):  # twice: each restart is handled alike
        await sdk_server.restart()
        reply = await asyncio.wait_for(answered_after_restart(mcp), 15)
        assert text_of(reply).startswith("This is")  # same client session, new upstream one


async def answered_after_restart(mcp: McpHttp, name: str = "test_simple_text",
                                 args: dict[str, Any] | None = None) -> Reply:
    """The call's answer. A call that arrives while the gateway backs off between attempts
    to reach the restarting server (a slow host: the server listens later than its first
    attempts) is refused at once, nothing sent ("down"), and the client may call again;
    any other error fails the test."""
    while True:
        reply = await mcp.call(name, args)
        error = reply.message.get("error")
        if error is None or error.get("data", {}).get("reason") != "down":
            return reply
        await asyncio.sleep(0.2)


async def test_a_request_on_a_posts_stream_goes_to_that_posts_caller(gateway, client, http,
                                                                     sdk_server) -> None:
    """Issue 11: the server's elicitation on a POST's own SSE stream belongs to that POST's
    call, even while another client has a call in flight (routing by the stream is exact;
    without it the gateway could not tell the two apart and refused)."""
    url = await gateway(url=sdk_server.url)
    asker, bystander = client(url), client(url)
    await asker.initialize({"elicitation": {}})
    await bystander.initialize({"elicitation": {}})
    busy = asyncio.create_task(bystander.call("slow_compute", {"seconds": 2}))
    await asyncio.sleep(0.3)
    asked, final = await asker.call_answering("test_elicitation", {"message": "Name?"},
                                              {"response": "Ada"})
    assert asked["method"] == "elicitation/create"
    assert final["id"] == 7 and "Ada" in final["result"]["content"][0]["text"]
    assert text_of(await busy).startswith("computed in 2")


INITIALIZE = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {}}}


def located(where: str, events: list[dict]) -> list[dict]:
    """The log events of an upstream that name `where` (its host and port)."""
    return [e for e in events if e["event"].startswith("upstream.") and where in repr(e)]


@pytest.fixture(params=["closed port", "unknown name", "TLS to plain HTTP"])
async def unreachable(request, aiohttp_server) -> tuple[str, str, str]:
    """An upstream URL that cannot be reached: its host, its port, and the reason."""
    if request.param == "closed port":
        return "127.0.0.1", str(free_port()), "Connection refused"
    if request.param == "unknown name":  # RFC 2606: .invalid never resolves
        return "upstream-x.invalid", str(free_port()), ""  # the resolver's words vary
    plain = await aiohttp_server(web.Application())
    return "https://127.0.0.1", str(plain.port), "TLS failed (WRONG_VERSION_NUMBER)"


async def test_an_unreachable_http_upstream_is_named_not_located(gateway, client, http,
                                                                 unreachable) -> None:
    """Both eras read the upstream's name and the OS's reason, not where it is (one token
    would learn the inside of the network); the operator's log has its host and port."""
    host, port, why = unreachable
    where = f"{host.removeprefix('https://')}:{port}"
    with structlog.testing.capture_logs() as events:
        url = await gateway(url=f"{host if '//' in host else 'http://' + host}:{port}/mcp",
                            wait_ready=False)
        await asyncio.sleep(0.5)
        async with http.get(url.replace("/mcp", "/readyz?detail")) as resp:
            assert resp.status == 503
            assert (await resp.json())["upstreams"]["main"]["ready"] is False
        legacy = await asyncio.wait_for(client(url).send(INITIALIZE), 5)
        bridged = await asyncio.wait_for(modern(http, url, "tools/list"), 5)
    for reply in (legacy, bridged):
        assert reply.status == 503, reply.body
        message = reply.body["error"]["message"]
        assert message.startswith("upstream 'main' cannot be reached: ") and why in message
        shown = json.dumps(reply.body)
        assert where.split(":")[0] not in shown and port not in shown, shown
    assert located(where, events)


async def test_an_http_upstream_that_never_accepts_is_unreachable_not_silent(gateway, client,
                                                                          http) -> None:
    """A connection that never completes (a full accept queue: its SYNs are dropped) ends
    after connect_timeout_ms as an upstream that cannot be reached, in both eras; it used to
    read "sent no reply within read_timeout_ms (None)", a request that was never sent."""
    with socket.socket() as full:
        full.bind(("127.0.0.1", 0))
        full.listen(0)
        port = full.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)):  # the one place in its queue
            url = await gateway(url=f"http://127.0.0.1:{port}/mcp", wait_ready=False,
                                upstream={"connect_timeout_ms": 300})
            legacy = await asyncio.wait_for(client(url).send(INITIALIZE), 10)
            bridged = await asyncio.wait_for(modern(http, url, "tools/list"), 10)
    for reply in (legacy, bridged):
        assert reply.status == 503, reply.body
        assert reply.body["error"]["message"] == (
            "upstream 'main' cannot be reached: no connection within connect_timeout_ms (300)")
        assert str(port) not in json.dumps(reply.body)


async def test_an_http_upstream_gone_away_is_named_not_located(gateway, client, http) -> None:
    """The server stops after it was ready: the call in flight and the next ones (both eras)
    fail naming the upstream, not its host and port, which the operator's log names."""
    with structlog.testing.capture_logs() as events:
        async with basic_http() as base:
            url = await gateway(url=base + "/mcp")
            mcp = client(url)
            await mcp.initialize()
            where = base.removeprefix("http://")
        legacy = (await mcp.call("echo", {"text": "hi"})).message
        bridged = (await modern(http, url, "tools/list")).body
    for body in (legacy, bridged):
        # Refused, or not connected (its GET stream may tell first): the upstream's name.
        assert body["error"]["message"].startswith("upstream 'main' "), body
        assert where.split(":")[0] not in json.dumps(body)
        assert where.split(":")[1] not in json.dumps(body)
    assert located(where, events)


# -- basic.py over HTTP (tests/servers/basic_http.py): server messages only on the GET stream
BASIC_HTTP = [sys.executable, str(Path(__file__).parents[1] / "servers" / "basic_http.py")]


@contextlib.asynccontextmanager
async def basic_http(mode: str = "streamable") -> AsyncIterator[str]:
    port = free_port()
    async with served([*BASIC_HTTP, str(port), mode], port) as base:
        yield base


async def test_elicitation_on_the_upstream_get_stream(gateway, client, http) -> None:
    async with basic_http() as base:
        mcp = client(await gateway(url=base + "/mcp"))
        await mcp.initialize({"elicitation": {}})
        body = {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                "params": {"name": "ask", "arguments": {"message": "Name?"}}}
        async with http.post(mcp.url, json=body, headers=mcp.headers()) as stream:
            asked = await next_event(stream)  # it came on the upstream's GET stream
            assert asked["method"] == "elicitation/create"
            assert asked["params"]["message"] == "Name?"
            await mcp.send({"jsonrpc": "2.0", "id": asked["id"],
                            "result": {"action": "accept", "content": {"name": "Ada"}}})
            final = await next_event(stream)
        assert final["id"] == 7
        assert json.loads(final["result"]["content"][0]["text"])["content"] == {"name": "Ada"}


async def test_http_sse_transport_of_2024_11_05(gateway, client, http) -> None:
    async with basic_http("sse") as base:
        url = await gateway(url=base + "/mcp")
        async with http.get(url.replace("/mcp", "/readyz?detail")) as resp:
            assert (await resp.json())["upstreams"]["main"]["transport"] == "http+sse"
        mcp = client(url)
        await mcp.initialize()
        assert text_of(await mcp.call("echo", {"text": "over the old transport"})) == \
            "over the old transport"
        prompt = await mcp.send({"jsonrpc": "2.0", "id": 9, "method": "prompts/get",
                                 "params": {"name": "greet", "arguments": {"who": "SSE"}}})
        assert prompt.message["result"]["messages"][0]["content"]["text"] == "Hello SSE"


async def test_headers_static_forwarded_and_never_the_clients_token(gateway, client, http,
                                                                     monkeypatch) -> None:
    monkeypatch.setenv("UPSTREAM_KEY", "k-123")
    async with basic_http() as base:
        url = await gateway(url=base + "/mcp", upstream={
            "headers": {"X-Api-Key": "${UPSTREAM_KEY}"}, "forward_headers": ["X-Tenant"]})
        mcp = client(url)
        await mcp.initialize()
        await mcp.call("echo", {"text": "hi"}, **{
            "Authorization": "Bearer client-secret", "X-Tenant": "acme",
            "Mcp-Param-Region": "us-west1", "X-Other": "no"})
        async with http.get(base + "/seen") as resp:
            seen = {k.lower(): v for k, v in (await resp.json()).items()}
    assert seen["x-api-key"] == "k-123" and seen["x-tenant"] == "acme"
    assert seen["mcp-param-region"] == "us-west1"
    assert "authorization" not in seen and "x-other" not in seen


async def test_read_timeout_fails_the_call_and_cancels_it(gateway, client) -> None:
    async with basic_http() as base:
        mcp = client(await gateway(url=base + "/mcp", upstream={"read_timeout_ms": 300}))
        await mcp.initialize()
        failed = (await asyncio.wait_for(mcp.call("hang"), 10)).message["error"]
        assert failed["code"] == -32603 and "read_timeout_ms" in failed["message"]
        assert failed["data"] == {"upstream": "main", "reason": "connection"}
        seen = json.loads(text_of(await mcp.call("cancelled")))
        assert len(seen) == 1  # the server was told to stop


async def test_a_dropped_connection_fails_the_call_clearly(gateway, client) -> None:
    port = free_port()
    server = subprocess.Popen([*BASIC_HTTP, str(port)])
    try:
        await listening(port)
        mcp = client(await gateway(url=f"http://127.0.0.1:{port}/mcp"))
        await mcp.initialize()
        call = asyncio.create_task(mcp.call("sleep", {"ms": 5000}))
        await asyncio.sleep(0.3)
        server.kill()  # mid-call: tools/call is not idempotent, so it is not sent again
        failed = (await asyncio.wait_for(call, 10)).message["error"]
        assert failed["data"]["upstream"] == "main" and "dropped" in failed["message"]
    finally:
        server.kill()
        server.wait(10)


async def test_tasks_and_mrtr_over_an_http_upstream(gateway, client, http) -> None:
    async with basic_http() as base:
        url = await gateway(url=base + "/mcp", tasks={"tools": {"ask": {"mode": "always"}}})
        ext = {"extensions": {"io.modelcontextprotocol/tasks": {}}, "elicitation": {}}
        task = (await modern(http, url, "tools/call", {"name": "ask", "arguments": {}},
                             ext)).body["result"]
        assert task["resultType"] == "task"
        got = await wait_for(http, url, task["taskId"], "input_required")
        (key, request), = got["inputRequests"].items()
        assert request["method"] == "elicitation/create"
        await modern(http, url, "tasks/update", {"taskId": task["taskId"], "inputResponses": {
            key: {"action": "accept", "content": {"name": "Ada"}}}}, ext)
        got = await wait_for(http, url, task["taskId"], "completed")
        assert "Ada" in got["result"]["content"][0]["text"]
        # The same server through a core task of a 2025-11-25 session.
        legacy = client(url)
        await legacy.initialize({}, version="2025-11-25")
        created = await legacy.send({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
                                     "params": {"name": "sleep", "arguments": {"ms": 50},
                                                "task": {}}})
        task_id = created.message["result"]["task"]["taskId"]
        result = await legacy.send({"jsonrpc": "2.0", "id": 6, "method": "tasks/result",
                                    "params": {"taskId": task_id}})
        assert result.message["result"]["content"][0]["text"] == "slept 50"


async def test_isolation_client_gives_each_session_its_own_upstream_session(gateway,
                                                                           client) -> None:
    async with basic_http() as base:
        url = await gateway(url=base + "/mcp", upstream={"isolation": "client"})
        one, two = client(url), client(url)
        await one.initialize()
        await two.initialize()
        # basic_http runs one server process per upstream session: the pids tell them apart.
        assert text_of(await one.call("whoami")) != text_of(await two.call("whoami"))
        assert text_of(await one.call("whoami")) == text_of(await one.call("whoami"))


async def test_an_answer_stream_closed_early_is_resumed_with_last_event_id(gateway,
                                                                          client) -> None:
    async with basic_http("polling") as base:
        mcp = client(await gateway(url=base + "/mcp"))
        await mcp.initialize()
        # Each answer comes only to a GET carrying the event id the POST's stream primed.
        assert text_of(await asyncio.wait_for(mcp.call("sleep", {"ms": 200}), 10)) == \
            "slept 200"
        assert text_of(await mcp.call("echo", {"text": "resumed"})) == "resumed"


async def test_each_principals_resumed_stream_reaches_only_their_call(gateway, direct_url,
                                                                      http) -> None:
    """Issue 40: the fixture over HTTP polls as SEP-1699 has it: `reconnect_and_log` closes
    its call's stream, then logs and answers, which only a GET with the stream's
    Last-Event-ID brings. Alice and Bob call it at once over one shared upstream session:
    each gets their own answer and log line (they come on the resumed stream, which is
    the call's), nothing of the other's."""
    url = await gateway(url=direct_url, auth={"bearer_tokens": list(TOKENS.values())})
    alice, bob = As(http, url, "alice"), As(http, url, "bob")
    for who in (alice, bob):
        await who.initialize(version="2025-11-25")
    replies = await asyncio.wait_for(asyncio.gather(
        *(c.call("reconnect_and_log", {"word": c.who}) for c in (alice, bob))), 20)
    for who, reply in zip(("alice", "bob"), replies, strict=True):
        assert text_of(reply) == f"answer for {who}"
        logs = [e["params"]["data"] for e in reply.events if e.get("method") ==
                "notifications/message"]
        assert logs == [f"log for {who}"], (who, reply.events)
    # The conformance scenario's tool (server-sse-polling), whose answer the suite does not
    # check when the gateway answers with JSON.
    assert text_of(await alice.call("test_reconnection")).startswith(
        "Reconnection test completed successfully.")
