"""Server-Sent Event streams with event ids and a bounded replay buffer.

spec (Streamable HTTP, Resumability): event ids are unique across the session's streams, and
a client that reconnects with `Last-Event-ID` gets what it missed on *that* stream only. An id
here is `<stream key>-<sequence>`, so it names its stream. Each stream keeps its last
`limits.replay_events` events and at most `limits.replay_bytes` bytes (the newest event is
always kept); a stream whose writer is gone keeps filling the buffer, so a call whose client
dropped off can still deliver its response on resume.

The streams of legacy sessions share one byte budget in all (`limits.replay_budget_bytes`,
replay.py): each push reports its growth to it, a stream whose last event was written is
reported as delivered, and the budget makes a stream shed what no reader waits for.

Slow readers: a write that the client has not taken within `limits.slow_reader_ms` cuts that
client off (its connection is aborted, so the bytes queued for it are freed at once): one
reader that never reads cannot hold the gateway's memory. A big plain-JSON answer is
written under the same rule (`send_body`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from aiohttp import web

from gateway.laggards import Laggards
from gateway.observability import log
from gateway.protocol import mcp
from gateway.settings.schema import Settings

KEEPALIVE = b": keep-alive\n\n"
# The buffer also holds events not yet written: never so small that a burst between two
# writes loses some (a stream with no replay still queues this many).
MIN_QUEUE = 64
REPLAY_BYTES = 16 << 20  # per stream, when no setting says otherwise
RETRY_MS = 1000  # the `retry` a resumable stream's priming event gives its client


class Budget(Protocol):
    """What bounds the bytes of many streams together (replay.py's ReplayBudget)."""

    def grew(self, stream: Stream, delta: int) -> None:
        """`stream` holds `delta` more bytes (fewer, when negative) after a push."""

    def delivered(self, stream: Stream) -> None:
        """Every event of `stream`, the last one included, was written to a reader."""


@dataclass(frozen=True, slots=True)
class Flow:
    """How streams are paced: keep-alive comments when idle, how long one write may wait
    for a slow reader before that reader is cut off, and how often a quiet call with a
    progress token hears a heartbeat (0: never). `late`: what of its calls waits long
    enough to arm timers (laggards.py)."""

    keepalive_s: float
    slow_s: float
    heartbeat_s: float = 0.0
    late: Laggards = field(default_factory=Laggards, compare=False)

    @classmethod
    def of(cls, conf: Settings) -> Flow:
        return cls(conf.listen.sse_keepalive_ms / 1000, conf.limits.slow_reader_ms / 1000,
                   conf.listen.progress_heartbeat_ms / 1000)


class Stream:
    """The events of one SSE stream, whether or not a client is reading it right now."""

    __slots__ = ("_waiter", "budget", "buffer", "bytes", "closed", "key", "max_bytes",
                 "max_events", "resumable", "sent", "seq", "writer")

    def __init__(self, key: str, replay: int, max_bytes: int = REPLAY_BYTES) -> None:
        self.key = key
        self.seq = 0
        self.sent = 0  # the last sequence number written to a live connection
        self.closed = False  # the final event is in: writers stop after it
        self.max_events = max(replay, MIN_QUEUE)
        self.max_bytes = max_bytes
        self.buffer: deque[tuple[int, bytes]] = deque()
        self.bytes = 0
        # Resolved True by news (`_wake`), False when the wait's time is up (`_resolve`).
        self._waiter: asyncio.Future[bool] | None = None
        self.writer: object | None = None  # the one connection reading this stream now
        self.budget: Budget | None = None  # what bounds it with others (legacy sessions')
        # A legacy session's (spec 2025-11-25, Resumability): primed when opened, see pump.
        # A modern one is not (spec 2026-07-28 Streamable HTTP: streams are not resumable).
        self.resumable = False

    def push(self, data: bytes, *, last: bool = False) -> None:
        self.seq += 1
        self.buffer.append((self.seq, data))
        before = self.bytes
        self.bytes += len(data)
        while len(self.buffer) > 1 and (len(self.buffer) > self.max_events
                                        or self.bytes > self.max_bytes):
            self.bytes -= len(self.buffer.popleft()[1])  # the oldest go; the newest stays
        if last:
            self.closed = True
        if self.budget is not None:
            self.budget.grew(self, self.bytes - before)
        self._wake()

    def shed(self) -> int:
        """Drop what no reader waits for: the events already written, and every event when
        no connection reads it (its client may resume, but the budget needs the room); the
        bytes freed."""
        freed = 0
        buffer = self.buffer
        while buffer and (self.writer is None or buffer[0][0] <= self.sent):
            freed += len(buffer.popleft()[1])
        self.bytes -= freed
        return freed

    def trim(self, excess: int) -> int:
        """Drop its oldest events, the newest kept, until `excess` bytes went; those freed."""
        freed = 0
        while len(self.buffer) > 1 and freed < excess:
            freed += len(self.buffer.popleft()[1])
        self.bytes -= freed
        return freed

    def close(self) -> None:
        self.closed = True
        self._wake()

    def since(self, seq: int) -> list[tuple[int, bytes]]:
        return [item for item in self.buffer if item[0] > seq]

    async def wait(self, timeout_s: float) -> bool:
        """Wait for news; False when `timeout_s` passed first."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool] = loop.create_future()
        self._waiter = waiter
        handle = loop.call_later(timeout_s, _resolve, waiter)
        try:
            return await waiter
        finally:
            handle.cancel()
            if self._waiter is waiter:
                self._waiter = None

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(True)


def _resolve(fut: asyncio.Future[bool]) -> None:
    if not fut.done():
        fut.set_result(False)


def priming(key: str, seq: int) -> bytes:
    """spec 2025-11-25 Streamable HTTP (SSE polling, SEP-1699): a server that opens an SSE
    stream SHOULD at once send an event of an id and empty data, so the client can
    reconnect after it (Last-Event-ID) if the connection drops before the first message,
    and SHOULD say with `retry` how long to wait before it does."""
    return b"id: %s-%d\nretry: %d\ndata: \n\n" % (key.encode(), seq, RETRY_MS)


def frame(key: str, seq: int, data: bytes) -> bytes:
    return b"id: %s-%d\nevent: message\ndata: %s\n\n" % (key.encode(), seq, data)


def parse_event_id(value: str) -> tuple[str, int] | None:
    key, sep, seq = value.rpartition("-")
    if not sep or not seq.isdigit():
        return None
    return key, int(seq)


async def open_response(request: web.Request, headers: dict[str, str]) -> web.StreamResponse:
    resp = web.StreamResponse(status=200, headers={
        "Content-Type": mcp.CT_SSE, "Cache-Control": "no-cache, no-transform",
        "X-Accel-Buffering": "no", **headers})
    await resp.prepare(request)
    return resp


async def pump(request: web.Request, resp: web.StreamResponse, stream: Stream, after: int,
               flow: Flow) -> None:
    """Write `stream`'s events after sequence `after` until it closes, the client leaves, or
    another connection takes the stream over (spec: each message goes on one stream only).
    A client that does not take a write within `flow.slow_s` is cut off."""
    stream._wake()  # a previous reader wakes, sees it is no longer the writer, and returns
    stream.writer = resp
    with contextlib.suppress(ConnectionError):
        primed = not stream.resumable or await _write(request, resp,
                                                      priming(stream.key, after), flow.slow_s)
        while primed and stream.writer is resp:
            batch = stream.since(after)
            if batch:
                data = b"".join(frame(stream.key, s, d) for s, d in batch)
                if not await _write(request, resp, data, flow.slow_s):
                    break
                after = stream.sent = batch[-1][0]
                continue  # more may have come while the write waited: look before waiting
            if stream.closed:
                if stream.budget is not None:
                    stream.budget.delivered(stream)
                return
            if not await stream.wait(flow.keepalive_s) and stream.writer is resp and \
                    not await _write(request, resp, KEEPALIVE, flow.slow_s):
                break
    if stream.writer is resp:
        stream.writer = None


# Up to this size a body fits the transport's buffer at once: aiohttp writes it without
# waiting for the reader, so no slow-reader rule is needed (nor the cost of a timer).
BUFFERED = 1 << 16


async def send_body(request: web.Request, body: bytes, status: int, headers: dict[str, str],
                    flow: Flow) -> web.StreamResponse:
    """A whole JSON answer. Above `BUFFERED` bytes it is written here, under the slow-reader
    rule, rather than by aiohttp after the handler returns, which waits for the reader
    without end and holds the body meanwhile."""
    if len(body) <= BUFFERED:
        return web.Response(body=body, status=status, headers=headers)
    resp = web.StreamResponse(status=status, headers=headers)
    resp.content_length = len(body)
    await resp.prepare(request)
    with contextlib.suppress(ConnectionError):
        if await _write(request, resp, body, flow.slow_s):
            await resp.write_eof()
    return resp


async def _write(request: web.Request, resp: web.StreamResponse, data: bytes, slow_s: float
                 ) -> bool:
    """False when the reader did not take `data` in time: its connection is aborted, which
    frees what was queued for it (the events stay in the stream for a resume)."""
    try:
        async with asyncio.timeout(slow_s):  # no task of its own: writes stay in order
            await resp.write(data)
    except TimeoutError:
        log.warning("stream.slow_reader_cut", path=request.path, pending_bytes=len(data),
                    waited_s=slow_s)
        if request.transport is not None:
            request.transport.abort()
        return False
    return True
