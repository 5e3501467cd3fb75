"""The HTTP transport: an MCP server over Streamable HTTP (or the older HTTP+SSE).

spec: mcp-base-2025-06-18.md, Streamable HTTP. This owns the session's life: the link's
handshake runs over it once, and the transport keeps the `Mcp-Session-Id` it is given; the
server's own requests and notifications arrive on a GET stream. A 4xx to the POST of
initialize means a server of the older HTTP+SSE transport (2024-11-05; spec: Backwards
Compatibility): one GET stream names the endpoint to POST to and carries every answer. A
session the server dropped fails the calls in flight (but those to be sent again on the new
one, and for DOUBT_S those whose POST is not answered yet: a 404 may yet say the server
never saw them) and the connection initializes again. Each message is a POST of its own
(http_post.py).
Either way every message goes to the link (connection.py) as a stdio server's would, so
routing, tasks and MRTR do not care which transport is behind a call.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from gateway import redact
from gateway.answer_bytes import UNCOUNTED, Partial
from gateway.errors import (
    UpstreamDown,
    UpstreamError,
    UpstreamInitializeFailed,
    UpstreamUnreachable,
)
from gateway.observability import log
from gateway.protocol import mcp
from gateway.settings.schema import Upstream as UpstreamConf
from gateway.upstream import sse_client
from gateway.upstream.correlator import Call
from gateway.upstream.http_post import (
    Poster,
    ServerSession,
    forgets_session,
    reason,
    session_lost,
)
from gateway.upstream.sse_client import EventReader
from gateway.upstream.transport import STABLE_AFTER_S, Link, backoff_s, start_failed

GET_REFUSALS = 5  # 5xx answers to the GET stream in a row, with backoff, before giving up
DOUBT_S = 2.0  # how long a call unanswered when its session was lost waits for a 404


class HttpTransport:
    def __init__(self, link: Link, name: str, conf: UpstreamConf, url: str,
                 max_message_bytes: int, restart: bool = True,
                 partial: Callable[[str | None], Partial] | None = None) -> None:
        self._link = link
        self.max_message_bytes = max_message_bytes  # of an answer, or an event's data
        # How the answer budget counts an answer read in part, by its call's principal
        # (None: of no principal's call; answer_bytes.py).
        self.partial = partial or (lambda _: UNCOUNTED)
        self.name = name
        self.restarts = 0
        self.conf = conf
        self.url = url
        self.restart = restart
        self.session = ServerSession(url, conf.headers, url)
        self._poster: Poster | None = None  # from start: its HTTP client needs the loop
        self._tasks: set[asyncio.Task[Any]] = set()
        self._task: asyncio.Task[None] | None = None
        self._stream: asyncio.Task[None] | None = None  # the HTTP+SSE transport's stream
        self._posts: dict[int, asyncio.Task[None]] = {}  # by upstream id, to abort them

    @property
    def kind(self) -> str:
        return self.session.kind

    @property
    def state(self) -> str:
        return self.session.state

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        # GET streams may be quiet for hours: only connecting has a deadline (POSTs have
        # read_timeout_ms too, http_post.py).
        http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(
            total=None, sock_connect=self.conf.connect_timeout_ms / 1000))
        poster = self._poster = Poster(self.name, self.conf, self.session, self._link, http,
                                       self.write, self.max_message_bytes, self.partial,
                                       resends=self.restart)
        self._task = asyncio.create_task(self._supervise(poster), name=f"upstream:{self.name}")

    def status(self) -> dict[str, Any]:
        return {"url": redact.url(self.url), "transport": self.kind}

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for task in [*self._tasks, *([self._stream] if self._stream else [])]:
            task.cancel()
        if self._poster is not None:
            if self.session.session_id is not None:  # spec: DELETE ends the session
                await _delete(self._poster.http, self.url, self.session.headers())
            await self._poster.http.close()

    async def _supervise(self, poster: Poster) -> None:
        failures = short = 0  # failed starts; sessions lost soon after they began
        while True:
            try:
                await self._initialize(poster)
            except (aiohttp.ClientError, UpstreamError, TimeoutError) as exc:
                self.session.state, failures = "backoff", failures + 1
                cap_ms = self.conf.restart_backoff_max_ms if self.restart else None
                if not await start_failed(self._link, self._shown(exc), failures, cap_ms,
                                          url=self.url):
                    return
                continue
            failures, began = 0, time.monotonic()
            listener = asyncio.create_task(self._listen(poster))
            try:
                await self.session.lost.wait()
            finally:  # lost, or the transport closes: the GET stream goes with the session
                listener.cancel()
            self._on_lost(poster)
            if not self.restart:
                return
            self.restarts += 1
            # A session lost soon after it began (a GET stream that says "no such session"
            # to every new one, say) is begun again after a backoff, as a process that keeps
            # exiting is (stdio.py): not thousands of times a second. Callers wait meanwhile
            # (the state is "restarting").
            short = short + 1 if time.monotonic() - began < STABLE_AFTER_S else 0
            if short:
                await asyncio.sleep(backoff_s(short, self.conf.restart_backoff_max_ms))

    def _shown(self, exc: Exception) -> Exception:
        """A failed start as its waiting clients read it: aiohttp's words name the host and
        port, which only the log line has (`said`, and its `url`)."""
        if not isinstance(exc, aiohttp.ClientError):
            return exc
        name = self.name
        verb = "cannot be reached" if isinstance(exc, aiohttp.ClientConnectorError) else "failed"
        return UpstreamUnreachable(name, f"upstream '{name}' {verb}: {reason(exc)}",
                                   detail=redact.text(str(exc)))

    async def _initialize(self, poster: Poster) -> None:
        self.session.begin()
        try:
            self.session.version = await self._link.on_up()
        except UpstreamError:
            if self.session.refused is None:
                raise
            # spec (Backwards Compatibility): a 4xx to the POST of initialize, and no modern
            # server either: the HTTP+SSE transport, whose GET stream names where to POST.
            await self._open_sse_transport(poster)
            self.session.version = await self._link.on_up()
        self.session.state = "up"

    def _on_lost(self, poster: Poster) -> None:
        self.session.state = "restarting"
        if self._stream is not None:
            self._stream.cancel()
            self._stream = None
        log.warning("upstream.session_lost", upstream=self.name, in_flight=self._link.in_flight)
        # The GET stream may learn of the loss before a call's own POST is refused with the
        # 404 that sends it again (spec, Session Management: the server did not process it).
        # A call whose POST is not answered yet waits DOUBT_S for that 404 (http_post.py,
        # `Poster.doubt`); one whose answer has begun was the lost session's, and fails.
        # No new session follows a transport that does not restart: nothing to wait for.
        doubtful = poster.doubt() if self.restart else set[Call]()
        self._link.on_lost(session_lost(self.name), keep={*poster.resending, *doubtful})
        if doubtful:
            asyncio.get_running_loop().call_later(DOUBT_S, self._doubt_over, poster, doubtful)

    def _doubt_over(self, poster: Poster, calls: set[Call]) -> None:
        """The calls of a lost session whose POSTs said nothing within DOUBT_S (a server
        gone silent, say) fail as the session's other calls did, their POSTs closed."""
        for call in calls & poster.doubtful:
            poster.doubtful.discard(call)
            self.abort(call)
            self._link.on_failed(call, session_lost(self.name))

    # -- the HTTP+SSE transport (2024-11-05) --------------------------------------------------
    async def _open_sse_transport(self, poster: Poster) -> None:
        try:
            resp, events, self.session.post_url = await sse_client.open_endpoint(
                poster.http, self.url, self.conf.headers, self.max_message_bytes,
                self.partial(None))
        except ValueError as exc:  # where a refused stream pointed: for the log only
            raise UpstreamInitializeFailed(
                self.name, f"upstream '{self.name}' refused initialize (HTTP "
                f"{self.session.refused}) and {exc}",
                detail=exc.detail if isinstance(exc, sse_client.Refused) else "") from None
        self.session.kind = "http+sse"
        log.info("upstream.http_sse_transport", upstream=self.name)
        # This transport's session is its stream: when it ends, the session is lost.
        self._stream = asyncio.create_task(sse_client.pump(
            resp, events, self._link.on_message, self.session.lost.set))

    # -- transport ----------------------------------------------------------------------------
    def write(self, data: bytes, call: Call | None = None,
              headers: dict[str, str] | None = None) -> None:
        if self._poster is None or self._poster.http.closed:
            raise UpstreamDown(self.name, f"upstream '{self.name}' is not running")
        task = asyncio.create_task(self._poster.post(data, call, headers))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if call is not None:
            uid = call.upstream_id
            self._posts[uid] = task
            task.add_done_callback(lambda _: self._posts.pop(uid, None))

    def abort(self, call: Call) -> bool:
        """Close the call's POST stream (spec 2026-07-28: cancels it on a modern server)."""
        post = self._posts.pop(call.upstream_id, None)
        if post is None:
            return False
        post.cancel()
        return True

    async def _listen(self, poster: Poster) -> None:
        """The GET stream: the server's messages that belong to no POST, resumed with
        Last-Event-ID after the server's `retry` when it ends (spec: the server MAY close it
        at any time; SEP-1699 polling). None on a modern server (spec 2026-07-28 Streamable
        HTTP: POST only, GET is 405): it speaks on each request's stream and on listen. One
        that ends STALLED_RESUMES streams in a row at once with nothing new is not asked
        again (upstream.get_stream_ended): a stream that lived STABLE_AFTER_S was working."""
        if self.kind != "streamable-http" or self.session.version in mcp.MODERN_VERSIONS:
            return  # the HTTP+SSE stream is read since initialize
        reader, refusals, stalled = EventReader(self.max_message_bytes, self.partial(None)), 0, 0
        while True:
            news, began = reader.news, time.monotonic()
            got = await sse_client.follow(poster.http, self.url, self.session.headers(),
                                          reader, self._link.on_message, None)
            if got.status == 405:
                return  # the server offers no GET stream (spec allows it)
            if got.unreachable or (self.session.session_id is not None
                                   and forgets_session(got.status, got.body)):
                self.session.lost.set()  # a new session, or backoff while it is away
                return
            if got.status is not None and got.status != 200:
                refusals += 1
                if not await self._refused(got.status, refusals):
                    return
                continue
            refusals = 0
            moved = reader.news > news or time.monotonic() - began >= STABLE_AFTER_S
            stalled = 0 if moved else stalled + 1
            if stalled == sse_client.STALLED_RESUMES:
                log.warning("upstream.get_stream_ended", upstream=self.name, attempts=stalled,
                            reason="the server ended its GET stream at once each time, "
                            "with nothing new")
                return
            await asyncio.sleep(reader.retry_s)

    async def _refused(self, status: int, refusals: int) -> bool:
        """After the GET stream's `refusals`-th refusal in a row, whether to ask again (after
        a backoff): a 4xx, or GET_REFUSALS 5xx, say it will not give one, and asking each
        second helps nobody."""
        if status < 500 or refusals == GET_REFUSALS:
            log.warning("upstream.get_stream_refused", upstream=self.name, status=status,
                        attempts=refusals)
            return False
        await asyncio.sleep(backoff_s(refusals, self.conf.restart_backoff_max_ms))
        return True


async def _delete(http: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> None:
    """End an upstream session, best effort (two seconds at most)."""
    with contextlib.suppress(aiohttp.ClientError, TimeoutError):
        async with http.delete(url, headers=headers, timeout=aiohttp.ClientTimeout(total=2),
                               allow_redirects=False):
            pass
