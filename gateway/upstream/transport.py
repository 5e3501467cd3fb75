"""The `Transport` protocol: how bytes reach one upstream server and come back.

Transports sit side by side (stdio.py: a supervised subprocess; http.py: Streamable HTTP or
the older HTTP+SSE), each owning its own supervision: spawning or connecting, restarting with
backoff, and telling its `Link` (the connection, connection.py) what happens. They know
nothing of ids, owners or tasks. A new transport (WebSocket, say) is one new module.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection
from typing import Any, Protocol

from gateway import redact
from gateway.errors import AnswersOverBudget, UpstreamError, UpstreamUnreachable
from gateway.observability import log
from gateway.upstream.correlator import Call

FIRST_RETRY_S = 0.1
STABLE_AFTER_S = 10.0  # a process (or an HTTP session) that lived this long resets the backoff


def backoff_s(failures: int, cap_ms: int) -> float:
    """The wait before the next start after `failures` failed ones in a row: doubling from
    0.1 s, capped at `restart_backoff_max_ms`."""
    return min(cap_ms / 1000, FIRST_RETRY_S * 2.0 ** max(failures - 1, 0))


async def start_failed(link: Link, exc: Exception, failures: int, cap_ms: int | None,
                       url: str | None = None) -> bool:
    """Tell of a failed start: one log line an attempt (why, the URL without credentials,
    when the next attempt is), and those waiting for the link, at once; then wait before
    the next attempt. False when there is none (`cap_ms` None: no restarts)."""
    fields = {} if url is None else {"url": redact.url(url)}
    error = exc if isinstance(exc, UpstreamError) else UpstreamUnreachable(
        link.name, f"upstream '{link.name}': {exc or type(exc).__name__}")
    delay = None if cap_ms is None else backoff_s(failures, cap_ms)
    if error.detail:
        fields["said"] = error.detail
    log.error("upstream.start_failed", upstream=link.name, error=error.message,
              attempt=failures, **fields,
              **({} if delay is None else {"retry_in_s": round(delay, 3)}))
    link.on_down(error)
    if delay is not None:
        await asyncio.sleep(delay)
    return delay is not None


class Link(Protocol):
    """What a transport tells its connection, and the little it asks of it."""

    name: str

    def on_message(self, data: bytes | bytearray | memoryview, via: Call | None = None
                   ) -> bool:
        """One serialized JSON-RPC message from the server; `via`: the call on whose own
        stream it came (an HTTP POST's), which a server request there belongs to. False
        when it is no message the gateway can read (logged and dropped). A bytearray is
        the transport's buffer handed over: emptied once parsed (issue 54: a 1 MiB answer
        was held three times at once, as read, parsed and serialized for its client)."""

    async def on_up(self) -> str:
        """The transport is connected: the connection's handshake runs (UpstreamError if
        it fails); the protocol version it settled on is returned."""

    def on_lost(self, error: UpstreamError, keep: Collection[Call] = ()) -> None:
        """The server went away (the process exited, the session ended): calls in flight
        fail with `error`, but those in `keep`, which the transport will send again."""

    def on_down(self, error: UpstreamError) -> None:
        """A start failed (`error` says why; the transport retries after a backoff): those
        waiting for the link are told at once."""

    def on_failed(self, call: Call, error: UpstreamError | AnswersOverBudget) -> bool:
        """One request got no answer (or its answer was dropped as it was read: over its
        principal's share of the answer budget); False when its call was answered already."""

    def pending(self, call: Call) -> bool:
        """Whether `call` still waits for its answer."""

    @property
    def in_flight(self) -> int: ...


class Transport(Protocol):
    """Made whole, with its link (`MakeTransport`): the connection builds its own."""

    restarts: int

    @property
    def kind(self) -> str:
        """"stdio", "streamable-http" or "http+sse", for /readyz."""

    @property
    def state(self) -> str:
        """starting, initializing, up, backoff, exited, restarting or stopped."""

    def start(self) -> None:
        """Connect (or spawn) in the background, and keep doing so (unless told not to
        restart) until closed, telling its link (given when it was made) what happens."""

    def write(self, data: bytes, call: Call | None = None,
              headers: dict[str, str] | None = None) -> None:
        """Send one serialized message, a newline-terminated line (`jsonrpc.line`: the
        request of `call`, if given, with the client's `headers` that an HTTP upstream
        passes on); UpstreamError when down."""

    def abort(self, call: Call) -> bool:
        """Close the call's own stream, if it has one (True); that cancels it on a modern
        server over HTTP."""

    async def close(self) -> None: ...

    def status(self) -> dict[str, Any]:
        """What /readyz tells of the link besides state and restarts."""


MakeTransport = Callable[[Link], Transport]  # a transport for the connection it is made for
