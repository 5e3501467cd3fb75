"""Fuzzing the gateway's HTTP and JSON-RPC surfaces (issue 11): random messages of both eras,
random ids, params, envelopes and headers, aimed at every method the gateway answers itself
(initialize, tasks/*, server/discover, subscriptions/listen, subscriptions, log levels) and
at what it forwards. Every answer must be a JSON-RPC error or result or an SSE stream, never
a 5xx, a dropped connection or a hang; the gateway serves normally afterwards."""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web
from conftest import free_port, settings_for
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.app import create_app
from gateway.settings.load import from_mapping

MODERN = "2026-07-28"
POLICY = {"defaults": {"mode": "auto", "sync_budget_ms": 50},
          "tools": {"whoami": {"mode": "always"}}}
# Methods the gateway answers itself or looks into, and some it only forwards.
METHODS = ["initialize", "ping", "tasks/get", "tasks/list", "tasks/cancel", "tasks/result",
           "tasks/update", "server/discover", "subscriptions/listen", "resources/subscribe",
           "resources/unsubscribe", "logging/setLevel", "tools/list", "tools/call",
           "resources/read", "prompts/get", "notifications/cancelled",
           "notifications/initialized", "completion/complete"]
SAFE_TOOLS = ["echo", "whoami", "params", "sleep", "nope"]  # none of them waits for input
TASK_IDS: list[str] = []  # tasks that exist (made by the fixture, one per dialect)

scalars = (st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.text(max_size=12)
           | st.floats(allow_nan=False, allow_infinity=False))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8)
ids = scalars | st.lists(st.integers(), max_size=2) | st.dictionaries(st.text(max_size=3),
                                                                       st.integers(), max_size=1)
header_text = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7e), max_size=20)


good_ids = st.integers(-2**40, 2**40) | st.text(max_size=12)
NAME_FIELD = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri",
              "tasks/get": "taskId", "tasks/update": "taskId", "tasks/cancel": "taskId"}


@st.composite
def params(draw: Any) -> dict[str, Any]:
    """Params shaped like the methods' own, with a random value in any field."""
    fields = {"taskId": values | st.just("not-a-task") | st.sampled_from(TASK_IDS or ["x"]),
              "cursor": values,
              "inputResponses": values, "requestState": values, "name": st.sampled_from(
                  SAFE_TOOLS) | values, "arguments": values, "uri": values,
              "level": st.sampled_from(["debug", "info", "loud"]) | values,
              "notifications": values, "requestId": ids, "task": values | st.just({}),
              "protocolVersion": st.sampled_from(["2025-11-25", "2025-06-18", MODERN]) | values,
              "capabilities": values}
    chosen = draw(st.lists(st.sampled_from(sorted(fields)), max_size=4, unique=True))
    out = {k: draw(fields[k]) for k in chosen}
    if out.get("name") in SAFE_TOOLS and "arguments" not in out:
        out["arguments"] = {"ms": 10} if out["name"] == "sleep" else {}
    return out


@st.composite
def coherent(draw: Any, sessions: dict[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """A request of one era whose envelope and headers agree, so it reaches the handlers;
    its params are random."""
    era = draw(st.sampled_from(["core", "plain", "modern"]))
    method = draw(st.sampled_from(METHODS))
    p = draw(params())
    msg: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": p}
    if not method.startswith("notifications/"):
        msg["id"] = draw(good_ids)
    heads = {"Content-Type": "application/json",
             "Accept": draw(st.sampled_from(["application/json, text/event-stream",
                                             "text/event-stream"]))}
    if era != "modern":
        heads["Mcp-Session-Id"] = sessions[era]
        heads["MCP-Protocol-Version"] = "2025-11-25" if era == "core" else "2025-06-18"
        return msg, heads
    p["_meta"] = {"io.modelcontextprotocol/protocolVersion": MODERN,
                  "io.modelcontextprotocol/clientCapabilities": draw(st.sampled_from(
                      [{}, {"extensions": {"io.modelcontextprotocol/tasks": {}}},
                       {"elicitation": {}}]))}
    heads.update({"MCP-Protocol-Version": MODERN, "Mcp-Method": method})
    named = p.get(NAME_FIELD.get(method, ""))
    if isinstance(named, str) and named.isascii() and named.isprintable():
        heads["Mcp-Name"] = named
    return msg, heads


@st.composite
def chaos(draw: Any, sessions: dict[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """Anything: envelopes of the wrong version, ids of any type, headers that disagree."""
    kind = draw(st.sampled_from(["request", "notification", "response"]))
    msg: dict[str, Any] = {"jsonrpc": draw(st.sampled_from(["2.0", "1.0"]))}
    if kind != "response":
        msg["method"] = draw(st.sampled_from(METHODS) | st.text(max_size=10))
        msg["params"] = draw(params() | values)
    if kind != "notification":
        msg["id"] = draw(ids)
    if kind == "response":
        msg[draw(st.sampled_from(["result", "error"]))] = draw(values)
    heads = {"Content-Type": "application/json",
             "Accept": draw(st.sampled_from(["application/json, text/event-stream",
                                             "text/event-stream", "application/json", "*/*"]))}
    session = draw(st.sampled_from(["none", "core", "plain", "garbage"]))
    if session != "none":
        heads["Mcp-Session-Id"] = draw(header_text) if session == "garbage" else \
            sessions[session]
    for name in ("MCP-Protocol-Version", "Mcp-Method", "Mcp-Name", "Last-Event-ID"):
        if draw(st.booleans()):
            heads[name] = draw(st.sampled_from(["2025-11-25", MODERN]) | header_text)
    return msg, heads


class Gateway:
    """The gateway on real loopback HTTP, in a thread of its own (hypothesis drives it from
    a plain test)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        app = create_app(from_mapping(settings_for(tasks=POLICY)))
        self.runner = web.AppRunner(app, handler_cancellation=True)
        self.loop.run_until_complete(self.runner.setup())
        self.loop.run_until_complete(web.TCPSite(self.runner, "127.0.0.1", self.port).start())
        self.ready.set()
        self.loop.run_forever()
        self.loop.close()  # its self-pipe too: left to the collector, it fails a later test

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def post(port: int, body: bytes, heads: dict[str, str]) -> tuple[int, str, bytes]:
    """One POST: its status, content type and body (an SSE stream: what came in a moment)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
    try:
        conn.request("POST", "/mcp", body=body, headers=heads)
        resp = conn.getresponse()
        ctype = resp.getheader("Content-Type", "")
        if ctype.startswith("text/event-stream"):
            assert conn.sock is not None
            conn.sock.settimeout(0.3)  # a listen stream stays open: a moment of it is enough
            try:
                data = resp.read1(65536)
            except TimeoutError:
                data = b""
            return resp.status, ctype, data
        return resp.status, ctype, resp.read()
    finally:
        conn.close()


def own_tasks(port: int, core_session: str) -> list[str]:
    """A finished task of each dialect, so requests can name tasks that exist."""
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "whoami", "arguments": {}, "task": {}}}
    heads = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
             "Mcp-Session-Id": core_session, "MCP-Protocol-Version": "2025-11-25"}
    _, _, core = post(port, json.dumps(call).encode(), heads)
    call["params"] = {"name": "whoami", "arguments": {}, "_meta": {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": {
            "extensions": {"io.modelcontextprotocol/tasks": {}}}}}
    _, _, ext = post(port, json.dumps(call).encode(), {
        "Content-Type": "application/json", "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": MODERN, "Mcp-Method": "tools/call", "Mcp-Name": "whoami"})
    return [json.loads(core)["result"]["task"]["taskId"], json.loads(ext)["result"]["taskId"]]


def session(port: int, version: str) -> str:
    body = json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": version, "capabilities": {"elicitation": {}},
        "clientInfo": {"name": "fuzz", "version": "1"}}}).encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
    try:
        conn.request("POST", "/mcp", body=body, headers={
            "Content-Type": "application/json", "Accept": "application/json, text/event-stream"})
        resp = conn.getresponse()
        resp.read()
        return str(resp.getheader("Mcp-Session-Id"))
    finally:
        conn.close()


@pytest.fixture(scope="module")
def running() -> Iterator[tuple[int, dict[str, str]]]:
    gw = Gateway()
    gw.thread.start()
    assert gw.ready.wait(30)
    for _ in range(300):  # the upstream initializes in the background
        status, _, _ = post(gw.port, b'{"jsonrpc":"2.0","id":1,"method":"server/discover",'
                            b'"params":{"_meta":{"io.modelcontextprotocol/protocolVersion":'
                            b'"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}',
                            {"Content-Type": "application/json", "Accept": "*/*",
                             "MCP-Protocol-Version": MODERN, "Mcp-Method": "server/discover"})
        if status == 200:
            break
    sessions = {"core": session(gw.port, "2025-11-25"), "plain": session(gw.port, "2025-06-18"),
                "bystander": session(gw.port, "2025-11-25")}  # takes no part in the fuzzing
    TASK_IDS.extend(own_tasks(gw.port, sessions["core"]))
    yield gw.port, sessions
    gw.stop()


@settings(max_examples=400, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                 HealthCheck.data_too_large])
@given(data=st.data())
def test_no_input_gets_a_5xx_a_drop_or_a_hang(running: Any, data: Any) -> None:
    port, sessions = running
    msg, heads = data.draw(coherent(sessions) | coherent(sessions) | chaos(sessions))
    status, ctype, body = post(port, json.dumps(msg).encode(), heads)
    assert status < 500, (status, body[:300])
    if ctype.startswith("application/json"):
        answer = json.loads(body)
        assert "error" in answer or "result" in answer
        # Error texts are for people: a missing value is said in words, never Python's None.
        if "error" in answer and isinstance(answer["error"], dict):
            assert not re.search(r"\bNone\b", str(answer["error"].get("message"))), answer


def _bystander_stream(port: int, sid: str, last_event_id: str | None) -> bytes:
    """What the bystander's GET stream gives within half a second."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    headers = {"Accept": "text/event-stream", "Mcp-Session-Id": sid,
               "MCP-Protocol-Version": "2025-11-25"}
    if last_event_id is not None:
        headers["Last-Event-ID"] = last_event_id
    try:
        conn.request("GET", "/mcp", headers=headers)
        resp = conn.getresponse()
        assert resp.status == 200
        assert conn.sock is not None
        conn.sock.settimeout(0.5)
        try:
            return resp.read1(65536)
        except TimeoutError:
            return b""
    finally:
        conn.close()


def test_nothing_reached_a_session_that_took_no_part(running: Any) -> None:
    """No request of the fuzzing (none of its tools asks the client anything or broadcasts)
    may have put a message on another session's GET stream: opened, then replayed from its
    start (the priming event names the stream), the bystander's stream holds no message."""
    port, sessions = running
    opened = _bystander_stream(port, sessions["bystander"], None)
    primed = re.match(rb"id: (\S+)-\d+\n", opened)
    assert primed is not None, opened[:500]  # spec 2025-11-25: a priming event, with an id
    replayed = _bystander_stream(port, sessions["bystander"], primed[1].decode() + "-0")
    for seen in (opened, replayed):
        assert re.search(rb"^data: *\S", seen, re.M) is None, seen[:500]


def test_the_gateway_still_serves_after_the_fuzzing(running: Any) -> None:
    port, _ = running
    fresh = session(port, "2025-06-18")
    status, _, body = post(port, json.dumps({
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "echo", "arguments": {"text": "still here"}}}).encode(), {
        "Content-Type": "application/json", "Accept": "application/json, text/event-stream",
        "Mcp-Session-Id": fresh, "MCP-Protocol-Version": "2025-06-18"})
    assert status == 200 and json.loads(body)["result"]["content"][0]["text"] == "still here"
