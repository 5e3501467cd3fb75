"""answer_bytes.py with an HTTP upstream's readers (issue 41, F2): an answer read in part is
counted under its call's principal as it comes (http_post.py read_body and _json_lines,
sse_client.py EventReader), refused past that principal's share by the rules of a whole
answer, and given back as it is handed on (the exchange's Hold then takes it: counted once)
or dropped."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable

import aiohttp
import pytest
from aiohttp import web

from gateway.answer_bytes import AnswerBytes, Partial
from gateway.errors import AnswersOverBudget
from gateway.upstream import http_post
from gateway.upstream.sse_client import EventReader

MIB = 1 << 20
UPSTREAM = "upstream main"


class Body:
    """What the readers read of an aiohttp response: its length, its content chunk by chunk;
    `seen` holds what the budget counted as each chunk was read on."""

    def __init__(self, chunks: list[bytes], budget: AnswerBytes, length: bool = False) -> None:
        self.content = self
        self.chunks, self.budget = chunks, budget
        self.content_length = sum(map(len, chunks)) if length else None
        self.seen: list[int] = []

    async def iter_any(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            self.seen.append(self.budget.total)
            yield chunk


def answer(size: int) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": 1, "result": {"t": "x" * size}}).encode()


def cut(data: bytes, parts: int) -> list[bytes]:
    step = -(-len(data) // parts)
    return [data[i:i + step] for i in range(0, len(data), step)]


def held_on(budget: AnswerBytes, owner: str, got: list[int]) -> Callable[[bytes], bool]:
    """A delivery as the exchange takes an answer (exchange.py `held`): its Hold takes it
    whole; `got` hears what the budget held then."""
    def deliver(msg: bytes) -> bool:
        budget.hold(owner).take(len(msg))
        got.append(budget.total)
        return True
    return deliver


# -- the rules, on a Partial ----------------------------------------------------------------
def test_an_answer_read_in_part_is_taken_whole_when_it_is_all_its_principal_holds() -> None:
    budget = AnswerBytes(16 * MIB, 8 * MIB)
    part = budget.partial("bob", UPSTREAM)
    part.count(5 * MIB)
    part.count(12 * MIB)  # past the share: one answer of any size reaches a reader
    assert budget.held == {"bob": 12 * MIB}
    part.count(0)
    assert budget.total == 0 and not budget.held


def test_past_its_share_with_others_held_the_reading_is_refused_and_gives_back() -> None:
    budget = AnswerBytes(16 * MIB, 8 * MIB)
    budget.take("bob", 3 * MIB)  # an answer of Bob's not yet written
    part = budget.partial("bob", UPSTREAM)
    part.count(4 * MIB)
    with pytest.raises(AnswersOverBudget, match="max_inflight_bytes_per_principal") as over:
        part.count(6 * MIB)
    assert over.value.data == {"limit": "limits.max_inflight_bytes_per_principal",
                               "maxBytes": 8 * MIB, "heldBytes": 7 * MIB}
    assert budget.held["bob"] == 7 * MIB  # it holds what it held: the reader gives it back
    part.count(0)
    assert budget.held == {"bob": 3 * MIB}


def test_past_the_overall_bound_the_principal_over_its_share_is_refused() -> None:
    """16 MiB in all: Bob's two answers read in part meet the bound when they take the
    total past it and him past his fair share (8 MiB: two principals hold answers);
    Alice, under hers, never does."""
    budget = AnswerBytes(16 * MIB, 16 * MIB)
    budget.take("alice", 6 * MIB)
    first, second = budget.partial("bob", UPSTREAM), budget.partial("bob", UPSTREAM)
    first.count(8 * MIB)
    second.count(MIB)
    with pytest.raises(AnswersOverBudget, match=r"limits\.max_inflight_bytes \("):
        second.count(3 * MIB)
    budget.partial("alice", UPSTREAM).count(MIB + 1)  # past 16 MiB; Alice holds 7
    assert budget.total == 16 * MIB + 1


def test_an_answer_of_no_principals_call_is_counted_under_its_upstream_never_refused() -> None:
    budget = AnswerBytes(4 * MIB, 2 * MIB)
    budget.take("bob", 2 * MIB)
    handshake = budget.partial(None, UPSTREAM)
    handshake.count(6 * MIB)
    assert budget.held == {"bob": 2 * MIB} and budget.reading_now == {UPSTREAM: 6 * MIB}
    assert budget.total == 8 * MIB
    handshake.count(0)
    assert budget.total == 2 * MIB and not budget.reading_now


# -- the readers -----------------------------------------------------------------------------
@pytest.mark.parametrize("length", [True, False])
async def test_a_json_answer_is_counted_as_it_comes_and_handed_on_counted_once(
        length: bool) -> None:
    """A 6 MiB answer to Bob, whose share is 8 MiB: counted chunk by chunk as it is read
    (with a length, or chunked), then given back as it is handed on, so the exchange's Hold
    takes it whole (counted twice, 12 MiB, it would be refused)."""
    budget, got = AnswerBytes(16 * MIB, 8 * MIB), []
    data = answer(6 * MIB)
    body = Body(cut(data, 6), budget, length)
    part = budget.partial("bob", UPSTREAM)
    assert await http_post.json_body(body, held_on(budget, "bob", got),  # type: ignore[arg-type]
                                     8 * MIB, part)
    assert body.seen == [0, *(len(data) * n // 6 for n in range(1, 6))]
    assert got == [len(data)] and part.size == 0


async def test_a_json_answer_past_its_principals_share_stops_being_read() -> None:
    budget = AnswerBytes(16 * MIB, 8 * MIB)
    budget.take("bob", 4 * MIB)
    body = Body(cut(answer(6 * MIB), 6), budget)
    part = budget.partial("bob", UPSTREAM)
    with pytest.raises(AnswersOverBudget):
        await http_post.json_body(body, lambda _: True, 8 * MIB, part)  # type: ignore[arg-type]
    assert len(body.seen) == 4  # the 4th chunk takes Bob past 8 MiB: none read after it
    part.count(0)  # as the POST's reading ends (http_post.py `_bounded`)
    assert budget.held == {"bob": 4 * MIB}


async def test_an_sse_event_is_counted_as_it_comes_and_given_back_as_it_is_handed_on() -> None:
    budget, got = AnswerBytes(16 * MIB, 8 * MIB), []
    data = answer(6 * MIB)
    chunks = cut(b"id: 1\n\n" + b"data: " + data + b"\n\n", 6)
    body = Body(chunks, budget)
    reader = EventReader(8 * MIB, budget.partial("bob", UPSTREAM))
    deliver = held_on(budget, "bob", got)
    async for _, message in reader.events(body):  # type: ignore[arg-type]
        deliver(message)
    read = [len(b"".join(chunks[:n])) - len(b"id: 1\n\n") for n in range(1, 6)]
    assert body.seen[1:] == read
    assert got == [len(data)] and reader.part.size == 0


async def test_an_sse_stream_past_its_principals_share_ends_and_gives_back() -> None:
    budget = AnswerBytes(16 * MIB, 8 * MIB)
    budget.take("bob", 4 * MIB)
    body = Body(cut(b"data: " + answer(6 * MIB) + b"\n\n", 6), budget)
    reader = EventReader(8 * MIB, budget.partial("bob", UPSTREAM))
    with pytest.raises(AnswersOverBudget):
        _ = [event async for event in reader.events(body)]  # type: ignore[arg-type]
    assert len(body.seen) == 4 and budget.held == {"bob": 4 * MIB}


async def test_an_sse_line_too_long_ends_the_stream_uncounted() -> None:
    budget = AnswerBytes(16 * MIB, 8 * MIB)
    body = Body([b"data: " + b"x" * MIB] * 3, budget)
    reader = EventReader(2 * MIB, budget.partial("bob", UPSTREAM))
    assert [event async for event, _ in reader.events(body)] == [  # type: ignore[arg-type]
        "gateway:too-large"]
    assert body.seen == [0, MIB + 6, 2 * (MIB + 6)] and budget.total == 0


# -- a refusal's body ------------------------------------------------------------------------
async def refused(aiohttp_server, body: bytes, content_type: str, budget: AnswerBytes
                  ) -> tuple[bytes | None, Partial]:
    async def bad(_: web.Request) -> web.Response:
        return web.Response(status=400, body=body, content_type=content_type)

    app = web.Application()
    app.router.add_post("/", bad)
    server = await aiohttp_server(app)
    part = budget.partial("bob", UPSTREAM)
    async with aiohttp.ClientSession() as http, http.post(server.make_url("/")) as resp:
        return await http_post.refusal(resp, 8 * MIB, part), part


async def test_a_400_not_json_is_read_only_for_a_word_of_the_session(aiohttp_server) -> None:
    budget = AnswerBytes(16 * MIB, 8 * MIB)
    said, _ = await refused(aiohttp_server, b"<p>" + b"x" * MIB, "text/html", budget)
    assert said is not None and len(said) == http_post.SESSION_WORDS
    short, _ = await refused(aiohttp_server, b"no such session", "text/plain", budget)
    assert short == b"no such session"


async def test_a_400_of_json_is_read_whole_and_counted_until_handed_on(aiohttp_server) -> None:
    budget = AnswerBytes(16 * MIB, 8 * MIB)
    error = json.dumps({"jsonrpc": "2.0", "id": 1, "error": {
        "code": -32000, "message": "x" * MIB}}).encode()
    said, part = await refused(aiohttp_server, error, "application/json", budget)
    assert said == error and budget.held == {"bob": len(error)}
    part.count(0)
    assert budget.total == 0
