"""The start of an upstream connection, the same over every transport, and its readiness.

spec 2025-06-18 lifecycle: `initialize` at the newest legacy version, declaring elicitation,
sampling and roots so the server may ask; if the server refuses it, the modern probe (spec
2026-07-28 versioning: `server/discover`), after which a `ModernWire` speaks for the
connection. That is the `auto` era; `legacy` never probes, and `modern` only probes (the
upstream's `era`, and the modern link to a server of both eras: isolation.py). Until one of
them works the connection is not ready: callers wait for the attempt under way
(`startup_timeout_ms` at most), or learn at once why the last one failed.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Literal, Protocol

from gateway import __version__
from gateway.errors import (
    UpstreamError,
    UpstreamInitializeFailed,
    UpstreamNotReady,
    UpstreamUnavailable,
    UpstreamUnreachable,
    shown,
)
from gateway.observability import log
from gateway.protocol import jsonrpc, mcp
from gateway.protocol.jsonrpc import Message
from gateway.upstream import wire
from gateway.upstream.transport import Transport

CONNECTING = frozenset({"starting", "initializing", "restarting"})  # transport states
# How a connection opens: an upstream's `era`, or `probe`: server/discover first, and
# initialize if the server is not modern (spec 2026-07-28 stdio, Backward Compatibility),
# for the links that serve modern clients of a server that may speak both eras.
Opening = Literal["auto", "legacy", "modern", "probe"]
PROBE_S = 5.0  # the longest wait for server/discover before falling back to initialize


class Speaker(wire.Driver, Protocol):
    """What the handshake needs of its connection."""

    name: str
    transport: Transport
    wire: wire.Wire

    def send_own(self, method: str, params: dict[str, Any]) -> None: ...

    def list_tools(self) -> None: ...


class Handshake:
    def __init__(self, conn: Speaker, startup_timeout_s: float, era: Opening = "auto") -> None:
        self.conn = conn
        self.startup_timeout_s = startup_timeout_s
        self.era = era  # which openings it tries: see the module's docstring
        self.init_result: dict[str, Any] | None = None  # what the server said of itself
        self.starts = Starts()

    @property
    def ready(self) -> bool:
        return self.init_result is not None

    async def run(self) -> str:
        """initialize; if the server refuses it, the modern probe; UpstreamError when
        neither works (or the one the era allows). The protocol version settled on."""
        if self.era == "modern":
            version = await self._modern_only()
        elif self.era == "probe" and await self._probed():
            version = wire.VERSION
        else:
            reply = await self._ask_initialize()  # UpstreamUnavailable: never reached
            # A server that refused initialize may be a modern one.
            if self.era == "auto" and isinstance(reply.get("error"), dict) and \
                    await self._modern_after_refusal():
                version = wire.VERSION
            else:
                version = self._initialized(reply)
        self.conn.list_tools()
        return version

    async def _probed(self) -> bool:
        """The probe first: True when the server speaks the modern version; False (the
        handshake goes on with initialize) on any other answer or none within PROBE_S."""
        self._reset()
        try:
            reply = await self._probe_modern(min(PROBE_S, self.startup_timeout_s))
        except UpstreamError:  # silent: a legacy server waiting for initialize
            self.conn.wire = wire.LegacyWire()
            return False
        return reply.get("result") is not None

    async def _modern_only(self) -> str:
        """The modern probe alone: a server that does not answer it at the modern version
        is refused, saying so (spec 2026-07-28 versioning: any other answer identifies a
        legacy server)."""
        self._reset()
        reply = await self._probe_modern()
        if reply.get("result") is not None:
            return wire.VERSION
        error, name = reply.get("error"), self.conn.name
        said = f": {error.get('message', '')}" if isinstance(error, dict) else ""
        raise UpstreamInitializeFailed(name, f"upstream '{name}' does not speak protocol "
                                       f"{wire.VERSION} (server/discover{said})")

    def lost(self) -> None:
        """The transport lost the server: not ready until the next handshake."""
        self.init_result = None
        self.starts.next()

    async def reachable(self) -> None:
        """A call that arrives while the link (re)connects waits for it (startup_timeout_ms
        at most); one that arrives while it backs off after failures is failed at once."""
        if not self.ready and self.conn.transport.state in CONNECTING:
            with contextlib.suppress(UpstreamError):
                await self.wait_ready()

    async def wait_ready(self, timeout_s: float | None = None) -> dict[str, Any]:
        """Wait until initialized: what the server said of itself then (its initialize
        result, or its discover result made one). Callers answer from this value, never
        from `init_result` read later: the server may be lost in between. UpstreamError if
        the start fails (saying why: a command not found, a URL that refuses) or takes
        longer than `timeout_s`; at once while the transport backs off after a failed start."""
        if not self.ready:
            await self.starts.settle(self.conn.transport.state in CONNECTING,
                                     timeout_s or self.startup_timeout_s)
        if self.init_result is None:
            state, name = self.conn.transport.state, self.conn.name
            raise self.starts.down or UpstreamNotReady(
                name, f"upstream '{name}' is not ready ({state})", state=state)
        return self.init_result

    def _reset(self) -> None:
        self.conn.wire.stop()
        self.conn.wire, self.init_result = wire.LegacyWire(), None
        self.starts.next()

    async def _ask_initialize(self) -> Message:
        self._reset()
        return await self._ask(mcp.INITIALIZE, {
            "protocolVersion": mcp.LATEST_LEGACY,
            "capabilities": {"roots": {"listChanged": True}, "sampling": {}, "elicitation": {}},
            "clientInfo": {"name": "mcp-task-gateway", "version": __version__},
        })

    async def _ask(self, method: str, params: dict[str, Any], timeout_s: float | None = None
                   ) -> Message:
        """The server's answer to one of the handshake's requests; UpstreamUnavailable when
        it reached no server (not connected: raised as it is; the transport failed it: as
        UpstreamUnreachable, in the transport's words)."""
        sink = FutureSink()
        call = self.conn.request(jsonrpc.request(0, method, params), None, sink)
        name = self.conn.name
        try:
            reply = await asyncio.wait_for(sink.future, timeout_s or self.startup_timeout_s)
            if isinstance(call.failure, UpstreamUnavailable):  # the transport says why
                raise UpstreamUnreachable(name, call.failure.message)
            return reply
        except TimeoutError:
            raise UpstreamInitializeFailed(
                name, f"upstream '{name}' did not answer {method}") from None
        finally:  # answered, or abandoned (the process exited meanwhile)
            self.conn.drop(call)

    def _initialized(self, reply: Message) -> str:
        """Accept the server's initialize reply (a version we speak) and become ready."""
        if (refusal := _refusal(self.conn.name, reply)) is not None:
            raise refusal
        result = reply["result"]
        version = result["protocolVersion"]
        # Over HTTP, the first message that carries the negotiated version (spec 2025-06-18
        # Streamable HTTP: Protocol Version Header).
        self.conn.transport.write(jsonrpc.line(jsonrpc.notification(mcp.INITIALIZED)), None,
                                  {mcp.H_PROTOCOL: str(version)})
        self._become_ready(result)
        for uri in self.conn.audience.held():  # a restarted server knew none
            self.conn.send_own(mcp.SUBSCRIBE, {"uri": uri})
        return str(version)

    async def _modern_after_refusal(self) -> bool:
        """The probe after a refused initialize: True when the server is modern; False (the
        refusal stands) on any other answer, or when the probe reached nothing."""
        try:
            return (await self._probe_modern()).get("result") is not None
        except UpstreamUnavailable:
            return False

    async def _probe_modern(self, timeout_s: float | None = None) -> Message:
        """server/discover; the reply, whose `result` is kept only when the server speaks
        the modern version (and the connection is then ready, on a `ModernWire`)."""
        modern = self.conn.wire = wire.ModernWire(self.conn)  # the probe carries the envelope
        try:
            reply = await self._ask(mcp.DISCOVER, {}, timeout_s)
        except UpstreamUnavailable:
            self.conn.wire = wire.LegacyWire()
            raise
        result = reply.get("result")
        if not isinstance(result, dict) or wire.VERSION not in (
                result.get("supportedVersions") or ()):
            self.conn.wire = wire.LegacyWire()
            return {k: v for k, v in reply.items() if k != "result"}
        self._become_ready(wire.ModernWire.init_result(result))
        modern.up()
        return reply

    def _become_ready(self, result: dict[str, Any]) -> None:
        self.init_result = result
        self.starts.ended(None)
        log.info("upstream.ready", upstream=self.conn.name, protocol=result["protocolVersion"],
                 server=(result.get("serverInfo") or {}).get("name"))


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


class Silent:
    """A sink that takes what comes and does nothing with it."""

    takes_mrtr = False

    def on_message(self, msg: Message) -> None:
        pass

    def on_response(self, msg: Message) -> None:
        pass

    def on_refused(self, capability: str) -> None:
        pass


IGNORE = Silent()  # a sink for answers nobody waits for


class FutureSink(Silent):
    """A sink for the gateway's own requests: the response resolves a future."""

    def __init__(self) -> None:
        self.future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()

    def on_response(self, msg: Message) -> None:
        if not self.future.done():
            self.future.set_result(msg)


def _refusal(name: str, reply: Message) -> UpstreamError | None:
    """Why an initialize reply cannot be accepted, if it cannot."""
    result, error = reply.get("result"), reply.get("error")
    if isinstance(error, dict):  # the server's own error answer
        return UpstreamInitializeFailed(name, f"initialize failed: {error.get('message', '')}")
    version = result.get("protocolVersion") if isinstance(result, dict) else None
    if not isinstance(result, dict) or version not in mcp.LEGACY_VERSIONS:
        return UpstreamInitializeFailed(name, f"upstream '{name}' answered initialize with "
                                        f"protocol version {shown(version)}, which the "
                                        "gateway does not speak")
    return None


__all__ = ["CONNECTING", "IGNORE", "FutureSink", "Handshake", "Opening", "Silent", "Speaker",
           "Starts"]
