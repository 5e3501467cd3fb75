"""A request's related-task reference (downstream/references.py), alone: it stays only for
a task its sender created (the engine's, found for that owner, or the upstream's own that
the sender made); any other (Bob naming Alice's task, an unknown or malformed id) is
stripped as if it named none, the rest of `_meta` kept."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.downstream.references import NO_TASK, own_references, reference
from gateway.tasks.engine import TaskEngine
from gateway.tasks.model import Task, new_id
from gateway.tasks.store import StoreBounds
from gateway.tasks.store.memory import MemoryStore

RELATED = "io.modelcontextprotocol/related-task"


def naming(task_id: Any, **meta: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "echo", "_meta": {RELATED: {"taskId": task_id}, **meta}}}


@pytest.fixture
async def engine_with_alices() -> tuple[TaskEngine, str]:
    store = MemoryStore(StoreBounds.given(10, 10, 1000, 10_000))
    task = Task(new_id(), "alice", "echo", "core", 60_000, 500)
    await store.create(task)
    return TaskEngine(store), task.id


async def test_a_reference_to_ones_own_task_stays(engine_with_alices) -> None:
    engine, alices = engine_with_alices
    msg = naming(alices)
    assert await own_references(msg, "alice", lambda _: False, engine, "main") is msg
    assert reference(msg) == alices


@pytest.mark.parametrize("named", ["made-up", 7, None, {"nested": 1}])
async def test_another_or_no_such_task_is_stripped(engine_with_alices, named) -> None:
    engine, alices = engine_with_alices
    for msg, who in ((naming(alices, progressToken="p"), "bob"),
                     (naming(named, progressToken="p"), "alice")):
        sent = await own_references(msg, who, lambda _: False, engine, "main")
        assert reference(sent) is NO_TASK
        assert sent["params"]["_meta"] == {"progressToken": "p"}  # the rest stays
        assert reference(msg) is not NO_TASK  # the client's message is left as it came


async def test_the_upstreams_own_task_stays_for_its_creator(engine_with_alices) -> None:
    engine, _ = engine_with_alices
    msg = naming("server-task-1")
    kept = await own_references(msg, "bob", lambda task_id: task_id == "server-task-1",
                                engine, "main")
    assert reference(kept) == "server-task-1"
    alone = naming("server-task-2")  # its only `_meta` key: `_meta` goes with it
    assert "_meta" not in (await own_references(alone, "bob", lambda _: False, engine,
                                                "main"))["params"]


async def test_a_message_naming_no_task_is_left_alone(engine_with_alices) -> None:
    engine, _ = engine_with_alices
    msg = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    assert await own_references(msg, "bob", lambda _: False, engine, "main") is msg
    assert msg == {"jsonrpc": "2.0", "id": 1, "method": "ping"}
