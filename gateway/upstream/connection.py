"""One upstream connection: a transport, the correlator of its calls, and the wire it speaks.

The handshake is the same over every transport (spec 2025-06-18 lifecycle): `initialize` at
the newest legacy version, declaring elicitation, sampling and roots so the server may ask;
if the server refuses it, the modern probe (spec 2026-07-28 versioning: `server/discover`),
after which a `ModernWire` speaks for the connection. Each message from the transport is
parsed once here and handed to the correlator, the wire or native-task following.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Collection, Iterator
from typing import Any

from gateway import __version__
from gateway.errors import UpstreamError, shown
from gateway.observability import log
from gateway.protocol import jsonrpc, mcp
from gateway.protocol.jsonrpc import Message
from gateway.upstream import inbound, native_tasks, wire
from gateway.upstream.correlator import Call, Correlator, Owner, Sink
from gateway.upstream.transport import Transport

CONNECTING = frozenset({"starting", "initializing", "restarting"})  # transport states


class Connection:
    """The calls of many callers over one transport; what downstream and the engine use."""

    def __init__(self, name: str, transport: Transport, startup_timeout_s: float,
                 asked_ids: Iterator[int], counters: Counter[str]) -> None:
        self.name = name
        self.transport = transport
        self.startup_timeout_s = startup_timeout_s
        self.counters = counters
        self.correlator = Correlator(self, transport.write, asked_ids, counters)
        self.wire: wire.Wire = wire.LegacyWire()
        self.init_result: dict[str, Any] | None = None
        self.starts = Starts()

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self.transport.start(self)

    async def close(self) -> None:
        await self.transport.close()
        self.correlator.fail_all(UpstreamError(self.name, "the gateway is shutting down",
                                               "shutdown"))

    @property
    def ready(self) -> bool:
        return self.init_result is not None

    @property
    def modern(self) -> bool:
        """Whether the server speaks only the modern revision."""
        return self.wire.era == "modern"

    @property
    def in_flight(self) -> int:
        return len(self.correlator.in_flight)

    async def reachable(self) -> None:
        """A call that arrives while the link (re)connects waits for it (startup_timeout_ms
        at most); one that arrives while it backs off after failures is failed at once."""
        if not self.ready and self.transport.state in CONNECTING:
            with contextlib.suppress(UpstreamError):
                await self.wait_ready()

    async def wait_ready(self, timeout_s: float | None = None) -> None:
        """Wait until initialized. UpstreamError if the start fails (saying why: a command
        not found, a URL that refuses) or takes longer than `timeout_s`; at once while the
        transport backs off after a failed start."""
        if not self.ready:
            await self.starts.settle(self.transport.state in CONNECTING,
                                     timeout_s or self.startup_timeout_s)
        if not self.ready:
            state = self.transport.state
            raise self.starts.down or UpstreamError(
                self.name, f"upstream '{self.name}' is not ready ({state})", "not_ready",
                state=state)

    def status(self) -> dict[str, Any]:
        return {"state": "ready" if self.ready else self.transport.state, "ready": self.ready,
                "restarts": self.transport.restarts, "in_flight": self.in_flight,
                "era": self.wire.era, **self.transport.status()}

    # -- the transport's Link ------------------------------------------------------------
    def on_message(self, data: bytes | memoryview, via: Call | None = None) -> None:
        checked = inbound.check(data, self.name)
        if checked is None:
            return  # malformed: logged and dropped alone
        try:
            self._dispatch(*checked, via)
        except Exception as exc:  # a bug must not take the rest of the read with it
            log.error("upstream.message_failed", upstream=self.name, error=repr(exc))

    def _dispatch(self, msg: Message, kind: jsonrpc.Kind, via: Call | None) -> None:
        if kind == "request":
            self.correlator.server_request(msg, via)
        elif kind == "notification":
            self._on_notification(msg, via)
        else:
            self._on_response(msg)

    def _on_response(self, msg: Message) -> None:
        call = self.correlator.response(msg)
        if call is None or self.wire.answered(call, msg):
            return
        if native_tasks.follow(self, call, msg):
            return
        msg["id"] = call.client_id
        call.answer(msg)

    def _on_notification(self, msg: Message, via: Call | None) -> None:
        method, params = msg["method"], msg.get("params")
        if isinstance(params, dict):
            if method == mcp.PROGRESS:
                self.correlator.progress(params, msg)
                return
            if self.wire.swallowed(params, method):
                return
        self.correlator.notification(msg, via)

    async def on_up(self) -> str:
        """initialize; if the server refuses it, the modern probe; UpstreamError when
        neither works. The protocol version settled on."""
        reply = await self._ask_initialize()
        error = reply.get("error")
        # A server that refused initialize may be a modern one; one never reached is not.
        if isinstance(error, dict) and not _unreached(error) and await self._probe_modern():
            return wire.VERSION
        return self._initialized(reply)

    def on_lost(self, error: UpstreamError, keep: Collection[Call] = ()) -> None:
        self.init_result = None
        self.starts.next()
        self.counters["upstream.exits"] += 1  # the process exited or the session ended
        self.correlator.fail_all(error, keep)
        self.wire.reset()

    def on_down(self, error: UpstreamError) -> None:
        self.starts.ended(error)

    def on_failed(self, call: Call, error: UpstreamError) -> bool:
        return self.correlator.fail(call, error)

    def pending(self, call: Call) -> bool:
        return self.correlator.in_flight.get(call.upstream_id) is call

    # -- the handshake ---------------------------------------------------------------------
    async def _ask_initialize(self) -> Message:
        self.wire.stop()
        self.wire, self.init_result = wire.LegacyWire(), None
        self.starts.next()
        return await self._ask(mcp.INITIALIZE, {
            "protocolVersion": mcp.LATEST_LEGACY,
            "capabilities": {"roots": {"listChanged": True}, "sampling": {}, "elicitation": {}},
            "clientInfo": {"name": "mcp-task-gateway", "version": __version__},
        })

    async def _ask(self, method: str, params: dict[str, Any]) -> Message:
        """The server's answer to one of the handshake's requests."""
        sink = FutureSink()
        call = self.request(jsonrpc.request(0, method, params), None, sink)
        try:
            return await asyncio.wait_for(sink.future, self.startup_timeout_s)
        except TimeoutError:
            raise UpstreamError(self.name, f"upstream '{self.name}' did not answer {method}",
                                "initialize") from None
        finally:
            self.correlator.drop(call)  # answered, or abandoned (the process exited meanwhile)

    def _initialized(self, reply: Message) -> str:
        """Accept the server's initialize reply (a version we speak) and become ready."""
        if (refusal := _refusal(self.name, reply)) is not None:
            raise refusal
        result = reply["result"]
        version = result["protocolVersion"]
        # Over HTTP, the first message that carries the negotiated version (spec 2025-06-18
        # Streamable HTTP: Protocol Version Header).
        self.transport.write(jsonrpc.dumps(jsonrpc.notification(mcp.INITIALIZED)), None,
                             {mcp.H_PROTOCOL: str(version)})
        self._become_ready(result)
        for uri in self.correlator.subscriptions:  # a restarted server knew none of them
            self.send_own(mcp.SUBSCRIBE, {"uri": uri})
        return str(version)

    async def _probe_modern(self) -> bool:
        self.wire = wire.ModernWire(self)  # the probe already carries the modern envelope
        result = (await self._ask(mcp.DISCOVER, {})).get("result")
        if not isinstance(result, dict) or wire.VERSION not in (
                result.get("supportedVersions") or ()):
            self.wire = wire.LegacyWire()
            return False
        self._become_ready(wire.ModernWire.init_result(result))
        self.wire.up()
        return True

    def _become_ready(self, result: dict[str, Any]) -> None:
        self.init_result = result
        self.starts.ended(None)
        log.info("upstream.ready", upstream=self.name, protocol=result["protocolVersion"],
                 server=(result.get("serverInfo") or {}).get("name"))

    # -- downstream -> upstream ------------------------------------------------------------
    def request(self, msg: Message, owner: Owner | None, sink: Sink,
                headers: dict[str, str] | None = None, follow_task: bool = False) -> Call:
        """Forward request `msg`, which this consumes: its id and progress token are
        rewritten, and its params are let go once sent (they may be megabytes). `headers`
        are the client's that an HTTP upstream receives (`forward_headers`, Mcp-Param-*)."""
        if not self.ready and owner is not None:
            raise UpstreamError(self.name, f"upstream '{self.name}' is not connected", "down")
        call = self.correlator.open(msg, owner, sink)
        call.follow_task = follow_task
        headers = self.wire.stamp(msg, call, headers)
        self.correlator.dispatch(call, jsonrpc.dumps(msg), headers)
        msg.pop("params", None)
        return call

    def resend(self, call: Call, method: str, params: dict[str, Any]) -> None:
        """Continue `call` with a new request under a new id: a modern upstream's next MRTR
        round, or the tasks/result of the upstream's own task."""
        msg = jsonrpc.request(self.correlator.renumber(call, params), method, params)
        try:
            self.correlator.dispatch(call, jsonrpc.dumps(msg), self.wire.stamp(msg, call, None))
        except UpstreamError as exc:
            call.answer(exc.to_message(call.client_id))

    def cancel(self, call: Call, reason: str) -> None:
        """spec (cancellation): tell the upstream; a late response is then dropped here."""
        self.wire.forget(call)
        if self.pending(call):
            native_tasks.cancel(self, call)
        call.end_trace(f"cancelled: {reason}")
        if self.correlator.drop(call) and not (self.wire.cancels_by_closing
                                          and self.transport.abort(call)):
            self.notify(jsonrpc.notification(
                mcp.CANCELLED, {"requestId": call.upstream_id, "reason": reason}))

    def notify(self, msg: Message) -> None:
        if self.ready:
            self.correlator.quietly(msg)

    def reply(self, asked_id: Any, msg: Message) -> bool:
        """A client's answer to a server-to-client request, back under the original id."""
        return self.wire.reply(asked_id, msg) or self.correlator.reply(asked_id, msg)

    def attach(self, owner: Owner) -> None:
        self.correlator.attach(owner)

    def detach(self, owner: Owner) -> None:
        """Forget `owner`, cancelling whatever it still has in flight here."""
        for call in self.correlator.detach(owner):
            self.cancel(call, "client session ended")

    def watch(self, owner: Owner) -> None:
        self.correlator.watch(owner)

    def unwatch(self, owner: Owner) -> None:
        self.correlator.unwatch(owner)

    def hold(self, uri: str) -> bool:
        """One more holder of a resource subscription; True when a subscribe must reach
        the upstream (the first holder, unless the wire tells the server itself)."""
        return self.correlator.hold(uri) and not self.wire.subscriptions_changed()

    def release(self, uri: str) -> bool:
        """One holder fewer; True when an unsubscribe must reach the upstream."""
        return self.correlator.release(uri) and not self.wire.subscriptions_changed()

    def send_own(self, method: str, params: dict[str, Any]) -> None:
        """A request of the gateway's own whose answer nobody waits for (subscriptions)."""
        if self.ready:
            with contextlib.suppress(UpstreamError):
                self.request(jsonrpc.request(0, method, params), None, IGNORE)


class Starts:
    """A connection's start attempts: why the last one failed (until one works), and a wait
    for the current one to end either way, so callers learn of a failure at once."""

    def __init__(self) -> None:
        self.down: UpstreamError | None = None
        self._settled = asyncio.Event()

    def ended(self, error: UpstreamError | None) -> None:
        self.down = error
        self._settled.set()
        if error is not None:
            self.next()

    def next(self) -> None:
        if self._settled.is_set():
            self._settled = asyncio.Event()

    async def settle(self, attempting: bool, timeout_s: float) -> None:
        """Until the current attempt ends (or `timeout_s`); at once when none is under way
        and the last one failed."""
        if self.down is not None and not attempting:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._settled.wait(), timeout_s)


class _Ignore:
    takes_mrtr = False

    def on_message(self, msg: Message) -> None:
        pass

    def on_response(self, msg: Message) -> None:
        pass

    def on_refused(self, capability: str) -> None:
        pass


IGNORE = _Ignore()  # a sink for answers nobody waits for


class FutureSink(_Ignore):
    """A sink for the gateway's own requests: the response resolves a future."""

    def __init__(self) -> None:
        self.future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()

    def on_response(self, msg: Message) -> None:
        if not self.future.done():
            self.future.set_result(msg)


def _refusal(name: str, reply: Message) -> UpstreamError | None:
    """Why an initialize reply cannot be accepted, if it cannot."""
    result, error = reply.get("result"), reply.get("error")
    if isinstance(error, dict) and _unreached(error):  # the transport says why
        return UpstreamError(name, str(error.get("message")), "unreachable")
    if isinstance(error, dict):  # the server's own error answer
        return UpstreamError(name, f"initialize failed: {error.get('message', '')}",
                             "initialize")
    version = result.get("protocolVersion") if isinstance(result, dict) else None
    if not isinstance(result, dict) or version not in mcp.LEGACY_VERSIONS:
        return UpstreamError(name, f"upstream '{name}' answered initialize with protocol "
                             f"version {shown(version)}, which the gateway does not speak",
                             "initialize")
    return None


def _unreached(error: dict[str, Any]) -> bool:
    """Whether a handshake error is the transport's own (nothing reached the server)."""
    data = error.get("data")
    return isinstance(data, dict) and data.get("reason") == "connection"
