"""Which era a server of both eras speaks to modern clients (`era: auto`, shared isolation).

spec 2026-07-28 versioning, Backward Compatibility: "The era determination is a property of
the server, not of an individual request. Clients SHOULD cache the result for the lifetime
of the server process (stdio) or origin (HTTP)". The primary process opens with
initialize (legacy clients' sessions go there); a second link probes with server/discover
first: for a stdio server at the upstream's start, once the primary is ready, so that the
first modern request does not wait for a second process to start (seconds: issue 51); for
an HTTP server (a request or two) at the first modern request. If the server answers at the
modern version, modern clients reach it there, on its own modern wire (its input_required
rounds, its statelessness), for the backend's life; if it answers initialize only, it is a
legacy server, its probe's process ends, and modern clients are bridged onto the primary.
No answer either way: the next modern request asks again.

Only a shared backend holds one (isolation.py): `isolation: client` opens each principal's
own process with the probe first, and `isolation: call` keeps one warm pool whose processes
open as its control process does (legacy ones, for a server of both eras), so a request's
era never depends on which process it is handed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from gateway.errors import UpstreamError
from gateway.observability import log
from gateway.upstream.connection import Connection


class DualEra:
    """The modern link of one upstream, found once by probing (see the module docstring)."""

    def __init__(self, name: str, open_link: Callable[[], Connection]) -> None:
        self.name = name
        self._open_link = open_link  # a new connection that opens with the probe
        self.link: Connection | None = None  # the modern link, once found
        self._probe: asyncio.Task[Connection | None] | None = None

    def probe(self, after: Callable[[], Awaitable[object]]) -> None:
        """Probe now, once `after` (the primary ready) is done, if no probe is under way."""
        if self._probe is None:
            self._probe = asyncio.create_task(self._find(after), name="era-probe")

    @property
    def state(self) -> str:
        """For /readyz?detail: `probing`, `modern` (the link found), `legacy`, or
        `unknown` (no answer yet: the next modern request asks)."""
        if self.link is not None:
            return "modern"
        if self._probe is None:
            return "unknown"
        if not self._probe.done():
            return "probing"
        return "legacy"

    async def modern_link(self) -> Connection | None:
        """The link that serves modern clients on the server's own modern wire; None while
        the server is not known to speak it (a legacy server, or no answer yet)."""
        self.probe(_nothing)
        assert self._probe is not None
        # Shielded: a caller that goes away does not end the probe the next one waits for.
        return await asyncio.shield(self._probe)

    async def _find(self, after: Callable[[], Awaitable[object]]) -> Connection | None:
        try:
            await after()
        except UpstreamError:  # the server cannot start now: the next modern request asks
            self._probe = None
            return None
        link = self._open_link()
        link.start()
        try:
            await link.wait_ready()
        except UpstreamError as exc:  # no answer either way: the next modern request asks again
            await link.close()
            self._probe = None
            log.info("upstream.eras_unknown", upstream=self.name, said=exc.message)
            return None
        except BaseException:  # the gateway stops meanwhile: no process left behind
            await link.close()
            raise
        if not link.modern:  # it answered initialize only: a legacy server
            await link.close()
            log.info("upstream.eras", upstream=self.name, modern=False)
            return None
        self.link = link
        log.info("upstream.eras", upstream=self.name, modern=True, legacy=True)
        return link

    async def close(self) -> None:
        """The probe under way ends (the link itself is closed with its backend's others)."""
        if self._probe is not None:
            self._probe.cancel()
            await asyncio.gather(self._probe, return_exceptions=True)


async def _nothing() -> None:
    pass


__all__ = ["DualEra"]
