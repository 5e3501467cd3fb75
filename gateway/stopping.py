"""How a serving gateway stops: SIGTERM (what `docker stop`, Kubernetes and systemd send)
or SIGINT starts the drain; the drain's end, or a second signal, stops the server.

The drain (docs/deploys.md): readiness goes first (`/readyz` answers 503 from the signal
on, so balancers take this replica out; `/healthz` stays 200), new tools/call are refused
as stopping and calls still waiting in a queue are refused so (leases.py), while calls
already running, inline or as tasks, go on for up to `shutdown.drain_ms`, and tasks/* and
input rounds are still served. It ends as soon as the last call does. Then aiohttp stops
accepting, and the app's on_shutdown (app.py `_stop`) ends what still runs, as before a
drain existed: each call answered "the gateway is stopping" and cancelled upstream, its
task failed with that message.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.web_runner import GracefulExit

from gateway.downstream.leases import Leases
from gateway.observability import log

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Stopping:
    """The drain of one serving gateway, started by the first stop signal."""

    def __init__(self, leases: Leases, drain_ms: int) -> None:
        self.leases = leases
        self.drain_s = drain_ms / 1000
        self._drain: asyncio.Task[None] | None = None

    def on_startup(self) -> Callable[[web.Application], Awaitable[None]]:
        """For the app's on_startup: the stop signals start the drain from now on (aiohttp's
        own handlers, which stop at once, are not installed: handle_signals=False)."""
        async def install(_: web.Application) -> None:
            loop = asyncio.get_running_loop()
            for sig in SIGNALS:
                loop.add_signal_handler(sig, self.signalled, sig)
        return install

    def signalled(self, sig: int) -> None:
        if self._drain is None:
            self._drain = asyncio.get_running_loop().create_task(self.drain(sig))
        else:  # a second signal: the operator will not wait
            log.info("shutdown.drain_cut", signal=signal.Signals(sig).name)
            self._drain.cancel()

    async def drain(self, sig: int) -> None:
        """Let running calls finish (at most `drain_s`), then stop the server."""
        try:
            refused = self.leases.stop()
            log.info("shutdown.draining", signal=signal.Signals(sig).name,
                     calls=len(self.leases.live), queued_refused=refused,
                     drain_ms=round(self.drain_s * 1000))
            left = await self.leases.idle(self.drain_s)
            log.info("shutdown.drained", still_running=left)
        finally:
            # Raised from a callback, as aiohttp's own signal handler does: run_app stops.
            asyncio.get_running_loop().call_soon(_stop_serving)


def _stop_serving() -> None:
    raise GracefulExit()


__all__ = ["Stopping"]
