"""Reading an upstream's SSE streams (gateway/upstream/sse_client.py) from a real aiohttp
server: a server's `retry` is held to its bounds, and a reader counts what moved it on (a
message, a new event id), not what repeats."""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp import web

from gateway.upstream import sse_client
from gateway.upstream.sse_client import EventReader


async def serve(aiohttp_server, body: bytes) -> str:
    async def stream(_: web.Request) -> web.Response:
        return web.Response(body=body, content_type="text/event-stream")

    app = web.Application()
    app.router.add_get("/", stream)
    return str((await aiohttp_server(app)).make_url("/"))


async def read(url: str, reader: EventReader) -> list[bytes]:
    got: list[bytes] = []
    async with aiohttp.ClientSession() as http:
        await sse_client.follow(http, url, {}, reader, lambda data, _: got.append(data), None)
    return got


@pytest.mark.parametrize(("retry", "expected_s"), [
    (b"0", sse_client.RETRY_MIN_S), (b"2500", 2.5), (b"86400000", sse_client.RETRY_MAX_S)])
async def test_a_servers_retry_is_held_to_its_bounds(aiohttp_server, retry: bytes,
                                                    expected_s: float) -> None:
    reader = EventReader(1 << 20)
    await read(await serve(aiohttp_server, b"retry: " + retry + b"\n\n"), reader)
    assert reader.retry_s == expected_s


async def test_news_are_messages_and_new_ids_not_a_repeated_id(aiohttp_server) -> None:
    reader = EventReader(1 << 20)
    url = await serve(aiohttp_server, b"id: 1\ndata: \n\nid: 1\ndata: \n\ndata: {}\n\n")
    assert await read(url, reader) == [b"{}"]
    assert (reader.last_id, reader.news) == ("1", 2)  # id 1 once, one message
    await read(await serve(aiohttp_server, b"id: 1\ndata: \n\n"), reader)
    assert reader.news == 2  # the same id again brings nothing


@pytest.mark.parametrize("bad", [b"\xff\xfe", b"a\rX-Evil: 1", b"a\x00b"])
async def test_a_malformed_event_id_is_ignored_not_sent_back(aiohttp_server,
                                                            bad: bytes) -> None:
    """A server's id that is not printable UTF-8 (bytes that do not decode, a bare CR that
    would smuggle a header into the resume, a NUL the SSE spec ignores) is never kept as
    the Last-Event-ID: the stream goes on, its messages read."""
    reader = EventReader(1 << 20)
    url = await serve(aiohttp_server, b"id: " + bad + b"\ndata: {\"n\": 1}\n\n")
    assert await read(url, reader) == [b'{"n": 1}']
    assert reader.last_id is None


@pytest.mark.parametrize("lines", [1, 3])
async def test_an_event_over_the_bound_is_dropped_and_the_stream_read_on(aiohttp_server,
                                                                        lines: int) -> None:
    """An event whose data passes `max_bytes` (in one line, or in several) is given as
    TOO_LARGE with nothing of it kept; the events after it come whole, and one of the bound
    exactly, in lines longer than aiohttp's default line limit (128 KiB), comes too."""
    bound = 300 * 1024
    part = b"x" * (bound // lines + 1)
    big = b"".join(b"data: " + part + b"\n" for _ in range(lines))
    fits = b"y" * bound
    url = await serve(aiohttp_server, big + b"id: 7\r\n\r\ndata: " + fits + b"\r\n\r\n"
                      b"data: {}\n\n")
    got: list[tuple[str, bytes]] = []
    async with aiohttp.ClientSession() as http, http.get(url) as resp:
        reader = EventReader(bound)
        got = [event async for event in reader.events(resp)]
    assert got == [(sse_client.TOO_LARGE, b""), ("message", fits), ("message", b"{}")]
    assert reader.last_id == "7"
    async with aiohttp.ClientSession() as http, http.get(url) as resp:
        with pytest.raises(sse_client.TooLarge):  # on a call's stream, its call fails
            await sse_client.read(EventReader(bound), resp, lambda *_: None, via="a call")
