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
    reader = EventReader()
    await read(await serve(aiohttp_server, b"retry: " + retry + b"\n\n"), reader)
    assert reader.retry_s == expected_s


async def test_news_are_messages_and_new_ids_not_a_repeated_id(aiohttp_server) -> None:
    reader = EventReader()
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
    reader = EventReader()
    url = await serve(aiohttp_server, b"id: " + bad + b"\ndata: {\"n\": 1}\n\n")
    assert await read(url, reader) == [b'{"n": 1}']
    assert reader.last_id is None
