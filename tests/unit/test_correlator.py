"""The upstream connection's rules over a mock transport: the handshake, id rewriting, the
never-guess routing of server requests, refused capabilities, loss, and the modern wire."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.errors import UpstreamNotReady
from gateway.observability.counters import Counters
from gateway.protocol import jsonrpc, mcp
from gateway.protocol.jsonrpc import Message
from gateway.upstream.connection import Connection
from gateway.upstream.mock import MockOwner as Owner
from gateway.upstream.mock import MockSink as Sink
from gateway.upstream.mock import MockTransport


def legacy_server(msg: Message) -> list[Message]:
    """Answers initialize and `echo` calls; other calls stay in flight."""
    if msg.get("method") == mcp.INITIALIZE:
        return [jsonrpc.result(msg["id"], {"protocolVersion": "2025-11-25", "capabilities": {},
                                           "serverInfo": {"name": "mock"}})]
    if msg.get("method") == mcp.TOOLS_CALL and msg["params"]["name"] == "echo":
        return [jsonrpc.result(msg["id"], {"content": []})]
    return []


async def connect(handler: Any = legacy_server) -> tuple[Connection, MockTransport]:
    conn = Connection("mock", lambda link: MockTransport(link, handler), 1.0, Counters())
    transport = conn.transport
    conn.start()
    await conn.wait_ready()
    return conn, transport


def call(name: str, id_: Any = 1) -> Message:
    return jsonrpc.request(id_, mcp.TOOLS_CALL, {"name": name, "arguments": {}})


async def turn() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def test_handshake_and_ids_rewritten_per_call() -> None:
    conn, transport = await connect()
    assert conn.init_result is not None and transport.written[1]["method"] == mcp.INITIALIZED
    a, b = Owner("a"), Owner("b")
    sink_a, sink_b = Sink(), Sink()
    conn.request(call("echo", 7), a, sink_a)
    conn.request(call("echo", 7), b, sink_b)  # the same client id from another client
    sent = [m["id"] for m in transport.written[2:]]
    assert len(set(sent)) == 2 and 7 not in sent
    await turn()
    assert sink_a.responses[0]["id"] == 7 and sink_b.responses[0]["id"] == 7


async def test_server_requests_go_to_the_one_owner_in_flight_and_back() -> None:
    conn, transport = await connect()
    a = Owner("a", "elicitation")
    first, second = Sink(), Sink()
    conn.request(call("slow", 1), a, first)
    conn.request(call("slow", 2), a, second)
    transport.server_sends(jsonrpc.request("srv-9", "elicitation/create", {"message": "?"}))
    await turn()
    asked = first.messages[0]  # the owner's oldest call
    assert asked["method"] == "elicitation/create" and asked["id"] != "srv-9"
    assert not second.messages
    b = Owner("b", "elicitation")  # another owner answering what was asked of `a`
    assert not conn.reply(asked["id"], jsonrpc.result(asked["id"], {"action": "x"}), b)
    assert conn.reply(asked["id"], jsonrpc.result(asked["id"], {"action": "decline"}), a)
    assert transport.written[-1] == jsonrpc.result("srv-9", {"action": "decline"})


async def test_never_guesses_across_owners() -> None:
    conn, transport = await connect()
    sinks = {key: Sink() for key in "ab"}
    for key, sink in sinks.items():
        conn.request(call("slow"), Owner(key, "elicitation"), sink)
    transport.server_sends(jsonrpc.request("srv-1", "elicitation/create", {}))
    await turn()
    assert not any(s.messages for s in sinks.values())
    refusal = transport.written[-1]
    assert refusal["id"] == "srv-1" and "cannot tell which client" in refusal["error"]["message"]


async def test_a_parked_call_is_left_out_while_another_runs() -> None:
    conn, transport = await connect()
    parked_sink, running_sink = Sink(), Sink()
    parked = conn.request(call("asks"), Owner("a", "elicitation"), parked_sink)
    conn.correlator.hold_call(parked)  # waiting for its client's input between two HTTP requests
    conn.request(call("slow"), Owner("a", "elicitation"), running_sink)
    transport.server_sends(jsonrpc.request("srv-2", "elicitation/create", {}))
    await turn()
    assert running_sink.messages and not parked_sink.messages


async def test_an_undeclared_capability_is_refused_and_the_call_told() -> None:
    conn, transport = await connect()
    sink = Sink()
    conn.request(call("slow"), Owner("a"), sink)  # declares no sampling
    transport.server_sends(jsonrpc.request("srv-3", "sampling/createMessage", {}))
    await turn()
    assert transport.written[-1]["error"]["code"] == jsonrpc.METHOD_NOT_FOUND
    assert sink.refused == ["sampling"] and not sink.messages


async def test_losing_the_link_fails_every_call_in_flight() -> None:
    conn, transport = await connect()
    sinks = [Sink(), Sink()]
    for i, sink in enumerate(sinks):
        conn.request(call("slow", i), Owner("a"), sink)
    transport.lose("exited (code 3)")
    assert [s.responses[0]["error"]["data"]["reason"] for s in sinks] == ["exited"] * 2
    assert not conn.ready and conn.in_flight == 0


async def test_waiting_for_readiness_hands_back_what_the_server_said() -> None:
    """Callers answer initialize and server/discover from what `wait_ready` handed back:
    a link lost later leaves that answer whole, and a wait on a lost link is an error,
    never an empty result."""
    conn, transport = await connect()
    said = await conn.wait_ready()
    transport.lose()
    assert said["serverInfo"] == {"name": "mock"} and conn.init_result is None
    with pytest.raises(UpstreamNotReady):
        await conn.wait_ready(timeout_s=0.05)


async def test_a_cancelled_call_drops_its_late_answer() -> None:
    conn, transport = await connect()
    sink = Sink()
    c = conn.request(call("slow"), Owner("a"), sink)
    conn.cancel(c, "stop")
    assert transport.written[-1]["method"] == mcp.CANCELLED
    transport.server_sends(jsonrpc.result(c.upstream_id, {"content": []}))
    await turn()
    assert not sink.responses


async def test_a_server_that_refuses_initialize_is_driven_as_modern() -> None:
    def modern_server(msg: Message) -> list[Message]:
        if msg.get("method") == mcp.INITIALIZE:
            return [jsonrpc.error(msg["id"], jsonrpc.METHOD_NOT_FOUND, "no")]
        if msg.get("method") == mcp.DISCOVER:
            return [jsonrpc.result(msg["id"], {"supportedVersions": ["2026-07-28"],
                                               "capabilities": {}, "serverInfo": {}})]
        return []

    conn, transport = await connect(modern_server)
    assert conn.modern and conn.status()["era"] == "modern"
    conn.request(call("slow"), Owner("a", "elicitation"), Sink())
    sent, headers = transport.written[-1], transport.headers[-1]
    assert sent["params"]["_meta"][mcp.META_VERSION] == "2026-07-28"
    assert headers is not None and headers[mcp.H_METHOD] == mcp.TOOLS_CALL


async def test_a_request_on_a_calls_own_stream_goes_to_that_call() -> None:
    conn, transport = await connect()
    mine, theirs = Sink(), Sink()
    asking = conn.request(call("asks"), Owner("a", "elicitation"), mine)
    conn.request(call("slow"), Owner("b", "elicitation"), theirs)
    request = jsonrpc.dumps(jsonrpc.request("srv-4", "elicitation/create", {}))
    conn.on_message(request, via=asking)  # e.g. on the SSE stream of its HTTP POST
    assert mine.messages[0]["method"] == "elicitation/create" and not theirs.messages
    conn.on_message(request, via=None)  # the same without a stream: never guessed
    assert transport.written[-1]["error"]["message"].startswith("the gateway cannot tell")


def task_server(msg: Message) -> list[Message]:
    """legacy_server, and `make` answered with the CreateTaskResult of its own task t1."""
    if msg.get("method") == mcp.TOOLS_CALL and msg["params"]["name"] == "make":
        return [jsonrpc.result(msg["id"], {"task": {
            "taskId": "t1", "status": "working", "createdAt": "2026-01-01T00:00:00Z",
            "lastUpdatedAt": "2026-01-01T00:00:00Z", "ttl": 60000}})]
    return legacy_server(msg)


def question(task_id: str = "t1") -> bytes:
    return jsonrpc.dumps(jsonrpc.request("srv-6", "elicitation/create", {
        "message": "alice's secret?", "_meta": {
            "io.modelcontextprotocol/related-task": {"taskId": task_id}}}))


async def alices_task() -> tuple[Connection, MockTransport, Owner, Owner]:
    """A connection to task_server where Alice's call made the server's task t1; Alice's
    and Bob's sessions attached."""
    conn, transport = await connect(task_server)
    alice, bob = Owner("alice", "elicitation"), Owner("bob", "elicitation")
    conn.attach(alice)
    conn.attach(bob)
    conn.request(call("make"), alice, Sink())
    await turn()
    return conn, transport, alice, bob


async def test_a_message_naming_a_task_goes_to_its_owner_on_any_stream() -> None:
    """spec tasks (2025-11-25): a task's messages may come on any SSE stream. Alice's task's
    question, sent on Bob's call's stream, is Alice's: Bob is not asked it (he was: his
    answer would have ended her task)."""
    conn, _, alice, bob = await alices_task()
    theirs = Sink()
    bobs = conn.request(call("slow", 2), bob, theirs)
    conn.on_message(question(), via=bobs)
    log = jsonrpc.notification("notifications/message", {"level": "error", "data": "x", "_meta": {
        "io.modelcontextprotocol/related-task": {"taskId": "t1"}}})
    conn.on_message(jsonrpc.dumps(log), via=bobs)
    assert not theirs.messages
    assert [m["method"] for m in alice.delivered] == ["elicitation/create",
                                                      "notifications/message"]


async def test_a_task_whose_owner_left_is_nobody_elses_on_any_stream() -> None:
    """Alice's session that made t1 ended while t1 runs on: its question on Bob's call's
    stream reaches nobody (the server is refused), not Bob."""
    conn, transport, alice, bob = await alices_task()
    conn.detach(alice)
    theirs = Sink()
    conn.on_message(question(), via=conn.request(call("slow", 2), bob, theirs))
    assert not theirs.messages and transport.written[-1]["id"] == "srv-6"
    assert "error" in transport.written[-1]


async def test_a_tasks_message_on_its_own_principals_stream_stays_there() -> None:
    """Alice's second session, whose call waits on t1 (made by her first, idle), is asked
    t1's question on its own stream; so is a session's later call, not its older one."""
    conn, _ = await connect(task_server)
    first, second = (Owner(key, "elicitation", principal="alice") for key in ("s1", "s2"))
    conn.attach(first)
    conn.attach(second)
    conn.request(call("make"), first, Sink())
    await turn()
    older, waiting = Sink(), Sink()
    conn.request(call("slow", 2), first, older)
    conn.on_message(question(), via=conn.request(call("slow", 3), second, waiting))
    assert waiting.messages and not first.delivered and not older.messages
    later = Sink()
    conn.on_message(question(), via=conn.request(call("slow", 4), first, later))
    assert later.messages and not older.messages


async def test_the_gateway_lists_the_tools_itself_every_page_and_again_on_change() -> None:
    """Issue 21: after the handshake the connection asks tools/list itself, follows its
    cursor, and asks again when the server says its list changed."""
    pages = {None: (["a", "b"], "p2"), "p2": (["c"], None)}

    def server(msg: Message) -> list[Message]:
        if msg.get("method") == mcp.TOOLS_LIST:
            names, cursor = pages[msg["params"].get("cursor")]
            result: dict[str, Any] = {"tools": [{"name": n} for n in names]}
            if cursor:
                result["nextCursor"] = cursor
            return [jsonrpc.result(msg["id"], result)]
        return legacy_server(msg)

    conn = Connection("mock", lambda link: MockTransport(link, server), 1.0, Counters())
    transport = conn.transport
    told: list[list[str]] = []
    conn.on_tools = lambda m: told.append([t["name"] for t in m["result"]["tools"]])
    conn.start()
    await conn.wait_ready()
    await turn()
    assert told == [["a", "b"], ["c"]]
    transport.server_sends(jsonrpc.notification(mcp.TOOLS_CHANGED))
    for _ in range(3):
        await turn()
    assert told == [["a", "b"], ["c"], ["a", "b"], ["c"]]


async def test_a_stray_notification_reaches_one_principal_only() -> None:
    """What belongs to no call goes to everyone attached while they are one principal, and
    to nobody (counted) once two principals share the upstream."""
    conn, transport = await connect()
    alice1, alice2 = Owner("s1", principal="alice"), Owner("s2", principal="alice")
    conn.attach(alice1)
    conn.attach(alice2)
    stray = jsonrpc.notification(mcp.LOG_MESSAGE, {"level": "info", "data": "alice's row"})
    transport.server_sends(stray)
    await turn()
    assert [len(alice1.delivered), len(alice2.delivered)] == [1, 1]
    bob = Owner("s3", principal="bob")
    conn.attach(bob)
    transport.server_sends(stray)
    await turn()
    assert not bob.delivered and [len(alice1.delivered), len(alice2.delivered)] == [1, 1]
    assert conn.counters.shown()["upstream.unroutable_notifications"] == 1
    # Change notifications carry nothing of anyone's: everyone hears them.
    transport.server_sends(jsonrpc.notification("notifications/tools/list_changed"))
    await turn()
    assert bob.delivered and len(alice1.delivered) == 2


async def test_each_owner_hears_its_own_log_level_and_the_server_the_most_verbose() -> None:
    conn, transport = await connect(lambda msg: [
        *legacy_server(msg),
        *([jsonrpc.result(msg["id"], {})] if msg.get("method") == mcp.SET_LEVEL else [])])
    quiet, chatty = Owner("q"), Owner("c")
    quiet.level, chatty.level = "error", "debug"
    conn.attach(quiet)
    conn.sync_level()
    conn.attach(chatty)
    conn.sync_level()
    await turn()
    asked = [m["params"]["level"] for m in transport.written if m.get("method") == mcp.SET_LEVEL]
    assert asked == ["error", "debug"]
    sink = Sink()
    conn.request(call("slow"), quiet, sink)
    transport.server_sends(jsonrpc.notification(mcp.LOG_MESSAGE, {"level": "debug", "data": 1}))
    transport.server_sends(jsonrpc.notification(mcp.LOG_MESSAGE, {"level": "error", "data": 2}))
    await turn()
    assert [m["params"]["data"] for m in sink.messages] == [2]  # debug is below its level
    conn.detach(chatty)  # the most verbose leaves: the server goes back to the next one
    await turn()
    asked = [m["params"]["level"] for m in transport.written if m.get("method") == mcp.SET_LEVEL]
    assert asked == ["error", "debug", "error"]
