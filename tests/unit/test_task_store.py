"""The task model, its bounded store and per-tool policy: pure units, no I/O."""

from __future__ import annotations

import tracemalloc

import pytest

from gateway.settings import Tasks
from gateway.tasks.model import TRANSITIONS, InvalidTransition, Status, Task, iso
from gateway.tasks.policy import Policies
from gateway.tasks.store import ResultTooLarge, StoreFull, TaskExpired, TaskNotFound, TaskStore


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def task(status: Status = Status.WORKING) -> Task:
    return Task("t", "owner", "tool", "extension", 1000, 500, status=status)


@pytest.mark.parametrize("start", list(Status))
@pytest.mark.parametrize("end", list(Status))
def test_only_the_spec_transitions_are_allowed(start: Status, end: Status) -> None:
    t = task(start)
    allowed = {Status.WORKING: {"input_required", "completed", "failed", "cancelled"},
               Status.INPUT_REQUIRED: {"working", "completed", "failed", "cancelled"}}
    if end in allowed.get(start, set()):
        t.move(end, "why")
        assert (t.status, t.status_message) == (end, "why")
    else:
        with pytest.raises(InvalidTransition):
            t.move(end)
    assert TRANSITIONS[Status.COMPLETED] == frozenset()


def test_timestamps_are_iso_utc() -> None:
    assert iso(0) == "1970-01-01T00:00:00.000Z"
    t = task()
    before = t.updated_at
    t.move(Status.INPUT_REQUIRED)
    assert t.updated_at >= before >= t.created_at


def make_store(clock: Clock, **limits: int) -> TaskStore:
    bounds = {"max_tasks": 3, "max_per_owner": 2, "max_result_bytes": 100,
              "max_stored_bytes": 150, **limits}
    return TaskStore(**bounds, clock=clock)


def test_store_bounds_refuse_and_never_evict_live_tasks() -> None:
    clock = Clock()
    store = make_store(clock)
    a1 = store.add("a", "tool", "extension", 10_000, 500)
    store.add("a", "tool", "extension", 10_000, 500)
    with pytest.raises(StoreFull, match="this client"):
        store.add("a", "tool", "extension", 10_000, 500)
    store.add("b", "tool", "extension", 10_000, 500)
    with pytest.raises(StoreFull, match="maximum of 3"):
        store.add("c", "tool", "extension", 10_000, 500)
    assert store.get(a1.id, "a") is a1  # still there: nothing live was evicted
    clock.now += 11
    store.add("c", "tool", "extension", 10_000, 500)  # expired ones made room
    assert len(store) == 1


def test_ids_are_unguessable_and_foreign_ids_look_unknown() -> None:
    store = make_store(Clock(), max_tasks=100, max_per_owner=100)
    ids = {store.add("a", "tool", "extension", None, 500).id for _ in range(50)}
    assert len(ids) == 50 and all(len(i) >= 22 for i in ids)  # >= 128 random bits
    some = next(iter(ids))
    with pytest.raises(TaskNotFound):
        store.get(some, "b")
    with pytest.raises(TaskNotFound):
        store.get("nope", "a")


def test_expired_tasks_say_so_for_a_while_then_are_unknown() -> None:
    clock = Clock()
    store = make_store(clock)
    t = store.add("a", "tool", "extension", 1000, 500)
    clock.now += 2
    with pytest.raises(TaskExpired):
        store.get(t.id, "a")
    with pytest.raises(TaskNotFound):
        store.get(t.id, "b")  # expired or not, a foreign id looks unknown
    clock.now += 3600
    with pytest.raises(TaskNotFound):
        store.get(t.id, "a")


def test_result_bytes_are_bounded_per_task_and_in_all() -> None:
    store = make_store(Clock())
    t1 = store.add("a", "tool", "extension", 10_000, 500)
    t2 = store.add("b", "tool", "extension", 10_000, 500)
    with pytest.raises(ResultTooLarge, match="at most 100 bytes"):
        store.keep(t1, 101)
    store.keep(t1, 100)
    with pytest.raises(ResultTooLarge, match="storage"):
        store.keep(t2, 60)
    store.keep(t2, 50)
    assert store.stored_bytes == 150


def test_a_full_store_stays_bounded_in_memory() -> None:
    clock = Clock()
    store = TaskStore(1000, 1000, 10, 10_000, clock=clock)
    tracemalloc.start()
    for round_ in range(20):
        for _ in range(1000):
            store.add(f"o{round_}", "tool", "extension", 1000, 500)
        clock.now += 2  # all expire; the next round replaces them
        if round_ == 1:
            baseline = tracemalloc.get_traced_memory()[0]
    grown = tracemalloc.get_traced_memory()[0] - baseline
    tracemalloc.stop()
    assert len(store) == 1000
    assert grown < 2 * 1024 * 1024  # 18 more rounds of 1000 tasks did not pile up


def test_policy_by_name_glob_and_upstream() -> None:
    tasks = Tasks.model_validate({
        "defaults": {"mode": "auto", "sync_budget_ms": 1000, "max_ttl_ms": 60_000},
        "tools": {"echo": {"mode": "never"}, "long*": {"mode": "always",
                                                       "poll_interval_ms": 2000}}})
    local = Tasks.model_validate({"defaults": {"sync_budget_ms": 10},
                                  "tools": {"longest": {"mode": "required"}}})
    policies = Policies(tasks, {"main": local, "other": None})
    assert policies.for_tool("other", "echo").mode == "never"
    long_op = policies.for_tool("other", "longRunning")
    assert (long_op.mode, long_op.poll_interval_ms) == ("always", 2000)
    assert policies.for_tool("other", "x").sync_budget_ms == 1000
    assert policies.for_tool("main", "x").sync_budget_ms == 10
    assert policies.for_tool("main", "longest").mode == "required"
    assert policies.for_tool("main", "longer").mode == "always"
    assert long_op.ttl(None) == 60_000 and long_op.ttl(10) == 10
    assert long_op.ttl(10**9) == 60_000  # clamped to max_ttl_ms


def test_poll_interval_learns_from_durations() -> None:
    from gateway.tasks.engine import TaskEngine

    engine = TaskEngine(TaskStore(10, 10, 100, 1000))
    assert engine.suggest_poll_ms("t", 1000) == 1000  # no history: the policy's value
    engine.durations["t"].extend([0.1, 0.1])
    assert engine.suggest_poll_ms("t", 1000) == 1000  # too little history still
    engine.durations["t"].append(0.1)
    assert engine.suggest_poll_ms("t", 1000) == 250  # quick tool: the floor, never below
    engine.durations["slow"].extend([8.0, 12.0, 10.0])
    assert engine.suggest_poll_ms("slow", 1000) == 2500  # a quarter of the median
    engine.durations["slower"].extend([600.0] * 3)
    assert engine.suggest_poll_ms("slower", 1000) == 30_000  # capped
