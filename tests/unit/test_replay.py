"""The replay budget bounds what every legacy session's streams keep together (issue 29): a
principal over it loses its own oldest replay first, a reader's unwritten events stay, and
an answered stream's events go once their linger passed."""

from __future__ import annotations

import asyncio
from collections import Counter

from gateway.downstream.replay import ReplayBudget
from gateway.downstream.session import MAX_STREAMS, Session
from gateway.downstream.sse import Stream
from gateway.upstream.connection import Connection
from gateway.upstream.mock import MockTransport

KIB = b"x" * 1000


def stream(budget: ReplayBudget, principal: str, key: str = "1") -> Stream:
    s = Stream(key, replay=100, max_bytes=1 << 20)
    budget.enter(s, principal)
    return s


def test_over_the_budget_the_same_principals_oldest_replay_goes_first() -> None:
    budget = ReplayBudget(limit=3000, linger_s=60)
    alice = stream(budget, "alice")
    alice.push(KIB)  # the oldest of all, and nobody reads it: Bob's flood leaves it
    bobs = [stream(budget, "bob", str(n)) for n in range(3)]
    for b in bobs:
        b.push(KIB)
    assert budget.bytes == 3000 and [len(b.buffer) for b in bobs] == [0, 1, 1]
    assert alice.since(0) == [(1, KIB)]
    assert budget.bytes == sum(s.bytes for s in (alice, *bobs))


def test_a_principal_over_its_share_sheds_its_own_under_the_budget() -> None:
    budget = ReplayBudget(limit=1 << 20, linger_s=60, per_principal=2000)
    alice = stream(budget, "alice")
    alice.push(KIB)
    bobs = [stream(budget, "bob", str(n)) for n in range(3)]
    for b in bobs:
        b.push(KIB)
    assert [len(b.buffer) for b in bobs] == [0, 1, 1] and len(alice.buffer) == 1
    assert budget.bytes_of == {"alice": 1000, "bob": 2000} and budget.bytes == 3000
    bobs[2].push(b"y" * 2500)  # more than his share alone: his newest stays, Alice's too
    assert [len(b.buffer) for b in bobs] == [0, 0, 1] and len(alice.buffer) == 1
    assert budget.bytes_of == {"alice": 1000, "bob": 2500}


def test_the_pushing_streams_own_older_events_go_before_anothers() -> None:
    budget = ReplayBudget(limit=3000, linger_s=60)
    alice = stream(budget, "alice")
    alice.push(KIB)
    bob = stream(budget, "bob")
    for _ in range(4):
        bob.push(KIB)
    assert [seq for seq, _ in bob.buffer] == [3, 4] and len(alice.buffer) == 1
    bob.push(b"y" * 2500)  # alone over what is left: the newest stays, then others give way
    assert [seq for seq, _ in bob.buffer] == [5] and not alice.buffer
    assert budget.bytes == 2500


def test_events_a_reader_has_not_been_sent_are_never_shed() -> None:
    budget = ReplayBudget(limit=2000, linger_s=60)
    read = stream(budget, "alice")
    read.writer = object()  # a connection is reading it
    read.push(KIB)
    read.push(KIB)
    read.sent = 1  # the first was written, the second not yet
    other = stream(budget, "alice", "2")
    other.push(KIB)
    assert [seq for seq, _ in read.buffer] == [2] and budget.bytes == 2000


async def test_an_answered_streams_replay_goes_after_its_linger() -> None:
    budget = ReplayBudget(limit=1 << 20, linger_s=0.05)
    answered = stream(budget, "alice")
    answered.push(KIB, last=True)
    answered.sent = answered.seq
    budget.delivered(answered)
    waiting = stream(budget, "alice", "2")
    waiting.push(KIB)  # not answered yet: kept
    assert budget.bytes == 2000
    await asyncio.sleep(0.15)
    assert budget.bytes == 1000 and not answered.buffer and waiting.buffer


def test_a_session_gives_its_bytes_back_when_its_streams_go() -> None:
    budget = ReplayBudget(limit=1 << 30, linger_s=60)
    conn = Connection("mock", lambda link: MockTransport(link, lambda _: []), 1.0,
                      Counter())  # never started
    session = Session(conn, "2025-11-25", {}, 10, principal="alice", budget=budget)
    first = session.new_stream()
    first.push(KIB)
    for _ in range(MAX_STREAMS):
        session.new_stream().push(b"y")
    assert session.find_stream(first.key) is None and budget.bytes == MAX_STREAMS
    session.get_stream.push(KIB)
    session.close_streams()
    assert budget.bytes == 0
