"""Resuming a call's answer stream (gateway/upstream/resumption.py) against a real aiohttp
server that scripts its resumed streams: the GET carries the last event id, after the
server's `retry`; a server that primes new ids is followed past the stall bound, one that
brings nothing is given up after STALLED_RESUMES; a refusal gives up at once, a 5xx is
tried again; a stream with no event id is not resumed."""

from __future__ import annotations

import time
from collections.abc import Callable
from itertools import pairwise

import aiohttp
import pytest
from aiohttp import web

from gateway.upstream import sse_client
from gateway.upstream.resumption import GaveUp, Resumption
from gateway.upstream.sse_client import EventReader

ANSWER = b'{"jsonrpc": "2.0", "id": 1, "result": {}}'
CALL = object()  # the call whose stream is resumed: only passed through


class Waiting:
    """The link as a resumption sees it: the call waits until its answer comes."""

    name = "main"

    def __init__(self) -> None:
        self.got: list[tuple[bytes, object]] = []

    def pending(self, _call: object) -> bool:
        return all(data != ANSWER for data, _ in self.got)

    def on_message(self, data: bytes | memoryview, via: object = None) -> bool:
        self.got.append((bytes(data), via))
        return True


class Server:
    """Answers the n-th resume with `script(n)`: a status and an event stream's body;
    keeps each GET's Last-Event-ID and when it came."""

    def __init__(self, script: Callable[[int], tuple[int, bytes]]) -> None:
        self.script = script
        self.asked: list[tuple[str | None, float]] = []

    async def get(self, request: web.Request) -> web.Response:
        self.asked.append((request.headers.get("Last-Event-ID"), time.monotonic()))
        status, body = self.script(len(self.asked))
        return web.Response(status=status, body=body, content_type="text/event-stream")

    @property
    def ids(self) -> list[str | None]:
        return [last for last, _ in self.asked]


async def resume(aiohttp_server, server: Server, reader: EventReader
                 ) -> tuple[GaveUp | None, Waiting, float]:
    """Resume `reader`'s stream from `server`: what the resumption said, what the link got,
    and when it began."""
    app = web.Application()
    app.router.add_get("/mcp", server.get)
    url = str((await aiohttp_server(app)).make_url("/mcp"))
    link = Waiting()
    async with aiohttp.ClientSession() as http:
        began = time.monotonic()
        gave_up = await Resumption("main", link, http, url, dict).resume(  # type: ignore[arg-type]
            reader, CALL)  # type: ignore[arg-type]
    return gave_up, link, began


def cut(last_id: str | None, retry_ms: int = 1000) -> EventReader:
    """A reader as a POST's stream cut after event `last_id` leaves it, the server's
    `retry` read."""
    reader = EventReader(1 << 20)
    reader.last_id, reader.retry_s = last_id, retry_ms / 1000
    return reader


async def test_a_cut_stream_is_resumed_with_its_last_event_id_after_the_retry(
        aiohttp_server) -> None:
    server = Server(lambda _: (200, b"id: 2\ndata: " + ANSWER + b"\n\n"))
    gave_up, link, began = await resume(aiohttp_server, server, cut("1", retry_ms=300))
    assert gave_up is None
    assert link.got == [(ANSWER, CALL)]  # the call's own stream: its answer, as its
    assert server.ids == ["1"]
    assert server.asked[0][1] - began >= 0.3  # the server's retry, honoured


async def test_a_server_polling_with_new_ids_is_followed_past_the_stall_bound(
        aiohttp_server) -> None:
    """SEP-1699 polling: each resumed stream primes a new id and ends; the answer comes on
    the last. Every resume carries the id the one before gave, and the `retry` it set."""
    polls = sse_client.STALLED_RESUMES + 2

    def script(n: int) -> tuple[int, bytes]:
        if n < polls:
            return 200, f"id: {n + 1}\nretry: 150\ndata: \n\n".encode()
        return 200, b"data: " + ANSWER + b"\n\n"

    server = Server(script)
    gave_up, link, _ = await resume(aiohttp_server, server, cut("1", retry_ms=100))
    assert gave_up is None and link.got == [(ANSWER, CALL)]
    assert server.ids == [str(n) for n in range(1, polls + 1)]
    gaps = [b - a for (_, a), (_, b) in pairwise(server.asked)]
    assert min(gaps) >= 0.15


async def test_resumes_that_bring_nothing_are_given_up_after_the_bound(aiohttp_server
                                                                       ) -> None:
    server = Server(lambda _: (200, b"id: 1\ndata: \n\n"))  # the same id: nothing new
    gave_up, link, _ = await resume(aiohttp_server, server, cut("1", retry_ms=0))
    assert gave_up is not None and gave_up.refusal is None
    assert f"{sse_client.STALLED_RESUMES} resumes with Last-Event-ID in a row brought " \
        "nothing" in gave_up.why
    assert server.ids == ["1"] * sse_client.STALLED_RESUMES
    assert link.got == []


@pytest.mark.parametrize("status", [400, 404])
async def test_a_refused_resume_is_given_up_at_once_with_its_answer(aiohttp_server,
                                                                    status: int) -> None:
    server = Server(lambda _: (status, b"Bad Request: No valid session ID provided"))
    gave_up, _, _ = await resume(aiohttp_server, server, cut("1", retry_ms=0))
    assert gave_up is not None and gave_up.refusal is not None
    assert gave_up.why == f"refused to resume the answer's stream (HTTP {status})"
    assert (gave_up.refusal.status, gave_up.refusal.body) == (
        status, b"Bad Request: No valid session ID provided")  # the POST judges the session
    assert len(server.asked) == 1


async def test_a_5xx_is_tried_again_as_a_resume_that_brought_nothing(aiohttp_server
                                                                     ) -> None:
    server = Server(lambda n: (503, b"") if n < 3 else (200, b"data: " + ANSWER + b"\n\n"))
    gave_up, link, _ = await resume(aiohttp_server, server, cut("1", retry_ms=0))
    assert gave_up is None and link.got == [(ANSWER, CALL)]
    assert server.ids == ["1", "1", "1"]


async def test_a_stream_with_no_event_id_is_not_resumed(aiohttp_server) -> None:
    server = Server(lambda _: (200, b"data: " + ANSWER + b"\n\n"))
    gave_up, _, _ = await resume(aiohttp_server, server, cut(None))
    assert gave_up is not None and "with no event id to resume it from" in gave_up.why
    assert server.asked == []
