"""A single gateway's memory store across a restart (tasks/store/snapshot.py): what comes
back, within which bounds, and that a snapshot not read or not written never stops a start
nor loses the previous file."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from structlog.testing import capture_logs

from gateway.keyring import derive
from gateway.tasks.model import Dialect, Status, Task, failure, new_id
from gateway.tasks.store import StoreBounds, snapshot
from gateway.tasks.store.memory import STOPPED, MemoryStore

RESULT = orjson.dumps({"content": [{"type": "text", "text": "été, 東京 \"quoted\"\n"}],
                       "structuredContent": {"x": 0.1, "big": 2**60, "f": 1e-7, "n": None},
                       "isError": False})


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def new_store(clock: Clock, **limits: int) -> MemoryStore:
    bounds = {"max_tasks": 10, "max_per_owner": 5, "max_result_bytes": 1000,
              "max_stored_bytes": 5000, **limits}
    return MemoryStore(StoreBounds.given(**bounds), clock=clock)


async def add(store: MemoryStore, owner: str, result: bytes | None = RESULT,
              ttl_ms: int | None = 60_000, dialect: Dialect = "extension",
              **fields: Any) -> Task:
    """A task as the engine creates it, completed with `result` unless None (then left
    running)."""
    task = Task(new_id(), owner, "tool", dialect, ttl_ms, 500, created_at=store.clock(),
                **fields)
    await store.create(task)
    if result is not None:
        done = task.ended(Status.COMPLETED, "done", now=store.clock())
        done.result, done.size = result, len(result)
        assert await store.save(done)
        return done
    return task


def unreadable(logs: list[dict[str, Any]]) -> list[str]:
    return [e["why"] for e in logs if e["event"] == "store.snapshot_unreadable"]


@pytest.fixture
def path(tmp_path: Path) -> str:
    return str(tmp_path / "tasks.snapshot")


async def test_a_finished_task_comes_back_exactly_as_it_was(path: str) -> None:
    clock = Clock()
    store = new_store(clock)
    alice = await add(store, "alice")
    clock.now += 1
    bob = await add(store, "bob-session", dialect="core", ttl_ms=None, quota="bob")
    clock.now += 1
    carol = await add(store, "carol")
    for read in (carol, alice):  # the first read first: carol's makes room before alice's
        await store.read(read.id)
    key = snapshot.key_of(path, None)
    with capture_logs() as logs:
        assert snapshot.save(store, path, key) == 3
        back = new_store(clock)
        assert snapshot.load(back, path, key) == 3
    for task in (alice, bob, carol):
        held = await back.get(task.id)
        assert held is not None and held.result == RESULT  # bytes for bytes
        assert orjson.dumps(held.record()) == orjson.dumps(task.record())
        assert (held.status, held.owner, held.ttl_ms, held.created_at, held.dialect) == (
            task.status, task.owner, task.ttl_ms, task.created_at, task.dialect)
    assert back.records()[1] == [carol.id, alice.id]
    assert back.stored_bytes() == store.stored_bytes() == 3 * len(RESULT)
    # Owners kept: another owner finds nothing of theirs.
    assert [t.id for t in await back.owned_by("alice")] == [alice.id]
    assert await back.owned_by("mallory") == []
    assert all(t.id != alice.id for t in await back.owned_by("bob-session"))
    events = [(e["event"], e.get("tasks")) for e in logs]
    assert events == [("store.snapshot_written", 3), ("store.snapshot_read", 3)]
    # Sealed at rest, and only its owner reads it.
    data = Path(path).read_bytes()
    assert data.startswith(snapshot.MAGIC) and b"alice" not in data and "東京".encode() not in data
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert key.hex() not in repr(logs) and "東京" not in repr(logs)


async def test_a_task_past_its_ttl_is_left_behind(path: str) -> None:
    clock = Clock()
    store = new_store(clock)
    gone = await add(store, "alice", ttl_ms=1000)
    kept = await add(store, "alice", ttl_ms=60_000)
    key = snapshot.key_of(path, None)
    snapshot.save(store, path, key)
    clock.now += 2  # down for two seconds
    back = new_store(clock)
    with capture_logs() as logs:
        assert snapshot.load(back, path, key) == 1
    assert await back.get(gone.id) is None and await back.get(kept.id) is not None
    assert [(e["tasks"], e["dropped"]) for e in logs] == [(1, 1)]


async def test_a_running_task_comes_back_failed_saying_the_gateway_stopped(path: str) -> None:
    clock = Clock()
    store = new_store(clock, max_per_owner=1, max_held_per_owner=2)
    running = await add(store, "alice", result=None, inputs={"k": {"method": "x"}})
    key = snapshot.key_of(path, None)
    snapshot.save(store, path, key)
    clock.now += 1
    back = new_store(clock, max_per_owner=1, max_held_per_owner=2)
    assert snapshot.load(back, path, key) == 1
    held = await back.get(running.id)
    assert held is not None and held.status is Status.FAILED
    assert held.status_message == STOPPED and held.error == failure(STOPPED)
    assert held.inputs == {} and held.updated_at == clock.now
    await add(back, "alice", result=None)  # no longer running: alice's one slot is free
    # Written down once failed: it stays failed.
    assert not await back.save(held.but(status=Status.COMPLETED))


async def test_where_a_bound_is_reached_the_newest_are_kept(path: str) -> None:
    clock = Clock()
    store = new_store(clock)
    made = []
    for owner in ("alice", "bob", "carol"):
        made.append(await add(store, owner))
        clock.now += 1
    key = snapshot.key_of(path, None)
    snapshot.save(store, path, key)
    back = new_store(clock, max_tasks=2)
    assert snapshot.load(back, path, key) == 2
    assert [t.id for t in back.records()[0]] == [made[1].id, made[2].id]


@pytest.mark.parametrize("limits", [{"max_held_per_owner": 2},
                                    {"max_bytes_per_owner": 2 * len(RESULT)},
                                    {"max_stored_bytes": 2 * len(RESULT)}])
async def test_each_bound_holds_on_load(path: str, limits: dict[str, int]) -> None:
    clock = Clock()
    store = new_store(clock)
    made = []
    for _ in range(3):
        made.append(await add(store, "alice"))
        clock.now += 1
    key = snapshot.key_of(path, None)
    snapshot.save(store, path, key)
    back = new_store(clock, **limits)
    assert snapshot.load(back, path, key) == 2
    assert [t.id for t in back.records()[0]] == [made[1].id, made[2].id]
    assert back.stored_bytes() == 2 * len(RESULT)
    await back.read(made[1].id)  # the counters are right: a read one makes room
    await add(back, "alice")
    assert await back.get(made[1].id) is None


def test_a_result_over_the_bound_of_one_result_is_left() -> None:
    clock = Clock()
    big = Task(new_id(), "alice", "tool", "extension", 60_000, 500, status=Status.COMPLETED,
               created_at=clock(), result=RESULT, size=len(RESULT))
    store = new_store(clock, max_result_bytes=len(RESULT) - 1)
    assert store.load([big], [big.id]) == 0 and store.records() == ([], [])


def test_a_snapshot_loads_into_an_empty_store_only() -> None:
    clock = Clock()
    store = new_store(clock)
    task = Task(new_id(), "alice", "tool", "extension", 60_000, 500, created_at=clock())
    assert store.load([task], []) == 1
    with pytest.raises(ValueError, match="empty"):
        store.load([task], [])


def _flipped(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 0x01]) + data[middle + 1:]


def _sealed(key: bytes, body: bytes) -> bytes:
    from gateway.keyring import Cipher

    return snapshot.MAGIC + Cipher(key).encrypt(body, snapshot.MAGIC)


def _as(body: bytes) -> Any:
    """A spoiling that seals `body` with the right key: decrypts, yet holds no snapshot."""
    return lambda data, key: (_sealed(key, body), key)


_NOT_RECORDS = orjson.dumps({"tasks": [{**Task("t", "o", "tool", "core", 10, 5).record(),
                                        "created_at": "now"}], "read": []})
# How a snapshot is spoiled ((file, key) -> (file, key) as read), and why it is not read.
SPOILED: dict[str, tuple[Any, str]] = {
    "corrupt": (lambda data, key: (_flipped(data), key), "another key or corrupt"),
    "truncated": (lambda data, key: (data[:-20], key), "another key or corrupt"),
    "cut in its first line": (lambda data, key: (data[:10], key), "missing magic"),
    "another key": (lambda data, key: (data, _flipped(key)), "another key or corrupt"),
    "another version": (lambda data, key: (b"mcp-task-gateway snapshot 2\n"
                                           + data[len(snapshot.MAGIC):], key),
                        "another version"),
    "garbage": (lambda data, key: (os.urandom(200), key), "missing magic"),
    "empty": (lambda data, key: (b"", key), "missing magic"),
    "not json": (_as(b"{not json"), "malformed"),
    "not a record": (_as(b'{"tasks": [{"id": 1}], "read": []}'), "malformed"),
    "a field of another type": (_as(_NOT_RECORDS), "malformed"),
    "read not ids": (_as(b'{"tasks": [], "read": [1]}'), "malformed"),
    "a list": (_as(b"[]"), "malformed"),
}


@pytest.mark.parametrize("spoil", list(SPOILED))
async def test_a_snapshot_not_read_is_one_warning_and_an_empty_start(path: str,
                                                                    spoil: str) -> None:
    clock = Clock()
    store = new_store(clock)
    await add(store, "alice")
    key = snapshot.key_of(path, None)
    snapshot.save(store, path, key)
    spoiled, why = SPOILED[spoil]
    data, key = spoiled(Path(path).read_bytes(), key)
    Path(path).write_bytes(data)
    back = new_store(clock)
    with capture_logs() as logs:
        assert snapshot.load(back, path, key) == 0
    assert unreadable(logs) == [why] and len(logs) == 1
    assert len(back) == 0


def test_a_directory_in_its_place_is_one_warning(tmp_path: Path) -> None:
    with capture_logs() as logs:
        assert snapshot.load(new_store(Clock()), str(tmp_path), os.urandom(32)) == 0
    assert len(unreadable(logs)) == 1 and len(logs) == 1


def test_no_snapshot_is_an_empty_start(path: str) -> None:
    with capture_logs() as logs:
        assert snapshot.load(new_store(Clock()), path, os.urandom(32)) == 0
    assert [(e["event"], e["log_level"]) for e in logs] == [("store.snapshot_none", "info")]


def test_the_key_file_is_made_0600_and_kept(path: str) -> None:
    key = snapshot.key_of(path, None)
    assert len(key) == 32
    assert stat.S_IMODE(os.stat(path + ".key").st_mode) == 0o600
    assert snapshot.key_of(path, None) == key


def test_a_key_file_of_the_wrong_size_is_replaced(path: str) -> None:
    Path(path + ".key").write_bytes(b"short")
    with capture_logs() as logs:
        key = snapshot.key_of(path, None)
    assert len(key) == 32 and Path(path + ".key").read_bytes() == key
    assert [e["event"] for e in logs] == ["store.snapshot_key_replaced"]
    assert snapshot.key_of(path, None) == key


def test_with_the_replicas_secret_no_key_lies_beside_the_file(path: str) -> None:
    key = snapshot.key_of(path, b"the replicas' shared secret, 32+")
    assert key == derive(b"the replicas' shared secret, 32+", "snapshot")
    assert not os.path.exists(path + ".key")


@pytest.mark.parametrize("fails", ["replace", "fsync", "write"])
async def test_a_failed_write_leaves_the_old_file_and_no_temporary_one(
        path: str, fails: str, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    store = new_store(clock)
    first = await add(store, "alice")
    key = snapshot.key_of(path, None)
    assert snapshot.save(store, path, key) == 1
    before = Path(path).read_bytes()
    await add(store, "alice")

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise OSError(28, "No space left on device")

    if fails == "write":
        monkeypatch.setattr(os, "fdopen", _failing_writes(os.fdopen))
    else:
        monkeypatch.setattr(os, fails, broken)
    with capture_logs() as logs:
        assert snapshot.save(store, path, key) == 0
    monkeypatch.undo()
    assert [(e["event"], e["why"]) for e in logs] == [("store.snapshot_failed",
                                                       "No space left on device")]
    assert Path(path).read_bytes() == before
    assert sorted(os.listdir(os.path.dirname(path))) == ["tasks.snapshot", "tasks.snapshot.key"]
    back = new_store(clock)
    assert snapshot.load(back, path, key) == 1 and await back.get(first.id) is not None


def _failing_writes(fdopen: Any) -> Any:
    """os.fdopen whose files fail halfway through a write."""

    class Half:
        def __init__(self, file: Any) -> None:
            self.file = file

        def __enter__(self) -> Half:
            return self

        def __exit__(self, *exc: object) -> None:
            self.file.close()

        def write(self, data: bytes) -> int:
            self.file.write(data[: len(data) // 2])
            raise OSError(28, "No space left on device")

    return lambda *args, **kwargs: Half(fdopen(*args, **kwargs))


def test_a_save_into_a_missing_directory_is_one_warning(tmp_path: Path) -> None:
    store = new_store(Clock())
    with capture_logs() as logs:
        assert snapshot.save(store, str(tmp_path / "gone" / "tasks.snapshot"),
                             os.urandom(32)) == 0
    assert [(e["event"], e["why"]) for e in logs] == [("store.snapshot_failed",
                                                       "No such file or directory")]


def test_a_key_file_others_may_read_is_used_and_said(tmp_path: Path) -> None:
    """Review of issue 48: a key file of mode 0644 sealed the snapshot without a word."""
    path = str(tmp_path / "tasks.snapshot")
    key = snapshot.key_of(path, None)
    os.chmod(path + ".key", 0o644)
    with capture_logs() as logs:
        assert snapshot.key_of(path, None) == key
    assert [e["event"] for e in logs] == ["store.snapshot_key_exposed"]
