"""One upstream connection: a transport, the correlator of its calls, the wire it speaks,
and its handshake (handshake.py); its peers, the audience (audience.py: who hears the server
and what they hold of it) and the owners of the server's own tasks (task_owners.py), which
the correlator reads to route and downstream changes by their own verbs. What the server
sends is taken in by inbound.py; what goes to the server leaves here, the one place that
writes to the transport.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection
from typing import Any

from gateway.errors import AnswersOverBudget, UpstreamDown, UpstreamError, UpstreamShutdown
from gateway.observability.counters import Counters
from gateway.protocol import jsonrpc, mcp
from gateway.protocol.jsonrpc import Message, RequestId
from gateway.queues import Ticket
from gateway.upstream import inbound, native_tasks, wire
from gateway.upstream.audience import Audience
from gateway.upstream.correlator import (
    Call,
    Correlator,
    Owner,
    Sink,
)
from gateway.upstream.handshake import IGNORE, Handshake, Opening, Silent
from gateway.upstream.task_owners import TaskOwners
from gateway.upstream.transport import MakeTransport, Transport


class Connection:
    """The calls of many callers over one transport; what downstream and the engine use."""

    def __init__(self, name: str, transport: MakeTransport, startup_timeout_s: float,
                 counters: Counters, opening: Opening = "auto",
                 on_tools: Callable[[Message], object] | None = None) -> None:
        self.name = name
        self.transport: Transport = transport(self)  # made whole, with its link
        self.startup_timeout_s = startup_timeout_s
        self.counters = counters
        # Who hears the server, and who made each task it runs itself: peers the correlator
        # reads to route; downstream asks them directly (a listen stream watches, a session
        # confirms a subscription; whose a task id is). What changes them together with
        # the correlator or the wire is a verb here (attach, detach, hold, release).
        self.audience: Audience[Owner] = Audience()
        self.task_owners: TaskOwners[Owner] = TaskOwners()
        self.correlator = Correlator(self, counters, self.audience, self.task_owners)
        self.wire: wire.Wire = wire.LegacyWire()
        self.handshake = Handshake(self, startup_timeout_s, opening)
        # Told each page of the server's tools/list the gateway asks for itself (after the
        # handshake, and when the server says its list changed); None: never asked.
        self.on_tools = on_tools
        self._closed = False

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self.transport.start()

    async def close(self, why: UpstreamError | None = None) -> None:
        """Once: a session's own process is closed at the session's end and again with
        its upstream at shutdown. Its calls still in flight fail with `why` (by default:
        the gateway is shutting down)."""
        if self._closed:
            return
        self._closed = True
        await self.transport.close()
        _fail(self.correlator.lose(),
              why or UpstreamShutdown(self.name, "the gateway is shutting down"))

    @property
    def ready(self) -> bool:
        return self.handshake.init_result is not None

    @property
    def init_result(self) -> dict[str, Any] | None:
        """What the server said of itself at its handshake (None until it is ready)."""
        return self.handshake.init_result

    @property
    def modern(self) -> bool:
        """Whether the server speaks only the modern revision."""
        return self.wire.era == "modern"

    @property
    def logs(self) -> bool:
        """Whether the server declared the logging capability (logging/setLevel)."""
        caps = (self.init_result or {}).get("capabilities")
        return isinstance(caps, dict) and "logging" in caps

    @property
    def in_flight(self) -> int:
        return len(self.correlator.in_flight)

    async def reachable(self) -> None:
        await self.handshake.reachable()

    async def wait_ready(self, timeout_s: float | None = None) -> dict[str, Any]:
        """What the server said of itself once ready (Handshake.wait_ready)."""
        if (ready := self.handshake.init_result) is not None:  # every modern request asks:
            return ready  # ready, nothing to wait for (Handshake's own test, inlined)
        return await self.handshake.wait_ready(timeout_s)

    def status(self) -> dict[str, Any]:
        return {"state": "ready" if self.ready else self.transport.state, "ready": self.ready,
                "restarts": self.transport.restarts, "in_flight": self.in_flight,
                "era": self.wire.era, **self.transport.status()}

    # -- the transport's Link ------------------------------------------------------------
    def on_message(self, data: bytes | bytearray | memoryview, via: Call | None = None
                   ) -> bool:
        return inbound.receive(self, data, via)

    async def on_up(self) -> str:
        state = await self.handshake.run()
        self.audience.restarted()  # a new process logs at its own default
        self.sync_level()
        return state

    def on_lost(self, error: UpstreamError, keep: Collection[Call] = ()) -> None:
        self.handshake.lost()
        self.counters.upstream_exits += 1  # the process exited or the session ended
        _fail(self.correlator.lose(keep), error)
        self.wire.reset()

    def on_down(self, error: UpstreamError) -> None:
        self.handshake.starts.ended(error)

    def on_failed(self, call: Call, error: UpstreamError | AnswersOverBudget) -> bool:
        """Answer a call in flight with `error`; False if it was answered already."""
        if not self.correlator.drop(call):
            return False
        call.fail(error)
        return True

    def pending(self, call: Call) -> bool:
        return self.correlator.in_flight.get(call.upstream_id) is call

    def drop(self, call: Call) -> bool:
        """Forget a call whose answer nobody waits for any more (the handshake's, one whose
        client refused its input); False if it was gone already."""
        return self.correlator.drop(call)

    def await_input(self, call: Call) -> None:
        """Keep an answered call in flight as its caller's while its client supplies the
        input the server asked for (wire.py: an input_required round)."""
        self.correlator.hold_call(call)

    # -- downstream -> upstream ------------------------------------------------------------
    def request(self, msg: Message, owner: Owner | None, sink: Sink,
                headers: dict[str, str] | None = None, follow_task: bool = False,
                ticket: Ticket | None = None) -> Call:
        """Forward request `msg`, which this consumes: its id and progress token are
        rewritten, and its params are let go once sent (they may be megabytes). `headers`
        are the client's that an HTTP upstream receives (`forward_headers`, Mcp-Param-*).
        A call whose `ticket` waits in a queue is sent when its turn comes."""
        try:
            if not self.ready and owner is not None:
                raise UpstreamDown(self.name, f"upstream '{self.name}' is not connected")
            call = self.correlator.open(msg, owner, sink, follow_task, ticket)
            headers = self.wire.stamp(msg, call, headers)
            data = jsonrpc.line(msg)
            msg.pop("params", None)
            if ticket is not None and ticket.queued:
                ticket.when_running(lambda: self._send_queued(call, data, headers))
            else:
                self._send(call, data, headers)
        except BaseException:
            if ticket is not None:  # never sent: its place goes
                ticket.release()
            raise
        return call

    def _send_queued(self, call: Call, data: bytes, headers: dict[str, str] | None) -> None:
        try:
            self._send(call, data, headers)
        except UpstreamError as exc:  # the server went away while the call waited
            call.fail(exc)

    def _send(self, call: Call, data: bytes, headers: dict[str, str] | None) -> None:
        """A call's request: in flight from now, unless the transport refuses it."""
        self.correlator.sent(call)
        try:
            self.transport.write(data, call, headers)
        except Exception:
            self.correlator.drop(call)
            raise

    def resend(self, call: Call, method: str, params: dict[str, Any]) -> None:
        """Continue `call` with a new request under a new id: a modern upstream's next MRTR
        round, or the tasks/result of the upstream's own task."""
        msg = jsonrpc.request(self.correlator.renumber(call, method, params), method, params)
        try:
            self._send(call, jsonrpc.line(msg), self.wire.stamp(msg, call, None))
        except UpstreamError as exc:
            call.fail(exc)

    def cancel(self, call: Call, reason: str) -> None:
        """spec (cancellation): tell the upstream; a late response is then dropped here.
        A call still waiting in a queue leaves it and never reaches the server."""
        if call.ticket is not None:
            call.ticket.release()
        self.wire.forget(call)
        if self.pending(call) and self._task_still_its(call):
            native_tasks.cancel(self, call)
        call.end_trace("cancelled")  # not the reason: the client's own words
        if self.correlator.drop(call) and not (self.wire.cancels_by_closing
                                          and self.transport.abort(call)):
            self.notify(jsonrpc.notification(
                mcp.CANCELLED, {"requestId": call.upstream_id, "reason": reason}))

    def _task_still_its(self, call: Call) -> bool:
        """Whether the server's task `call` follows, if any, is still the one it made: a
        session lost since (HTTP: the call waits for its 404) takes the server's task ids
        with it, and the next session may give that id to another's task."""
        task_id = call.upstream_task
        record = self.correlator.tasks.record(task_id) if task_id is not None else None
        return task_id is None or (record is not None and record.owner is call.owner)

    def notify(self, msg: Message) -> None:
        if self.ready:
            self.quietly(msg)

    def quietly(self, msg: Message) -> None:
        """Best effort: for messages whose loss only matters while the upstream is up."""
        with contextlib.suppress(UpstreamError):
            self.transport.write(jsonrpc.line(msg), None, None)

    def reply(self, asked_id: RequestId, msg: Message, owner: Owner | None) -> bool:
        """`owner`'s answer to a server-to-client request, back under the original id;
        False when nothing asked `owner` that."""
        if self.wire.reply(asked_id, msg, owner):
            return True
        answer = self.correlator.reply(asked_id, msg, owner)
        if answer is not None:
            self.quietly(answer.msg)
        return answer is not None

    # -- who hears the server: the audience, with the correlator and the wire ---------------
    def attach(self, owner: Owner) -> None:
        """`owner` hears this upstream (a legacy session; see `detach`)."""
        self.audience.attach(owner)

    def detach(self, owner: Owner) -> None:
        """Forget `owner`, cancelling whatever it still has in flight here."""
        self.audience.detach(owner)
        inbound.act(self, self.correlator.detach(owner))
        for call in self.correlator.calls_of(owner):
            self.cancel(call, "client session ended")
        self.sync_level()

    def sync_level(self) -> None:
        """A legacy server set to the level its owners ask (Audience.next_level); a modern
        server takes each caller's level with its request."""
        if not self.modern and (level := self.audience.next_level()) is not None:
            self.send_own(mcp.SET_LEVEL, {"level": level})

    def hold(self, uri: str) -> bool:
        """One more holder of a resource subscription; True when a subscribe must reach
        the upstream (the first holder, unless the wire tells the server itself)."""
        return self.audience.hold(uri) and not self.wire.subscriptions_changed()

    def release(self, uri: str) -> bool:
        """One holder fewer; True when an unsubscribe must reach the upstream."""
        return self.audience.release(uri) and not self.wire.subscriptions_changed()

    def send_own(self, method: str, params: dict[str, Any], sink: Sink = IGNORE) -> None:
        """A request of the gateway's own whose answer no client waits for (subscriptions,
        tools/list)."""
        if self.ready:
            with contextlib.suppress(UpstreamError):
                self.request(jsonrpc.request(0, method, params), None, sink)

    def list_tools(self, cursor: str | None = None, page: int = 1) -> None:
        """Ask the server for its tools, so what the gateway learns of them (metrics labels,
        native task support, Mcp-Param headers) holds from the first call, whatever the
        clients ask; every page, up to MAX_TOOL_PAGES."""
        if self.on_tools is not None:
            self.send_own(mcp.TOOLS_LIST, {"cursor": cursor} if cursor else {},
                          _ToolPages(self, page))


def _fail(calls: list[Call], error: UpstreamError) -> None:
    for call in calls:
        call.fail(error)


MAX_TOOL_PAGES = 20  # of the gateway's own tools/list: enough for any real catalogue


class _ToolPages(Silent):
    """The answer to the gateway's own tools/list: told to the connection's `on_tools`, and
    the next page asked for."""

    def __init__(self, conn: Connection, page: int) -> None:
        self.conn, self.page = conn, page

    def on_response(self, msg: Message) -> None:
        if self.conn.on_tools is None or "result" not in msg:
            return
        self.conn.on_tools(msg)
        cursor = msg["result"].get("nextCursor")
        if isinstance(cursor, str) and cursor and self.page < MAX_TOOL_PAGES:
            self.conn.list_tools(cursor, self.page + 1)
