"""The 2025-11-25 core task dialect's wire shapes: pure units over a real store and engine."""

from __future__ import annotations

import pytest
from test_task_store import Clock

from gateway import errors
from gateway.tasks.dialects import core
from gateway.tasks.engine import TaskEngine
from gateway.tasks.model import Status
from gateway.tasks.store import TaskStore


def engine_with(n: int, clock: Clock) -> TaskEngine:
    engine = TaskEngine(TaskStore(1000, 1000, 1 << 20, 1 << 24, clock=clock))
    for i in range(n):
        clock.now += 1
        engine.store.add("me", "tool", core.NAME, 1000 * (100 + i), 500)
    engine.store.add("someone else", "tool", core.NAME, None, 500)
    engine.store.add("me", "tool", "extension", None, 500)  # another dialect: never listed
    return engine


def test_pages_survive_tasks_expiring_between_them() -> None:
    clock = Clock()
    engine = engine_with(core.PAGE_SIZE + 5, clock)
    first = core.list_page(engine, {}, "me")
    shown = [t["taskId"] for t in first["tasks"]]
    assert len(shown) == core.PAGE_SIZE and first["tasks"][0]["ttl"] == 100_000
    clock.now += 145  # task i expires at 101 + 2i s: the 50 shown are gone, the cursor holds
    second = core.list_page(engine, {"cursor": first["nextCursor"]}, "me")
    assert len(engine.store.owned_by("me")) == 5 + 1  # they did expire
    assert len(second["tasks"]) == 5 and "nextCursor" not in second
    assert not set(shown) & {t["taskId"] for t in second["tasks"]}
    with pytest.raises(errors.InvalidParams):
        core.list_page(engine, {"cursor": "%%%"}, "me")


def test_final_message_per_status() -> None:
    engine = engine_with(1, Clock())
    task = next(iter(engine.store.owned_by("me")))
    task.result = {"content": [], "_meta": {"keep": 1}}
    task.move(Status.FAILED)  # isError results fail the task yet are returned as results
    final = core.final(task, 7)
    assert final["result"]["_meta"] == {"keep": 1, core.RELATED_TASK: {"taskId": task.id}}
    task.result, task.error = None, {"code": -32000, "message": "boom"}
    assert core.final(task, 7)["error"] == {"code": -32000, "message": "boom"}
