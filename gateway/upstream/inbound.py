"""What a server sends, from bytes to whoever it is for.

Checked once, at the boundary: a line that is not a well-formed JSON-RPC message, or whose
fields the gateway routes on have the wrong types, is logged with the upstream's name and
the reason and dropped alone, so nothing further on meets a type it does not expect (spec:
MCP params are objects; ids, progress tokens and request ids are strings or integers; a
resource URI is a string). Then a response goes to its call (unless the wire or native-task
following takes it), progress to its call, and the rest where the correlator says: its
events are carried out here.
"""

from __future__ import annotations

from typing import Protocol

from gateway.observability import log
from gateway.protocol import jsonrpc, mcp
from gateway.protocol.jsonrpc import Kind, Message
from gateway.upstream import native_tasks
from gateway.upstream.correlator import (
    Answer,
    Ask,
    Call,
    Correlator,
    Deliver,
    Event,
    Host,
    Owner,
)
from gateway.upstream.wire import Wire

# Fields the gateway routes on, by notification: each must be a JSON-RPC id.
_ID_FIELDS = {mcp.PROGRESS: "progressToken", mcp.CANCELLED: "requestId"}


def check(data: bytes | bytearray | memoryview, upstream: str
          ) -> tuple[Message, Kind] | None:
    """The message and its kind, or None (logged) when it cannot be routed. An answer
    nested too deep to forward becomes an error answer for its call, which would otherwise
    wait forever."""
    try:
        msg = jsonrpc.loads(data)
    except jsonrpc.JSONDecodeError:
        msg = None
    kind = jsonrpc.classify(msg)
    if kind is None and (broken := _broken_answer(msg, upstream)) is not None:
        return broken, "response"
    flaw = "not a JSON-RPC 2.0 message" if kind is None else _flaw(msg, kind)
    if flaw is None and jsonrpc.too_deep(msg, len(data)):
        if kind == "response":
            return jsonrpc.error(msg["id"], jsonrpc.INTERNAL_ERROR, (
                f"upstream '{upstream}' answered with JSON nested deeper than "
                f"{jsonrpc.MAX_DEPTH} levels, more than the gateway forwards")), "response"
        flaw = f"nested deeper than {jsonrpc.MAX_DEPTH} levels"
    if flaw is not None or kind is None:
        log.warning("upstream.bad_message", upstream=upstream, size=len(data), why=flaw)
        return None
    return msg, kind


def _broken_answer(msg: object, upstream: str) -> Message | None:
    """An error answer for the call a malformed response names by its id (JSON, no method,
    a valid id: both result and error, neither, or no "jsonrpc": "2.0"), so that call ends
    now with a clear error instead of waiting for an answer that already came (logged)."""
    if not isinstance(msg, dict) or "method" in msg or not jsonrpc.valid_id(msg.get("id")):
        return None
    log.warning("upstream.bad_message", upstream=upstream, why="a malformed response",
                id=msg["id"])
    return jsonrpc.error(msg["id"], jsonrpc.INTERNAL_ERROR, (
        f"upstream '{upstream}' answered with a malformed JSON-RPC response (it needs "
        '"jsonrpc": "2.0" and exactly one of result and error)'),
        {"upstream": upstream, "reason": "bad_message"})


def _flaw(msg: Message, kind: Kind) -> str | None:
    """What makes a well-formed JSON-RPC message one the gateway cannot route, if anything."""
    if kind == "response":
        return None
    params = msg.get("params")
    if params is not None and not isinstance(params, dict):
        return "params is not an object"
    if kind == "request":
        return None
    method, given = msg["method"], params or {}
    field = _ID_FIELDS.get(method)
    if field is not None and not jsonrpc.valid_id(given.get(field)):
        return f"{field} is not a string or an integer"
    if method == mcp.RESOURCE_UPDATED and not isinstance(given.get("uri"), str):
        return "uri is not a string"
    return None


class Receiver(native_tasks.Sender, Host, Protocol):
    """What taking in a server's messages needs of its connection."""

    correlator: Correlator
    wire: Wire

    def quietly(self, msg: Message) -> None: ...

    def list_tools(self) -> None: ...


def receive(conn: Receiver, data: bytes | bytearray | memoryview, via: Call | None = None
            ) -> bool:
    """One message from the transport (`via`: the call on whose own stream it came); False
    when it could not be read (logged and dropped alone)."""
    checked = check(data, conn.name)
    if isinstance(data, bytearray):  # the transport's buffer, handed over (Link.on_message)
        data.clear()  # parsed: not held while the message goes on
    if checked is None:
        return False
    try:
        _dispatch(conn, *checked, via)
    except Exception as exc:  # a bug must not take the rest of the read with it
        log.error("upstream.message_failed", upstream=conn.name, error=repr(exc))
    return True


def _dispatch(conn: Receiver, msg: Message, kind: Kind, via: Call | None) -> None:
    if kind == "request":
        act(conn, conn.correlator.server_request(msg, via))
    elif kind == "notification":
        _notification(conn, msg, via)
    else:
        _response(conn, msg)


def _response(conn: Receiver, msg: Message) -> None:
    call = conn.correlator.response(msg)
    if call is None or conn.wire.answered(call, msg):
        return
    if native_tasks.follow(conn, call, msg):
        return
    msg["id"] = call.client_id
    call.answer(msg)


def _notification(conn: Receiver, msg: Message, via: Call | None) -> None:
    method, params = msg["method"], msg.get("params")
    if isinstance(params, dict):
        if method == mcp.PROGRESS:
            if (call := conn.correlator.progress(params)) is not None:
                call.sink.on_message(msg)
            return
        if conn.wire.swallowed(params, method):
            return
    if method == mcp.TOOLS_CHANGED:
        conn.list_tools()
    act(conn, conn.correlator.notification(msg, via))


def act(conn: Receiver, events: list[Event]) -> None:
    """Carry out what the correlator says happened."""
    for event in events:
        if isinstance(event, Deliver):
            _deliver(event.to, event.msg)
        elif isinstance(event, Ask):
            event.owner.expect_reply(event.msg["id"], conn)
            _deliver(event.to, event.msg)
        elif isinstance(event, Answer):
            conn.quietly(event.msg)
        else:
            event.call.sink.on_refused(event.capability)


def _deliver(to: Call | Owner, msg: Message) -> None:
    if isinstance(to, Call):
        to.sink.on_message(msg)
    else:
        to.deliver(msg)
