"""Where an upstream gets things wrong or goes away (issue 31, items 2-5): its errors reach
modern clients with the one table's HTTP status, a broken answer ends its call at once, an
HTTP server that forgets its session (400, as the TypeScript SDK says it) or goes away is
found again and shown in /readyz, and the small conformance edges."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from conftest import free_port, listening, served
from mcp_http import next_event, parse_sse, text_of
from test_http_upstream import answered_after_restart, basic_http
from test_modern import call, envelope, headers_for, modern
from test_tenancy import TOKENS, As

from gateway.settings.load import from_mapping
from gateway.upstream import sse_client


@pytest.fixture(params=["stdio", "http"])
async def url(request, gateway) -> AsyncIterator[str]:
    """The gateway in front of basic.py, over stdio or over Streamable HTTP."""
    if request.param == "stdio":
        yield await gateway()
        return
    async with basic_http() as base:
        yield await gateway(url=base + "/mcp")


# -- item 2: one table of HTTP statuses for modern error responses ---------------------------
async def test_an_upstreams_missing_capability_is_400_for_a_modern_client(url, http,
                                                                          client) -> None:
    """spec 2026-07-28 basic: -32021 "On HTTP, the response status MUST be 400"."""
    needed = {"requiredCapabilities": {"sampling": {}}}
    reply = await call(http, url, "fail", {"code": -32021, "message": "needs sampling",
                                           "data": needed})
    assert reply.status == 400
    assert reply.message["error"] == {"code": -32021, "message": "needs sampling",
                                      "data": needed}
    # The same error of a tool that failed otherwise is an answer: 200.
    other = await call(http, url, "fail", {"code": -32603, "message": "broke"})
    assert (other.status, other.message["error"]["code"]) == (200, -32603)
    # A legacy session is told by JSON-RPC alone, as ever.
    legacy = client(url)
    await legacy.initialize()
    said = await legacy.call("fail", {"code": -32021, "message": "needs sampling"})
    assert said.status == 200 and said.message["error"]["code"] == -32021


async def test_a_bridged_resource_not_found_names_its_uri(url, http) -> None:
    """A legacy -32002 becomes -32602 (400) with data.uri (spec 2026-07-28, sep-2164)."""
    reply = await modern(http, url, "resources/read", {"uri": "test://missing"})
    assert reply.status == 400
    error = reply.message["error"]
    assert (error["code"], error["data"]["uri"]) == (-32602, "test://missing")


# -- item 3: no call hangs on what the server got wrong ---------------------------------------
UNRULY = [sys.executable, str(Path(__file__).parents[1] / "servers" / "unruly_http.py")]


def unruly(mode: str = "legacy") -> contextlib.AbstractAsyncContextManager[str]:
    """tests/servers/unruly_http.py on a free port, for a block; its base URL."""
    port = free_port()
    return served([*UNRULY, str(port), mode], port)


async def test_a_broken_answer_ends_its_call_at_once(gateway, client, http) -> None:
    """An application/json answer that is no JSON-RPC message ends the POST's call with an
    error that says so (it used to wait for ever: only keep-alives came)."""
    async with unruly() as base:
        url = await gateway(url=base + "/mcp")
        legacy = client(url)
        await legacy.initialize()
        broken = (await legacy.call("garbage")).message["error"]
        assert "not a JSON-RPC message" in broken["message"]
        assert broken["data"]["upstream"] == "main"
        modern_reply = await call(http, url, "garbage")
        assert "not a JSON-RPC message" in modern_reply.message["error"]["message"]
        # Two JSON lines are read as the two messages they are; a pretty-printed answer
        # streamed without a length is one message, whole at its last line.
        assert text_of(await legacy.call("two_lines")) == "two lines"
        assert text_of(await legacy.call("pretty")) == "pretty"


async def test_a_call_on_its_post_when_the_get_stream_finds_the_session_gone_is_sent_again(
        gateway, client, http) -> None:
    """The race behind a restart test's rare failure: the GET stream learns first that the
    server forgot the session, while a call's POST still waits for the server's 404. That
    call's answer comes on its own POST (spec: Streamable HTTP), so the lost session leaves it
    to that POST, whose 404 sends it again on the new session: the client gets its answer,
    not "ended its session" (tests/servers/unruly_http.py, forgetting: the GET stream ends
    0.2 s after the sessions are forgotten, a POST's 404 comes half a second later)."""
    async with unruly("forgetting") as base:
        url = await gateway(url=base + "/mcp")
        mcp = client(url)
        await mcp.initialize()
        assert text_of(await mcp.call("pretty")) == "pretty"
        async with http.post(base + "/forget") as resp:
            assert resp.status == 204
        reply = await asyncio.wait_for(mcp.call("pretty"), 10)
        assert text_of(reply) == "pretty"  # same client session, a new upstream one
        async with http.get(url.removesuffix("/mcp") + "/readyz?detail") as resp:
            assert (await resp.json())["upstreams"]["main"]["restarts"] == 1


async def test_a_call_of_a_lost_session_is_not_answered_from_it(gateway, client,
                                                                   http) -> None:
    """A call whose POST went out before the session was lost, and is answered (not 404)
    after: the answer is the lost session's (it may name that session's tasks or requests,
    which the new session reuses), so the call fails as the session's other calls did. One
    whose POST says nothing fails DOUBT_S (2 s) after the loss, not at its request timeout
    (ten minutes), and gives back what it held. Another client's call meanwhile (Bob's
    session) is answered."""
    async with unruly("forgetting") as base:
        url = await gateway(url=base + "/mcp")
        mcp, bob = client(url), client(url)
        await mcp.initialize()
        await bob.initialize()
        for tool in ("slow", "hang"):
            assert text_of(await mcp.call("pretty")) == "pretty"  # a session is up
            pending = asyncio.create_task(mcp.call(tool))
            await until_called(http, base, tool)  # its POST is out, unanswered
            async with http.post(base + "/forget") as resp:
                assert resp.status == 204
            assert text_of(await asyncio.wait_for(bob.call("pretty"), 10)) == "pretty"
            error = (await asyncio.wait_for(pending, 10)).message["error"]
            assert error["data"]["reason"] == "session_lost", error
        assert text_of(await mcp.call("pretty")) == "pretty"  # the new session serves
        async with http.get(url.removesuffix("/mcp") + "/readyz?detail") as resp:
            assert (await resp.json())["calls"]["in_flight"] == 0


async def test_a_task_of_a_lost_session_is_not_asked_for_on_the_next(gateway, http) -> None:
    """A server's task ids are its session's (t1, t2... each): a call following the server's
    task whose tasks/result is refused with 404 (the server forgot the session just after
    making the task) fails with session_lost. It is not sent again on the new session,
    where that id names another's task (an attacker's review got Bob's result for Alice)."""
    async with unruly("forgetting") as base:
        url = await gateway(url=base + "/mcp")
        reply = await asyncio.wait_for(call(http, url, "task", {"who": "alice",
                                                                "forget": True}), 10)
        assert reply.message["error"]["data"]["reason"] == "session_lost", reply.message
        async with http.get(base + "/asked") as resp:
            asked = await resp.json()
        assert asked == []  # s-1 refused it (404), and no other session heard of t1


async def until_called(http: aiohttp.ClientSession, base: str, tool: str) -> None:
    """Until tests/servers/unruly_http.py has been called `tool` (its first call)."""
    for _ in range(200):
        async with http.get(base + "/calls") as resp:
            if tool in await resp.json():
                return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{tool} never reached the server")


async def test_a_call_ended_while_its_session_is_lost_cancels_no_task_of_the_next(
        gateway, http) -> None:
    """A call following the server's own task (its tasks/result unanswered) whose session is
    lost waits two seconds for a 404; timed out meanwhile, it does not send tasks/cancel
    for its task's id on the new session, where that id may be another's task (an
    attacker's review cancelled Bob's task so). With its session kept, it does."""
    async with unruly("forgetting") as base:
        url = await gateway(raw={"upstreams": {"main": {
            "url": base + "/mcp", "request_timeout_ms": 1000}},
            "logging": {"level": "warning"}})
        for forget in (False, True):
            heard = await held_task_timed_out(http, url, base, forget)
            assert heard == ["tasks/result"] + ([] if forget else ["tasks/cancel"]), heard


async def held_task_timed_out(http: aiohttp.ClientSession, url: str, base: str,
                              forget: bool) -> list[str]:
    """The tasks/* requests unruly_http's live sessions heard for a followed call of a task
    whose tasks/result is held, timed out after its session was lost (`forget`) or not."""
    async with http.get(base + "/asked") as resp:
        before = len(await resp.json())
    pending = asyncio.create_task(call(http, url, "task", {"who": "alice", "hold": True}))
    for _ in range(200):  # its tasks/result reached the server, and waits there
        async with http.get(base + "/asked") as resp:
            if len(await resp.json()) > before:
                break
        await asyncio.sleep(0.01)
    if forget:
        async with http.post(base + "/forget") as resp:
            assert resp.status == 204
    timed_out = await asyncio.wait_for(pending, 10)
    assert timed_out.message["error"]["data"]["reason"] == "timeout", timed_out.message
    await asyncio.sleep(0.5)  # a tasks/cancel has reached the server by now
    async with http.get(base + "/asked") as resp:
        return [a["method"] for a in (await resp.json())[before:]]


async def test_a_call_on_its_own_connection_that_loses_its_session_fails_at_once(
        gateway, client, http) -> None:
    """`isolation: call` over HTTP: a call's connection begins no second session, so a 404
    to its POST (the server forgot the session) fails the call at once with session_lost,
    where it waited startup_timeout_ms for a session that never began. The next call is
    served."""
    async with unruly("forgetting") as base:
        url = await gateway(raw={"upstreams": {"main": {
            "url": base + "/mcp", "isolation": "call", "pool_size": 1,
            "startup_timeout_ms": 30_000}}, "logging": {"level": "warning"}})
        mcp = client(url)
        await mcp.initialize()
        assert text_of(await mcp.call("pretty")) == "pretty"
        await asyncio.sleep(1)  # a warm connection again, its session current
        async with http.post(base + "/forget?get_s=5&post_s=0") as resp:
            assert resp.status == 204  # its POST hears first, its GET stream 5 s later
        error = (await asyncio.wait_for(mcp.call("pretty"), 10)).message["error"]
        assert error["data"]["reason"] == "session_lost", error
        assert text_of(await mcp.call("pretty")) == "pretty"  # on a new connection


async def test_what_comes_on_an_ended_calls_stream_reaches_nobody_else(gateway,
                                                                         http) -> None:
    """Alice's call timed out, but the server goes on on its POST's stream: a log line and
    an elicitation that name her secret. They were hers alone: Bob, then the one principal
    with a call in flight, is not sent them (he was: an attacker's review; the same held
    for a call failed with a lost session)."""
    async with unruly() as base:
        url = await gateway(raw={"upstreams": {"main": {
            "url": base + "/mcp", "request_timeout_ms": 1000}},
            "auth": {"bearer_tokens": list(TOKENS.values())}, "logging": {"level": "warning"}})
        alice, bob = As(http, url, "alice"), As(http, url, "bob")
        await alice.initialize({"elicitation": {}})
        await bob.initialize({"elicitation": {}})
        await bob.request("logging/setLevel", {"level": "debug"})
        dripping = asyncio.create_task(alice.call("drip", {"s": 1.5, "text": "ALICE-SECRET"}))
        await asyncio.sleep(1.2)  # her call timed out at 1 s; its stream goes on
        assert "did not answer" in (await dripping).message["error"]["message"]
        served = await bob.call("slow", {"s": 0.8})  # in flight when her lines come (1.5 s)
        assert text_of(served) == "slow"
        assert not [e for e in served.events if "ALICE-SECRET" in json.dumps(e)]
        # The server is answered (refused), so that its handler and the POST end.
        async with http.get(base + "/answers") as resp:
            refused = [a for a in await resp.json() if str(a["id"]).startswith("drip-")]
        assert refused and "has ended" in refused[0]["error"]["message"], refused


async def test_a_servers_task_asks_its_owner_after_the_call_that_made_it_ended(
        gateway, http) -> None:
    """A 2025-11-25 session's call that the server runs as its own task ends with the
    CreateTaskResult; the server then asks for the task's input on that POST's stream,
    naming the task (related-task _meta). The question goes to the task's owner (on her
    session's GET stream) and her answer to the task; Bob, with a call in flight meanwhile,
    hears nothing of it."""
    async with unruly("forgetting") as base:
        url = await gateway(raw={"upstreams": {"main": {"url": base + "/mcp"}},
                                 "auth": {"bearer_tokens": list(TOKENS.values())},
                                 "logging": {"level": "warning"}})
        alice, bob = As(http, url, "alice"), As(http, url, "bob")
        await alice.initialize({"elicitation": {}, "tasks": {}}, version="2025-11-25")
        await bob.initialize({"elicitation": {}}, version="2025-11-25")
        bobs = asyncio.create_task(bob.call("slow", {"s": 1}))
        async with alice.stream() as hers:
            made = await alice.request("tools/call", {"name": "asking_task", "arguments": {},
                                                      "task": {}})
            task_id = made.message["result"]["task"]["taskId"]
            asked = await next_event(hers)
            assert asked["params"]["message"] == "Name?", asked
            await alice.send({"jsonrpc": "2.0", "id": asked["id"],
                              "result": {"action": "accept", "content": {"name": "Ada"}}})
        for _ in range(100):
            done = await alice.request("tasks/result", {"taskId": task_id})
            if "result" in done.message:
                break
            await asyncio.sleep(0.05)
        assert "Ada" in text_of(done), done.message
        assert not [e for e in (await bobs).events if "Name?" in json.dumps(e)]


async def test_a_malformed_line_that_names_its_call_ends_it(gateway, client) -> None:
    """stdio: a line with the call's id that is no JSON-RPC response (both result and
    error) ends that call with a clear error; the server serves on."""
    url = await gateway()
    legacy = client(url)
    await legacy.initialize()
    error = (await legacy.call("malformed")).message["error"]
    assert "malformed JSON-RPC response" in error["message"]
    assert error["data"]["reason"] == "bad_message"
    assert text_of(await legacy.call("echo", {"text": "still here"})) == "still here"


def test_every_upstream_call_has_a_bound_by_default() -> None:
    """request_timeout_ms defaults to ten minutes (a task's default ttl): set null to lift."""
    conf = from_mapping({"upstreams": {"main": {"command": "x"}}})
    assert conf.upstreams["main"].request_timeout_ms == 600_000
    lifted = from_mapping({"upstreams": {"main": {"command": "x", "request_timeout_ms": None}}})
    assert lifted.upstreams["main"].request_timeout_ms is None


# -- item 4: an HTTP server that forgets its session (400) or goes away ------------------------
EVERYTHING = Path(__file__).parents[1] / "node" / "node_modules" / "@modelcontextprotocol" / \
    "server-everything" / "dist" / "index.js"


class Everything:
    """server-everything over Streamable HTTP (the TypeScript SDK's pattern: a stale session
    id gets 400 "Bad Request: No valid session ID provided"), on a port it keeps."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.proc: subprocess.Popen[bytes] | None = None

    async def start(self) -> None:
        self.proc = subprocess.Popen(
            ["node", str(EVERYTHING), "streamableHttp"], env={**os.environ,
                                                              "PORT": str(self.port)},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        await listening(self.port)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None


@pytest.fixture
async def everything() -> AsyncIterator[Everything]:
    server = Everything()
    await server.start()
    try:
        yield server
    finally:
        server.stop()


async def ready(http, url: str) -> bool:
    async with http.get(url.replace("/mcp", "/readyz")) as resp:
        return resp.status == 200 and (await resp.json())["ready"]


async def until(check, what: str) -> None:
    """Poll `check()` until true (what a balancer does); fail after 30 s, saying `what`."""
    for _ in range(150):
        if await check():
            return
        await asyncio.sleep(0.2)
    raise AssertionError(what)


@pytest.mark.node  # server-everything, from tests/node
async def test_a_restarted_server_that_answers_400_gets_a_new_session(gateway, client, http,
                                                                      everything) -> None:
    """Issue 31: after a restart, every call used to fail "HTTP 400" for ever. Now the 400
    that names the session as invalid begins a new one and the call goes once more."""
    url = await gateway(url=everything.url)
    mcp = client(url)
    await mcp.initialize()
    assert text_of(await mcp.call("echo", {"message": "before"})) == "Echo: before"
    for word in ("after", "again"):  # each restart alike
        everything.stop()
        await everything.start()
        reply = await asyncio.wait_for(answered_after_restart(mcp, "echo", {"message": word}),
                                       30)
        assert text_of(reply) == f"Echo: {word}"  # same client session, new upstream one


@pytest.mark.node  # server-everything, from tests/node
async def test_readiness_follows_an_http_server_that_goes_away(gateway, client, http,
                                                               everything) -> None:
    """/readyz is 503 while the server cannot be reached (it stayed 200), and 200 again once
    a new session began; calls meanwhile fail with a clear error, not a hang."""
    url = await gateway(url=everything.url)
    mcp = client(url)
    await mcp.initialize()
    everything.stop()
    failed = await asyncio.wait_for(mcp.call("echo", {"message": "x"}), 30)
    assert failed.message["error"]["data"]["upstream"] == "main"
    await until(lambda: _not(ready(http, url)), "/readyz stayed 200 with the server gone")
    await everything.start()
    await until(lambda: ready(http, url), "/readyz never came back")
    assert text_of(await mcp.call("echo", {"message": "back"})) == "Echo: back"


async def _not(check) -> bool:
    return not await check


# -- item 5: the small ones --------------------------------------------------------------------
async def gets(http, base: str) -> int:
    async with http.get(base + "/gets") as resp:
        return int((await resp.json())["gets"])


@pytest.mark.parametrize(("mode", "expected"), [("legacy", 1), ("modern", 0)])
async def test_a_refused_get_stream_is_not_asked_for_every_second(gateway, http, mode,
                                                                  expected) -> None:
    """A modern server has no GET stream (spec 2026-07-28: POST only): none is asked for.
    A legacy server that refuses it with a 400 that is not about the session is asked once,
    logged once (upstream.get_stream_refused), and left alone (it was asked each second)."""
    async with unruly(mode) as base:
        await gateway(url=base + "/mcp")
        await asyncio.sleep(2.5)  # what used to be two more GETs
        assert await gets(http, base) == expected


async def counts(http, base: str) -> tuple[int, int]:
    """unruly_http's GETs of /mcp: all of them, and those that resumed with Last-Event-ID."""
    async with http.get(base + "/gets") as resp:
        seen = await resp.json()
    return int(seen["gets"]), int(seen["resumes"])


async def test_a_server_that_ends_every_stream_is_resumed_a_bounded_number_of_times(
        gateway, client, http) -> None:
    """Issue 40: a server that primes an event id, then ends the answer's stream and every
    resume of it at once with nothing new: the call fails after STALLED_RESUMES resumes with
    Last-Event-ID, saying why (it waited for request_timeout_ms, 10 min by default). The
    session's GET stream, ended the same way, is asked for as often, then left alone."""
    async with unruly("closing") as base:
        legacy = client(await gateway(url=base + "/mcp"))
        await legacy.initialize()
        start = time.monotonic()
        error = (await asyncio.wait_for(legacy.call("closed"), 10)).message["error"]
        assert time.monotonic() - start < 5  # 5 resumes, `retry: 10` held to 100 ms
        assert "kept ending the answer's stream before the answer" in error["message"]
        assert f"{sse_client.STALLED_RESUMES} resumes with Last-Event-ID" in error["message"]
        assert error["data"] == {"upstream": "main", "reason": "connection"}
        assert (await counts(http, base))[1] == sse_client.STALLED_RESUMES
        # A stream that gave no event id cannot be resumed: its call fails at once.
        error = (await legacy.call("unprimed")).message["error"]
        assert "with no event id to resume it from" in error["message"]
        await asyncio.sleep(1)
        gets, resumes = await counts(http, base)
        assert resumes == sse_client.STALLED_RESUMES
        assert gets - resumes == sse_client.STALLED_RESUMES  # the session's GET stream


async def test_a_refused_resume_fails_its_call_saying_so(gateway, client) -> None:
    """A server whose answer's stream ended early, or dropped mid-stream after an event id,
    and that refuses the GET resuming it (a 400 that does not speak of the session): the
    call fails at once with its status (a drop was 'dropped the connection', not resumed)."""
    async with unruly() as base:
        legacy = client(await gateway(url=base + "/mcp"))
        await legacy.initialize()
        for tool in ("closed", "dropped"):
            error = (await asyncio.wait_for(legacy.call(tool), 10)).message["error"]
            assert "refused to resume the answer's stream (HTTP 400)" in error["message"]
        assert text_of(await legacy.call("two_lines")) == "two lines"  # the session serves on


async def test_a_session_lost_as_soon_as_begun_is_begun_again_with_backoff(gateway, http
                                                                           ) -> None:
    """A server whose GET stream says "no such session" to every new session: the gateway
    begins sessions again with backoff, as it restarts a process that keeps exiting (it
    re-initialized some 1,300 times a second, failing every call in flight each time)."""
    async with unruly("forgetful") as base:
        url = await gateway(url=base + "/mcp", wait_ready=False)
        await asyncio.sleep(2)
        assert await gets(http, base) <= 8  # 0.1 + 0.2 + 0.4 + 0.8 s of backoff: ~5
        async with http.get(url.replace("/mcp", "/healthz")) as resp:
            assert resp.status == 200


async def test_a_listen_answer_of_chunked_json_lines_is_heard_line_by_line(gateway, http
                                                                           ) -> None:
    """A modern server that answers subscriptions/listen as chunked application/json, a
    message a line, held open: each change reaches the gateway's listeners as it comes
    (it was awaited to the body's end, which never came)."""
    async with unruly("modern") as base:
        url = await gateway(url=base + "/mcp")
        params = {"notifications": {"toolsListChanged": True}, "_meta": envelope()}
        body = {"jsonrpc": "2.0", "id": "l-1", "method": "subscriptions/listen",
                "params": params}
        async with http.post(url, json=body, headers=headers_for("subscriptions/listen",
                                                                 params)) as stream:
            ack = await next_event(stream)
            assert ack["method"] == "notifications/subscriptions/acknowledged"
            changed = None
            for _ in range(20):  # until the gateway's own listen stream upstream is open
                assert text_of(await call(http, url, "change")) == "changed"
                with contextlib.suppress(TimeoutError):
                    changed = await next_event(stream, 0.5)
                    break
        assert changed is not None and changed["method"] == "notifications/tools/list_changed"


async def test_a_sessions_sse_streams_are_primed_with_an_id_and_retry(gateway, client, http
                                                                      ) -> None:
    """spec 2025-11-25 (SSE polling, SEP-1699 SHOULDs): a legacy session's SSE stream opens
    with an event of an id and empty data, and a `retry`; resuming after that id replays
    the stream from its start. A modern stream (not resumable) has none, nor a session of
    an older version (its client may read the empty data as a message)."""
    url = await gateway(listen={"sse_keepalive_ms": 100})
    legacy = client(url)
    await legacy.initialize(version="2025-11-25")
    body = {"jsonrpc": "2.0", "id": 9, "method": "tools/call",
            "params": {"name": "sleep", "arguments": {"ms": 400}}}
    async with http.post(url, json=body, headers=legacy.headers()) as resp:
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        raw = await resp.read()
    first = raw.split(b"\n\n")[0].decode().split("\n")
    assert first[0].startswith("id: ") and "retry: 1000" in first and "data: " in first
    assert parse_sse(raw)[0][-1]["result"]["content"][0]["text"] == "slept 400"
    async with http.get(url, headers={**legacy.headers(), "Last-Event-ID": first[0][4:],
                                      "Accept": "text/event-stream"}) as again:
        replayed = parse_sse(await again.read())[0]
    assert replayed[-1]["id"] == 9  # the answer again, from the primed id on
    reply = await call(http, url, "sleep", {"ms": 400}, headers={
        "Accept": "text/event-stream, application/json"})
    assert b"retry:" not in reply.raw and reply.message["result"]["content"][0]["text"]
    older = client(url)
    await older.initialize(version="2025-06-18")
    async with http.post(url, json=body, headers=older.headers()) as resp:
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        raw = await resp.read()
    assert b"retry:" not in raw and b"data: \n" not in raw
    assert parse_sse(raw)[0][-1]["result"]["content"][0]["text"] == "slept 400"


MODERN_SERVER = [sys.executable, str(Path(__file__).parents[1] / "servers" / "modern_server.py")]
TASKS = {"extensions": {"io.modelcontextprotocol/tasks": {}}}


@pytest.mark.parametrize("method", ["tasks/get", "tasks/update", "tasks/cancel"])
async def test_an_unknown_task_over_a_modern_upstream_is_400_invalid_params(gateway, http,
                                                                           method) -> None:
    """The tasks extension: an id the server does not know is -32602 (sep-2663), which the
    table makes 400; never 404 -32601 (a method the gateway serves)."""
    url = await gateway(MODERN_SERVER)
    params = {"taskId": "no-such-task", **({"inputResponses": {}}
                                           if method == "tasks/update" else {})}
    reply = await modern(http, url, method, params, TASKS)
    assert (reply.status, reply.message["error"]["code"]) == (400, -32602)
