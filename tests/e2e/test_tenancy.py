"""Two principals on shared upstreams (DESIGN.md, Tenancy; docs/security.md): whatever Bob
sends, Alice's tasks, answers, subscriptions and log level stay hers, and Bob gets what an
unknown id gets. One gateway, three upstreams on their own paths: two plain servers (/a,
/c) and one that runs tasks of its own (/native); Alice and Bob are two static tokens, or
two OAuth subjects of one issuer (node's oidc-provider, clients `robot` and `robot2`)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from conftest import free_port, wait_until_ready
from idp import Idp, Key
from mcp_http import BASIC, McpHttp, Reply, next_event

from gateway.app import create_app
from gateway.settings.load import from_mapping
from gateway.upstream import audience

SERVERS = Path(__file__).parents[1] / "servers"
MODERN_SERVER = [sys.executable, str(SERVERS / "modern_server.py")]
TOKENS = {"alice": "alice-token", "bob": "bob-token"}  # the static ones; OAuth's replace them
RELATED = "io.modelcontextprotocol/related-task"
CORE = {"elicitation": {}, "tasks": {}}
MODERN = "2026-07-28"
EXT = {"extensions": {"io.modelcontextprotocol/tasks": {}}}


class As(McpHttp):
    """A raw client that sends one principal's token with every request."""

    def __init__(self, http: aiohttp.ClientSession, url: str, who: str) -> None:
        super().__init__(http, url)
        self.who = who

    def headers(self, **extra: str) -> dict[str, str]:
        return super().headers(Authorization=f"Bearer {TOKENS[self.who]}", **extra)

    async def request(self, method: str, params: dict[str, Any]) -> Reply:
        return await self.send({"jsonrpc": "2.0", "id": next(self.ids), "method": method,
                                "params": params})

    def stream(self) -> Any:
        """The session's GET stream (a context manager)."""
        return self.http.get(self.url, headers=self.headers(Accept="text/event-stream"))


def upstream(path: str, **env: str) -> dict[str, Any]:
    return {"command": BASIC[0], "args": BASIC[1:], "path": path, "env": env}


UPSTREAMS = {"a": upstream("/a"), "c": upstream("/c"),
             "native": upstream("/native", BASIC_TASKS="1"),
             "bare": upstream("/bare", BASIC_TASKS="1", BASIC_TASK_META="0")}


@pytest.fixture(params=["static", "oauth"])
async def base(request, aiohttp_server, http, monkeypatch) -> Any:
    """The gateway's origin, its principals' tokens in TOKENS."""
    port = free_port()
    origin = f"http://127.0.0.1:{port}"
    auth: dict[str, Any] = {"bearer_tokens": ["alice-token", "bob-token"]}
    idp = None
    if request.param == "oauth":
        # One resource for every path: the gateway's origin (docs/oauth.md).
        idp = Idp(free_port(), origin, Key("k1")).start()
        auth = {"oauth": {"resource": origin, "issuers": [idp.issuer]}}
        monkeypatch.setitem(TOKENS, "alice", await idp.token(http, "robot"))
        monkeypatch.setitem(TOKENS, "bob", await idp.token(http, "robot2"))
    app = create_app(from_mapping({"upstreams": UPSTREAMS, "auth": auth,
                                   "logging": {"level": "warning"}}))
    await aiohttp_server(app, port=port)
    await wait_until_ready(origin)
    yield origin
    if idp is not None:
        idp.close()


async def session(http: aiohttp.ClientSession, url: str, who: str,
                  caps: dict[str, Any] | None = None, version: str = "2025-11-25") -> As:
    c = As(http, url, who)
    await c.initialize(CORE if caps is None else caps, version=version)
    return c


def same_but_id(mine: Reply, unknown: Reply, asked: str, other: str) -> bool:
    """Whether two answers are alike but for the task id each names and their request ids
    (what an unknown id gets)."""
    def shown(reply: Reply, task_id: str) -> str:
        body = {k: v for k, v in reply.message.items() if k != "id"}
        return json.dumps(body).replace(task_id, "?")
    return mine.status == unknown.status and shown(mine, asked) == shown(unknown, other)


async def task_status(c: As, task_id: str) -> str:
    reply = await c.request("tasks/get", {"taskId": task_id})
    return str(reply.message["result"]["status"])


# -- item 1: input answers ------------------------------------------------------------------
async def test_an_answer_resolves_only_what_was_asked_of_that_principal(base, http) -> None:
    """Before: ids of server requests restarted per upstream ("gw-1" on /a and on /c) and
    the engine found a task's input by id alone, so Bob's answer on /c completed Alice's
    task on /a with Bob's data."""
    alice = await session(http, base + "/a", "alice")
    bob = await session(http, base + "/c", "bob")
    async with alice.stream() as a_stream, bob.stream() as b_stream:
        a_task = (await alice.request("tools/call", {"name": "ask", "arguments": {},
                                                     "task": {}})).message["result"]["task"]
        b_task = (await bob.request("tools/call", {"name": "ask", "arguments": {},
                                                   "task": {}})).message["result"]["task"]
        a_asked = await _asked(a_stream)
        b_asked = await _asked(b_stream)
    assert a_asked["params"]["_meta"][RELATED]["taskId"] == a_task["taskId"]
    assert a_asked["id"] != b_asked["id"] and len(str(a_asked["id"])) > 12  # not guessable
    # Bob answering Alice's request gets what an answer to nothing gets; hers still waits.
    stolen = await bob.send({"jsonrpc": "2.0", "id": a_asked["id"],
                             "result": {"action": "accept", "content": {"name": "Bob"}}})
    nothing = await bob.send({"jsonrpc": "2.0", "id": "gw-nothing",
                              "result": {"action": "accept", "content": {"name": "Bob"}}})
    assert stolen.status == nothing.status == 400
    assert await task_status(alice, a_task["taskId"]) == "input_required"
    # Each answer goes to its own task.
    await bob.send({"jsonrpc": "2.0", "id": b_asked["id"],
                    "result": {"action": "accept", "content": {"name": "Bob"}}})
    await alice.send({"jsonrpc": "2.0", "id": a_asked["id"],
                      "result": {"action": "accept", "content": {"name": "Alice"}}})
    a_result = await alice.request("tasks/result", {"taskId": a_task["taskId"]})
    b_result = await bob.request("tasks/result", {"taskId": b_task["taskId"]})
    assert '"Alice"' in a_result.message["result"]["content"][0]["text"]
    assert '"Bob"' in b_result.message["result"]["content"][0]["text"]


async def _asked(stream: aiohttp.ClientResponse) -> dict[str, Any]:
    """The first server request on a GET stream (status notifications come first)."""
    for _ in range(5):
        event = await next_event(stream)
        if "id" in event and "method" in event:
            return event
    raise AssertionError("no server request reached the stream")


# -- item 2: the upstream's own tasks ---------------------------------------------------------
async def test_the_upstreams_own_tasks_are_their_creators_alone(base, http) -> None:
    """Before: Bob listed, read and cancelled Alice's task of the server's own."""
    url = base + "/native"
    alice = await session(http, url, "alice")
    created = (await alice.request("tools/call", {"name": "sleep", "arguments": {"ms": 300},
                                                  "task": {}})).message["result"]["task"]
    native = created["taskId"]
    assert native.startswith("native-")  # the server's own, passed through
    bob = await session(http, url, "bob")
    for method in ("tasks/get", "tasks/result", "tasks/cancel"):
        mine = await bob.request(method, {"taskId": native})
        unknown = await bob.request(method, {"taskId": "native-999"})
        assert same_but_id(mine, unknown, native, "native-999"), (method, mine.raw)
        assert "error" in mine.message
    listed = (await bob.request("tasks/list", {})).message["result"]["tasks"]
    assert native not in [t["taskId"] for t in listed]
    # A session that never negotiated tasks has none to ask about (the server would serve
    # every client's, as it sees one client, the gateway).
    old = await session(http, url, "bob", {}, version="2025-06-18")
    for method in ("tasks/get", "tasks/result", "tasks/cancel", "tasks/list"):
        refused = (await old.request(method, {"taskId": native})).message
        assert refused["error"]["code"] == -32601, (method, refused)
    # Alice's task ran to its end, untouched.
    result = (await alice.request("tasks/result", {"taskId": native})).message["result"]
    assert result["content"][0]["text"] == "slept 300"


async def test_a_modern_upstreams_own_tasks_are_their_creators_alone(gateway, http) -> None:
    url = await gateway(MODERN_SERVER, tasks={"tools": {"queued": {"mode": "never"}}},
                        auth={"bearer_tokens": list(TOKENS.values())})
    created = await _modern(http, url, "alice", "tools/call", {"name": "queued",
                                                                "arguments": {}})
    task_id = created.body["result"]["taskId"]
    assert created.body["result"]["resultType"] == "task"
    for method in ("tasks/get", "tasks/cancel", "tasks/update"):
        mine = await _modern(http, url, "bob", method, {"taskId": task_id,
                                                        "inputResponses": {}})
        unknown = await _modern(http, url, "bob", method, {"taskId": "server-task-9",
                                                           "inputResponses": {}})
        assert same_but_id(mine, unknown, task_id, "server-task-9"), (method, mine.raw)
    got = await _modern(http, url, "alice", "tasks/get", {"taskId": task_id})
    assert got.body["result"]["result"]["content"][0]["text"] == "done by the server's own task"


async def _modern(http: aiohttp.ClientSession, url: str, who: str, method: str,
                  params: dict[str, Any]) -> Reply:
    meta = {"io.modelcontextprotocol/protocolVersion": MODERN,
            "io.modelcontextprotocol/clientCapabilities": EXT}
    name = params.get("name", params.get("taskId"))
    headers = {"Content-Type": "application/json", "Accept": "application/json",
               "MCP-Protocol-Version": MODERN, "Mcp-Method": method,
               "Authorization": f"Bearer {TOKENS[who]}", **({"Mcp-Name": name} if name else {})}
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {**params, "_meta": meta}}
    async with http.post(url, json=body, headers=headers) as resp:
        return Reply(resp.status, resp.headers, await resp.json())


# -- item 3: side channels ------------------------------------------------------------------
async def test_a_message_of_no_call_goes_to_no_other_principal(base, http) -> None:
    """Before: a late log line about Alice's work reached Bob's GET stream."""
    alice = await session(http, base + "/a", "alice", {})
    bob = await session(http, base + "/a", "bob", {})
    async with bob.stream() as b_stream, alice.stream() as a_stream:
        answered = await alice.call("late", {"text": "alice's secret row"})
        assert answered.message["result"]["content"][0]["text"] == "answered"
        # The server then logs (no call in flight: nobody's to say whose) and says its
        # tools changed (everyone's): each stream's next event is the change.
        for stream in (b_stream, a_stream):
            event = await next_event(stream)
            assert event["method"] == "notifications/tools/list_changed", event


async def test_an_unsubscribe_ends_only_the_callers_own_subscription(base, http) -> None:
    """Before: Bob's unsubscribe of a resource only Alice held ended it upstream."""
    alice = await session(http, base + "/c", "alice", {})
    bob = await session(http, base + "/c", "bob", {})
    assert (await alice.request("resources/subscribe", {"uri": "test://a"})).status == 200
    gone = await bob.request("resources/unsubscribe", {"uri": "test://a"})
    assert gone.status == 200 and gone.message["result"] == {}
    held = await alice.call("subscribed")
    assert held.message["result"]["content"][0]["text"] == '["test://a"]'
    async with alice.stream() as stream:
        await bob.call("touch", {"uri": "test://a"})
        assert (await next_event(stream))["params"]["uri"] == "test://a"


@pytest.fixture
def no_late_lines(monkeypatch) -> None:
    """Calls of two principals in a row: the lines of the second are not taken for late
    lines of the first (what the tests below look at is the level)."""
    monkeypatch.setattr(audience, "RECENT_S", 0.0)


@pytest.mark.usefixtures("no_late_lines")
async def test_a_log_level_is_each_sessions_own(base, http) -> None:
    """Before: logging/setLevel went to the shared server, so Bob's debug was Alice's."""
    alice = await session(http, base + "/c", "alice", {})
    bob = await session(http, base + "/c", "bob", {})
    await alice.request("logging/setLevel", {"level": "error"})
    await bob.request("logging/setLevel", {"level": "debug"})
    # Alice's call logs at info then at error: she hears the error only; Bob, both.
    quiet = await alice.send({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {
        "name": "log", "arguments": {"level": "info", "text": "chatter"}}})
    loud = await alice.send({"jsonrpc": "2.0", "id": 6, "method": "tools/call", "params": {
        "name": "log", "arguments": {"level": "error", "text": "alarm"}}})
    assert _logs(quiet) == [] and _logs(loud) == ["alarm"]
    heard = await bob.send({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
        "name": "log", "arguments": {"level": "info", "text": "chatter"}}})
    assert _logs(heard) == ["chatter"]


def _logs(reply: Reply) -> list[Any]:
    return [e["params"]["data"] for e in reply.events
            if e.get("method") == "notifications/message"]


@pytest.mark.parametrize("who", ["alice", "bob"])
async def test_each_principal_reaches_every_upstream(base, http, who: str) -> None:
    """The three upstreams answer both principals (the fixture is what the tests above
    assume)."""
    for path in ("/a", "/c", "/native"):
        c = await session(http, base + path, who, {})
        reply = await c.call("echo", {"text": path})
        assert reply.status == 200 and "error" not in reply.message
    await asyncio.sleep(0)


# -- what a review with one valid token found (issue 29, after its first fixes) -------------
async def _in_flight(c: As, ms: int) -> tuple[asyncio.Task[Reply], None]:
    """A plain call of `c`'s that runs `ms`, sent in the background; once it is upstream."""
    job = asyncio.create_task(c.call("sleep", {"ms": ms}))
    await asyncio.sleep(0.2)
    return job, None


async def test_a_servers_own_task_asks_its_creator_even_while_another_calls(base, http
                                                                           ) -> None:
    """Before: the server's question for Alice's task went to Bob's call in flight, and
    Bob's answer completed her task. A server that names the task (spec: related-task
    _meta) has it reach Alice; one that does not has it refused (never guessed)."""
    url = base + "/native"
    bob = await session(http, url, "bob")
    alice = await session(http, url, "alice")
    bobs, _ = await _in_flight(bob, 1500)
    async with alice.stream() as stream:
        created = await alice.request("tools/call", {"name": "ask", "arguments": {},
                                                     "task": {}})
        native = created.message["result"]["task"]["taskId"]
        asked = await _asked(stream)
        assert asked["params"]["_meta"][RELATED] == {"taskId": native}
        await alice.send({"jsonrpc": "2.0", "id": asked["id"],
                          "result": {"action": "accept", "content": {"name": "Alice"}}})
    result = await alice.request("tasks/result", {"taskId": native})
    assert '"Alice"' in result.message["result"]["content"][0]["text"]
    assert not [e for e in (await bobs).events if e.get("method") == "elicitation/create"]


async def test_an_unlabelled_request_while_anothers_task_runs_is_refused(base, http) -> None:
    url = base + "/bare"  # its own tasks do not say which task a request is for
    bob = await session(http, url, "bob")
    alice = await session(http, url, "alice")
    bobs, _ = await _in_flight(bob, 1500)
    created = await alice.request("tools/call", {"name": "ask", "arguments": {}, "task": {}})
    native = created.message["result"]["task"]["taskId"]
    result = await alice.request("tasks/result", {"taskId": native})
    refusal = result.message["result"]["content"][0]["text"]
    assert "cannot tell which client" in refusal  # the server was told; Bob never asked
    assert not [e for e in (await bobs).events if e.get("method") == "elicitation/create"]


async def test_a_late_line_reaches_no_other_principals_call(base, http) -> None:
    """Before: Alice's late log line went to Bob's call in flight. A line that names no
    call goes to the one principal with calls in flight only when no other principal's
    call was answered in the last `RECENT_S` (2 s), nor has a task of the server's own at
    work."""
    alice = await session(http, base + "/a", "alice", {})
    bob = await session(http, base + "/a", "bob", {})
    bobs, _ = await _in_flight(bob, 800)
    await alice.call("late", {"text": "alice's secret row"})
    assert "alice's secret row" not in json.dumps((await bobs).events)


async def test_a_modern_callers_late_line_reaches_no_session(base, http) -> None:
    """Before: modern callers were no part of the upstream's audience, so a late line of
    Alice's (modern) went to Bob's session, the only one attached."""
    bob = await session(http, base + "/a", "bob", {})
    async with bob.stream() as stream:
        done = await _modern(http, base + "/a", "alice", "tools/call",
                             {"name": "late", "arguments": {"text": "alice's secret row"}})
        assert done.body["result"]["content"][0]["text"] == "answered"
        event = await next_event(stream)
        assert event["method"] == "notifications/tools/list_changed", event


@pytest.mark.usefixtures("no_late_lines")
async def test_a_session_that_set_no_level_keeps_hearing_what_it_heard(base, http) -> None:
    """Before: Bob's setLevel emergency silenced Alice (who set none) on the server."""
    alice = await session(http, base + "/c", "alice", {})
    bob = await session(http, base + "/c", "bob", {})
    await bob.request("logging/setLevel", {"level": "emergency"})
    warned = await alice.call("log", {"level": "warning", "text": "disk almost full"})
    assert _logs(warned) == ["disk almost full"]
    await bob.request("logging/setLevel", {"level": "debug"})  # nor pushes debug onto her
    chatter = await alice.call("log", {"level": "debug", "text": "chatter"})
    assert _logs(chatter) == []


async def test_an_upstream_task_id_handed_out_twice_stays_its_first_creators(gateway, http
                                                                             ) -> None:
    """Before: Bob's call that got the same id from the server took Alice's task."""
    url = await gateway(MODERN_SERVER, tasks={"tools": {"queued": {"mode": "never"}}},
                        auth={"bearer_tokens": ["alice-token", "bob-token"]})
    first = await _modern(http, url, "alice", "tools/call", {"name": "queued", "arguments": {}})
    again = await _modern(http, url, "bob", "tools/call", {"name": "queued", "arguments": {}})
    task_id = first.body["result"]["taskId"]
    assert again.body["result"]["taskId"] == task_id  # this server hands out one id
    got = await _modern(http, url, "alice", "tasks/get", {"taskId": task_id})
    assert got.body["result"]["status"] == "completed"
    mine = await _modern(http, url, "bob", "tasks/get", {"taskId": task_id})
    unknown = await _modern(http, url, "bob", "tasks/get", {"taskId": "server-task-9"})
    assert same_but_id(mine, unknown, task_id, "server-task-9")


async def test_other_tasks_methods_are_no_way_around(base, http) -> None:
    """Before: tasks/update and tasks/delete passed to the server for any id."""
    url = base + "/native"
    alice = await session(http, url, "alice")
    native = (await alice.request("tools/call", {"name": "sleep", "arguments": {"ms": 300},
                                                 "task": {}})).message["result"]["task"]["taskId"]
    for version in ("2025-11-25", "2025-06-18"):
        bob = await session(http, url, "bob", {}, version=version)
        for method in ("tasks/update", "tasks/delete"):
            mine = await bob.request(method, {"taskId": native})
            unknown = await bob.request(method, {"taskId": "native-999"})
            assert same_but_id(mine, unknown, native, "native-999"), (method, mine.raw)
            assert mine.message["error"]["code"] == -32601


async def test_a_subscribe_the_server_refused_holds_nothing(base, http) -> None:
    """Before: Bob's subscribe that the server refused counted as held, so Alice's was
    answered by the gateway and the server never watched the resource for her."""
    alice = await session(http, base + "/c", "alice", {})
    bob = await session(http, base + "/c", "bob", {})
    refused = await bob.request("resources/subscribe", {"uri": "test://b", "_meta": 5})
    assert "error" in refused.message
    assert (await alice.request("resources/subscribe", {"uri": "test://b"})).status == 200
    held = await alice.call("subscribed")
    assert "test://b" in held.message["result"]["content"][0]["text"]


async def test_a_notification_sent_as_a_request_is_refused(base, http) -> None:
    """Before: it went upstream as a request, where a server dispatching on the name would
    cancel whatever request id Bob guessed."""
    bob = await session(http, base + "/a", "bob", {})
    reply = await bob.send({"jsonrpc": "2.0", "id": 9, "method": "notifications/cancelled",
                            "params": {"requestId": 1}})
    assert reply.status == 400 and reply.message["error"]["code"] == -32600


async def test_a_restarted_server_reusing_task_ids_gives_nobody_the_old_owners(base, http
                                                                               ) -> None:
    """Before (found by a second review): records of the server's own tasks outlived its
    process; the new process handed Bob the id of Alice's old task, the server's question
    for Bob's task went to Alice, and her answer to Bob."""
    url = base + "/native"
    alice = await session(http, url, "alice")
    bob = await session(http, url, "bob")
    old = (await alice.request("tools/call", {"name": "sleep", "arguments": {"ms": 30_000},
                                              "task": {}})).message["result"]["task"]["taskId"]
    async with alice.stream() as a_stream, bob.stream() as b_stream:
        await bob.call("crash")  # the server exits; the gateway starts it again
        for _ in range(100):
            created = await bob.request("tools/call", {"name": "ask", "arguments": {
                "message": "Alice, your password please"}, "task": {}})
            if "result" in created.message:
                break
            await asyncio.sleep(0.05)
        assert created.message["result"]["task"]["taskId"] == old  # the same id again
        asked = await _asked(b_stream)  # Bob's own question reaches Bob
        assert asked["params"]["_meta"][RELATED] == {"taskId": old}
        with pytest.raises(TimeoutError):  # and nothing reaches Alice
            await asyncio.wait_for(_asked(a_stream), 0.5)
    mine = await alice.request("tasks/get", {"taskId": old})
    unknown = await alice.request("tasks/get", {"taskId": "native-999"})
    assert same_but_id(mine, unknown, old, "native-999")


async def test_a_call_without_params_on_a_modern_upstream_frees_its_slot(gateway, http
                                                                         ) -> None:
    """Before: a legacy tools/call with no params to a modern-only server was an HTTP 500
    that kept its call slot for good (three of them and the principal could call no more)."""
    url = await gateway(MODERN_SERVER, auth={"bearer_tokens": ["alice-token", "bob-token"]},
                        limits={"max_calls_per_owner": 2})
    bob = As(http, url, "bob")
    await bob.initialize({}, version="2025-11-25")
    for i in range(4):
        reply = await bob.send({"jsonrpc": "2.0", "id": 100 + i, "method": "tools/call"})
        assert reply.status == 200 and "error" in reply.message, reply.raw
    echoed = await bob.call("echo", {"text": "still here"})
    assert "error" not in echoed.message, echoed.raw
