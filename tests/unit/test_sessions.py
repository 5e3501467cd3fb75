"""The legacy session store's bounds belong to the principal (issue 29): at a bound the
newcomer's own least recently used idle session makes room, never another principal's, and
never a session whose task still runs; else the newcomer is refused."""

from __future__ import annotations

import time

import pytest

from gateway.downstream.session import Session, SessionStore, SessionTask
from gateway.errors import TooManySessions
from gateway.observability.counters import Counters
from gateway.tasks.engine import TaskEngine
from gateway.tasks.model import Task, new_id
from gateway.tasks.store import StoreBounds
from gateway.tasks.store.memory import MemoryStore
from gateway.upstream.connection import Connection
from gateway.upstream.mock import MockTransport


def session(principal: str) -> Session:
    """A session on an upstream connection that was never started (none is needed here)."""
    conn = Connection("mock", lambda link: MockTransport(link, lambda _: []), 1.0, Counters())
    return Session(conn, "2025-11-25", {}, 0, principal=principal)


def running_task(s: Session) -> None:
    """A core task of `s` that has not ended (what `session.tasks` holds while it runs)."""
    engine = TaskEngine(MemoryStore(StoreBounds.given(10, 10, 100, 1000)))
    task = Task(new_id(), s.owner, "sleep", "core", 60_000, 500, quota=s.principal)
    s.tasks[task.id] = SessionTask(engine, s, task, relay_progress=False)


def test_at_the_global_bound_the_newcomers_own_idle_session_makes_room() -> None:
    store = SessionStore(max_sessions=3, idle_s=60, per_principal=10)
    alice = session("alice")
    store.add(alice)  # the least recently used of all, and idle
    bob1, bob2 = session("bob"), session("bob")
    store.add(bob1)
    store.add(bob2)
    assert store.add(session("bob")) is bob1  # Bob's own oldest, not Alice's
    assert store.get(alice.id, "alice") is alice and store.get(bob1.id, "bob") is None


def test_a_principal_with_nothing_idle_is_refused_and_nobody_is_evicted() -> None:
    store = SessionStore(max_sessions=3, idle_s=60, per_principal=10)
    alice = session("alice")
    store.add(alice)
    bobs = [session("bob"), session("bob")]
    for s in bobs:
        store.add(s)
        running_task(s)
    with pytest.raises(TooManySessions, match="none of this client's is idle"):
        store.add(session("bob"))
    with pytest.raises(TooManySessions):  # Alice's newcomer takes nothing of Bob's either
        store.add(session("carol"))
    assert [s.principal for s in store.all()] == ["alice", "bob", "bob"]


def test_a_principal_holds_at_most_its_share() -> None:
    store = SessionStore(max_sessions=100, idle_s=60, per_principal=2)
    first, second = session("bob"), session("bob")
    store.add(first)
    store.add(second)
    running_task(first)
    assert store.add(session("bob")) is second  # the idle one, though more recent
    running_task(store.all()[-1])
    running_task(store.all()[-2])
    with pytest.raises(TooManySessions, match="at most 2") as refused:
        store.add(session("bob"))
    assert refused.value.http_status == 503 and refused.value.data == {"maxSessions": 2}
    store.add(session("alice"))  # another principal is not held back by Bob's share


def test_a_session_whose_task_runs_never_ends_idle() -> None:
    store = SessionStore(max_sessions=10, idle_s=60)
    busy, quiet = session("alice"), session("alice")
    store.add(busy)
    store.add(quiet)
    running_task(busy)
    busy.last_seen = quiet.last_seen = time.monotonic() - 120
    assert store.expired() == [quiet]
    assert store.all() == [busy]


def test_another_principal_presenting_the_id_neither_gets_nor_keeps_the_session_alive() -> None:
    """Bob holding Alice's session id gets what an unknown id gets, and his requests do not
    count as her use: her session still ends idle (and its record is not renewed)."""
    store = SessionStore(max_sessions=10, idle_s=60)
    alice = session("alice")
    store.add(alice)
    alice.last_seen = time.monotonic() - 120
    assert store.get(alice.id, "bob") is None
    assert store.get("never-made", "bob") is None
    assert store.expired() == [alice]
