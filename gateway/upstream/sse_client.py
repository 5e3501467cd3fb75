"""Reading server-sent events from an upstream: the event stream itself, following a stream
again after it ended, and the endpoint event of the 2024-11-05 HTTP+SSE transport (spec
2025-06-18 Streamable HTTP, Backwards Compatibility: its GET stream names where to POST and
carries every answer).

Resuming (spec 2025-06-18 Streamable HTTP, Resumability and Redelivery; 2025-11-25, SEP-1699
polling): a server that gave its events ids may end a stream at any time, and the client
resumes it with a GET carrying `Last-Event-ID`, after the server's `retry`. The gateway
waits that `retry`, held between RETRY_MIN_S (a `retry: 0` would reconnect in a busy loop)
and RETRY_MAX_S (a huge one would hold the call past any use); 1 s when the server named
none. A stream that ends STALLED_RESUMES times in a row bringing nothing new (no message, no
new event id) is given up (its caller says why); any resume that brings something resets
the count: a server polling a long call primes every resumed stream with a new id, and is
followed until the answer (or request_timeout_ms). Who resumes: resumption.py a call's
answer stream, http.py the session's GET stream; each with `follow`."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin

import aiohttp
from yarl import URL

from gateway.answer_bytes import UNCOUNTED, Partial
from gateway.observability import log
from gateway.protocol import mcp

RETRY_S = 1.0  # before resuming a stream, unless the server said otherwise (`retry:`)
RETRY_MIN_S, RETRY_MAX_S = 0.1, 30.0  # what a server's `retry:` is held to
STALLED_RESUMES = 5  # resumes in a row that brought nothing new, then the stream is given up


class Refused(ValueError):
    """An HTTP+SSE stream the gateway does not take: why, as clients may read it, and
    `detail` for the operator's log only (where it pointed: no client learns the inside of
    the network, docs/security.md)."""

    def __init__(self, why: str, detail: str = "") -> None:
        super().__init__(why)
        self.detail = detail


FIELD_BYTES = 64  # a line's field name, beside its value's max_bytes
TOO_LARGE = "gateway:too-large"  # the event name `events` gives an event over its bound
Events = AsyncGenerator[tuple[str, bytes], None]  # a stream's events: (name, data)


class TooLarge(Exception):
    """An answer over `max_bytes` (limits.max_message_bytes): its call fails saying so."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(f"an answer over {max_bytes} bytes")
        self.max_bytes = max_bytes


class EventReader:
    """Reads one SSE stream after another, remembering the last event id and `retry:`, and
    counting what moved it on (`news`: messages and new event ids), by which a resume that
    brought nothing is told from one that did.

    An event's data is held to `max_bytes` (limits.max_message_bytes), as a stdio line is:
    past it the reader keeps nothing more of that event and gives it as a TOO_LARGE event
    with no data; the stream reads on, but after a line that long, which ends it. What the
    event being read holds (its data and the line begun) is counted in `part` (the answer
    budget, answer_bytes.py) as it comes, and given back as the event is handed on, or the
    stream ends: AnswersOverBudget, from `part`, ends the stream."""

    def __init__(self, max_bytes: int, part: Partial = UNCOUNTED) -> None:
        self.last_id: str | None = None
        self.retry_s = RETRY_S
        self.news = 0
        self.max_bytes = max_bytes
        self.part = part

    async def events(self, resp: aiohttp.ClientResponse) -> Events:
        """The stream's events, as (name, data); what the event being read holds is given
        back when the stream ends, however it ends."""
        try:
            async for item in self._events(resp):
                yield item
        finally:
            self.part.count(0)

    async def _events(self, resp: aiohttp.ClientResponse) -> Events:
        # One buffer an event, its data lines joined by \n as they come: an event split in
        # many short lines costs its bytes, not an object a line (42 times them, seen).
        event, data, lines, size = "message", bytearray(), 0, 0
        over = self.max_bytes + 1
        count = self.part.count

        def held(begun: int) -> None:  # the event's data so far, and the line begun
            count(len(data) + begun)

        async for line in _lines(resp.content, self.max_bytes + FIELD_BYTES, held):
            if line is None:  # a line past the bound: nothing more of this event's data
                data.clear()
                size = over
                continue
            if not line:
                count(0)  # handed on whole, or dropped
                if size > self.max_bytes:
                    yield TOO_LARGE, b""
                elif data:  # an event with no data only primes the id (spec: polling)
                    self.news += 1
                    yield event, bytes(data)
                event, lines, size = "message", 0, 0
                data.clear()
                continue
            name, _, value = line.partition(b":")
            value = value[1:] if value.startswith(b" ") else value
            if name == b"data":
                size = min(size + len(value) + (1 if lines else 0), over)  # joined by \n
                if size < over:
                    data += b"\n" + value if lines else value
                else:
                    data.clear()
                lines += 1
            elif name == b"event":
                event = value.decode(errors="replace")
            elif name == b"id" and _usable_id(value) and (seen := value.decode()) != \
                    self.last_id:
                self.last_id, self.news = seen, self.news + 1
            elif name == b"retry" and value.isdigit():
                self.retry_s = min(max(int(value) / 1000, RETRY_MIN_S), RETRY_MAX_S)
        if size > self.max_bytes:  # the stream ended within the event too long
            count(0)
            yield TOO_LARGE, b""


async def _lines(content: aiohttp.StreamReader, max_bytes: int,
                 begun: Callable[[int], None]) -> AsyncIterator[bytes | None]:
    """The stream's lines, without their line ends; then None, and nothing more, after a
    line longer than `max_bytes`. Split here, not by aiohttp's readline, whose line read in
    part is out of sight (its own bound is 128 KiB, and its LineTooLong no ClientError: such
    a line hung its call): `begun(n)` is told, after each chunk, the `n` bytes of the line
    begun and not ended."""
    buf = bytearray()
    async for chunk in content.iter_any():
        start, scan = 0, len(buf)
        buf += chunk
        with memoryview(buf) as view:  # a line is copied once, from the buffer
            while (nl := buf.find(b"\n", scan)) >= 0:
                end = nl - 1 if nl > start and buf[nl - 1] == 0x0D else nl  # CRLF
                if end - start > max_bytes:
                    yield None
                    return
                yield bytes(view[start:end])
                start = scan = nl + 1
        del buf[:start]
        if len(buf) > max_bytes:
            yield None
            return
        begun(len(buf))
    if buf:  # a last line the stream never ended
        yield bytes(buf)


def _usable_id(value: bytes | bytearray) -> bool:
    """An event id the gateway may send back as `Last-Event-ID`: printable UTF-8 only. The
    SSE spec ignores an id with NUL; a bare CR ends a line there (this reader splits at LF),
    and any control character would be refused as a header: a server's malformed id is
    ignored, never a reason for the call to hang."""
    try:
        text = value.decode()
    except UnicodeDecodeError:
        return False
    return text.isprintable()


async def read(reader: EventReader, resp: aiohttp.ClientResponse,
               on_message: Callable[[bytes, Any], object], via: Any,
               done: Callable[[], bool] | None = None) -> None:
    """Every message of one stream to `on_message`, with the call it belongs to (`via`),
    until the stream ends or, if given, `done()` holds after a message. An event over the
    reader's bound is TooLarge when the stream is a call's (`via`); on a stream of no call
    (a session's GET stream) it is dropped, logged, and the stream read on."""
    # What the event being read held is given back as the reading ends, whichever way. Not
    # by closing the generator (contextlib.aclosing): a task destroyed with its loop
    # (GeneratorExit inside the generator's await) made aclose() raise "already running".
    try:
        async for event, data in reader.events(resp):
            if event == TOO_LARGE:
                if via is not None:
                    raise TooLarge(reader.max_bytes)
                log.warning("upstream.message_too_large", max_message_bytes=reader.max_bytes)
                continue
            on_message(data, via)
            if done is not None and done():
                return
    finally:
        reader.part.count(0)


@dataclass(frozen=True, slots=True)
class Got:
    """How a GET went: its HTTP status (None when the connection failed or dropped),
    whether the server could not be reached at all, and the start of a refusal's body."""

    status: int | None
    unreachable: bool = False
    body: bytes = b""


REFUSAL_BYTES = 4096  # of a refused GET's body, kept to say why


async def follow(http: aiohttp.ClientSession, url: str, headers: Mapping[str, str],
                 reader: EventReader, on_message: Callable[[bytes, Any], object], via: Any,
                 done: Callable[[], bool] | None = None,
                 limits: aiohttp.ClientTimeout | None = None) -> Got:
    """GET `url` as an event stream, resumed after the reader's last event id, and read it
    to its end (or until `done()`: see `read`); `limits`, if given, over the session's."""
    wanted = {**headers, "Accept": mcp.CT_SSE}
    if reader.last_id is not None:
        wanted[mcp.H_LAST_EVENT] = reader.last_id
    try:
        async with http.get(url, headers=wanted, allow_redirects=False,
                            timeout=limits or http.timeout) as resp:
            if resp.status == 200:
                await read(reader, resp, on_message, via, done)
                return Got(200)
            return Got(resp.status, body=await resp.content.read(REFUSAL_BYTES))
    except aiohttp.ClientConnectorError:
        return Got(None, unreachable=True)
    except (aiohttp.ClientError, TimeoutError, ValueError):  # ValueError: a header refused
        return Got(None)


async def open_endpoint(http: aiohttp.ClientSession, url: str, headers: Mapping[str, str],
                        max_bytes: int, part: Partial = UNCOUNTED
                        ) -> tuple[aiohttp.ClientResponse, Events, str]:
    """The HTTP+SSE stream, its events (what an event read in part holds counted in
    `part`), and the URL its endpoint event names; Refused saying what is missing or
    refused."""
    resp = await http.get(url, headers={**headers, "Accept": mcp.CT_SSE}, allow_redirects=False)
    if resp.status != 200 or resp.content_type != mcp.CT_SSE:
        resp.release()
        raise Refused(f"offers no HTTP+SSE stream (HTTP {resp.status})")
    events = EventReader(max_bytes, part).events(resp)
    try:
        async for event, data in events:
            if event == "endpoint":
                return resp, events, same_origin(url, urljoin(url, data.decode().strip()))
        raise Refused("its SSE stream named no endpoint")
    except BaseException:
        await events.aclose()
        resp.release()
        raise


def same_origin(configured: str, endpoint: str) -> str:
    """`endpoint`, if it has the configured URL's scheme, host and port: the gateway's
    headers for this upstream (credentials among them) go nowhere else (the MCP SDKs refuse
    another origin too); Refused otherwise."""
    origin = URL(endpoint).origin()
    if origin != URL(configured).origin():
        raise Refused("its endpoint event names another origin, where the gateway does not "
                      "post", detail=f"endpoint event named {origin}")
    return endpoint


async def pump(resp: aiohttp.ClientResponse, events: Events,
               on_message: Callable[[bytes], object], on_end: Callable[[], None]) -> None:
    """Every message event of the stream to `on_message` until it ends; then `on_end`."""
    try:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async for event, data in events:
                if event == "message":
                    on_message(data)
                elif event == TOO_LARGE:  # whose call it was is in what was not kept
                    log.warning("upstream.message_too_large", transport="http+sse")
    finally:
        await events.aclose()
        resp.release()
        on_end()
