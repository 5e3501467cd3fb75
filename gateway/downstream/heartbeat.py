"""The progress heartbeat of one quiet call (`listen.progress_heartbeat_ms`, issue 40).

Clients give up on a request that stays quiet: the TypeScript SDK after 60 s unless a
progress notification resets its timer (`resetTimeoutOnProgress`), the Inspector's web UI
after 10 s (reset on progress by default; its CLI waits 60 s and sends no token). SSE
keep-alive comments keep proxies awake but no client's timer. So while a call whose request
carried a `progressToken` has sent its client nothing for the heartbeat interval, the
gateway sends `notifications/progress` for that token itself, saying the
call still runs (or waits in its queue) and for how long. A call without a token never
hears one: spec (Progress), progress is only sent for a token the requester gave.

spec (Progress): "The `progress` value MUST increase with each notification, even if the
total is unknown." The server's own notifications share the token, so every value passes
through here: one above the last value sent goes on as it is; one that is not (the
heartbeat went past it) is raised just above the last. A heartbeat adds a thousandth, so
the server's own values are hardly moved and its `total` stays meaningful.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

from gateway.protocol import mcp
from gateway.protocol.jsonrpc import Message, RequestId

STEP = 0.001  # what a heartbeat adds to the last value sent

Waiting = Callable[[], int | None]  # how many calls are ahead in its queue; None: it runs


def after(value: float | None) -> float:
    """The smallest tidy value above `value` (three decimals, as a person reads it)."""
    if value is None:
        return STEP
    out = round(value + STEP, 3)
    return out if out > value else math.nextafter(value, math.inf)


class Heartbeat:
    """Watches what one call sends its client; speaks up when it stays quiet."""

    __slots__ = ("_handle", "_heard", "_send", "_started", "_waiting", "every_s", "last",
                 "token")

    def __init__(self, token: RequestId, every_s: float, send: Callable[[Message], None],
                 waiting: Waiting | None = None) -> None:
        self.token = token
        self.every_s = every_s
        self.last: float | None = None  # the last progress value sent for the token
        self._send = send
        self._waiting = waiting
        self._started = self._heard = time.monotonic()
        self._handle: asyncio.TimerHandle | None = asyncio.get_running_loop().call_later(
            every_s, self._fire)

    def heard(self, msg: Message) -> None:
        """`msg` goes to the client now: the call is not quiet; a progress value is kept
        above the last one sent (spec: MUST increase)."""
        self._heard = time.monotonic()
        if msg.get("method") != mcp.PROGRESS:
            return
        params = msg.get("params")
        if not isinstance(params, dict):
            return
        value = params.get("progress")
        if not isinstance(value, int | float) or isinstance(value, bool):
            return
        if self.last is not None and value <= self.last:
            params["progress"] = value = after(self.last)
        self.last = float(value)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _fire(self) -> None:
        now = time.monotonic()
        due = self._heard + self.every_s
        if now >= due:
            self._send(self._beat(now))
            due = self._heard + self.every_s
        self._handle = asyncio.get_running_loop().call_later(max(0.0, due - now), self._fire)

    def _beat(self, now: float) -> Message:
        self._heard = now
        self.last = after(self.last)
        ahead = None if self._waiting is None else self._waiting()
        took = int(now - self._started)
        # Not how many are ahead: in a queue shared by principals that counts the others'
        # calls (issue 49), which this caller has no business hearing of.
        note = f"still running ({took} s)" if ahead is None else f"queued ({took} s)"
        return {"jsonrpc": "2.0", "method": mcp.PROGRESS,
                "params": {"progressToken": self.token, "progress": self.last,
                           "message": note}}


__all__ = ["Heartbeat", "Waiting", "after"]
