"""Server-Sent Event streams with event ids and a bounded replay buffer.

spec (Streamable HTTP, Resumability): event ids are unique across the session's streams, and
a client that reconnects with `Last-Event-ID` gets what it missed on *that* stream only. An id
here is `<stream key>-<sequence>`, so it names its stream. Each stream keeps its last
`limits.replay_events` events; a stream whose writer is gone keeps filling the buffer, so a
call whose client dropped off can still deliver its response on resume.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque

from aiohttp import web

from gateway.protocol import mcp

KEEPALIVE = b": keep-alive\n\n"
# The buffer also holds events not yet written: never so small that a burst between two
# writes loses some (a stream with no replay still queues this many).
MIN_QUEUE = 64


class Stream:
    """The events of one SSE stream, whether or not a client is reading it right now."""

    __slots__ = ("_waiter", "buffer", "closed", "key", "sent", "seq", "writer")

    def __init__(self, key: str, replay: int) -> None:
        self.key = key
        self.seq = 0
        self.sent = 0  # the last sequence number written to a live connection
        self.closed = False  # the final event is in: writers stop after it
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=max(replay, MIN_QUEUE))
        self._waiter: asyncio.Future[None] | None = None
        self.writer: object | None = None  # the one connection reading this stream now

    def push(self, data: bytes, *, last: bool = False) -> None:
        self.seq += 1
        self.buffer.append((self.seq, data))
        if last:
            self.closed = True
        self._wake()

    def close(self) -> None:
        self.closed = True
        self._wake()

    def since(self, seq: int) -> list[tuple[int, bytes]]:
        return [item for item in self.buffer if item[0] > seq]

    async def wait(self, timeout_s: float) -> bool:
        """Wait for news; False when `timeout_s` passed first."""
        loop = asyncio.get_running_loop()
        self._waiter = waiter = loop.create_future()
        handle = loop.call_later(timeout_s, _resolve, waiter)
        try:
            await waiter
        finally:
            handle.cancel()
            if self._waiter is waiter:
                self._waiter = None
        return waiter.result() is None

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(False)  # type: ignore[arg-type]


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


async def pump(resp: web.StreamResponse, stream: Stream, after: int, keepalive_s: float) -> None:
    """Write `stream`'s events after sequence `after` until it closes, the client leaves, or
    another connection takes the stream over (spec: each message goes on one stream only)."""
    stream._wake()  # a previous reader wakes, sees it is no longer the writer, and returns
    stream.writer = resp
    with contextlib.suppress(ConnectionError):
        while stream.writer is resp:
            batch = stream.since(after)
            if batch:
                await resp.write(b"".join(frame(stream.key, s, d) for s, d in batch))
                after = stream.sent = batch[-1][0]
            if stream.closed and after >= stream.seq:
                return
            if not await stream.wait(keepalive_s) and stream.writer is resp:
                await resp.write(KEEPALIVE)
    if stream.writer is resp:
        stream.writer = None
