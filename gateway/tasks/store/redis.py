"""The shared task store: Redis or Valkey (>= 6.2, standalone), for several gateway replicas.

Keys, under `store.key_prefix` (P):

    P t:<id>           hash: status, owner, replica, quota, rec (the record as JSON,
                       without its result), res (the result's raw JSON), seal: rec and res
                       encrypted, all sealed (vault.py); it lingers EXPIRED_MEMORY_S past
                       the task's ttl, so that its id answers "expired" meanwhile
    P live             sorted set of every task held, scored by the end of its ttl (ms):
                       what `limits.max_tasks` counts
    P o:<owner>        the same, per owner: core tasks/list
    P w:<principal>    the same, per principal (Task.counted_as: a legacy session's tasks
                       count against its principal), its running tasks:
                       `max_tasks_per_owner`
    P k:<principal>    and its finished ones: with its running ones,
                       `max_finished_tasks_per_owner`
    P r:<principal>    of those, the ones whose result was read, scored by the order of
                       first reads (P reads counts them): what makes room
    P z:<principal>, P b:<principal>
                       bytes of each of its results or errors, and their sum:
                       `max_stored_bytes_per_principal`
    P sizes, P bytes   bytes of each result or error held, and their sum: `max_stored_bytes`
    P run:<replica>    the tasks a replica runs; P replicas: every replica with such a set
    P lease:<replica>  (redis_bus.py)
    P gone:<id>        the owner of a running task ended at its ttl (it answers "expired")

Whatever checks a bound or a status is one Lua script, atomic across replicas
(redis_scripts.py); `RedisStore` seals what it writes (vault.py), reads, and keeps what it
read, wrote or heard announced of records, so that most reads need no round trip.

The connection (URL or Sentinel), its failures and acknowledgements by store replicas are
redis_link.py's; leases and channels redis_bus.py's. With `store.min_replicas_acked` N, a
creation, an input request and an end wait for N store replicas: a creation they did not
take is undone (no handle goes out), a change stays in the replica's outbox and is written
again.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import orjson
from cachetools import LRUCache

from gateway.errors import StoreSettling
from gateway.keyring import derive
from gateway.tasks.model import Task
from gateway.tasks.store import EVENTS, KeyBound, ResultTooLarge, StoreBounds, StoreFull
from gateway.tasks.store.redis_link import DOWN, NotAcked, RedisLink, guarded, text
from gateway.tasks.store.redis_scripts import Scripts
from gateway.tasks.store.vault import Stored, Vault

FINISHED_CACHE_BYTES = 32 << 20
MARKED_ENTRIES = 100_000
RUNNING_CACHE_BYTES = 16 << 20
ANNOUNCED_BYTES = 64 << 10  # records up to this size travel whole in their announcement
RESTORE_BATCH = 200
HELD = ("rec", "res", "owner", "seal")  # the fields a read takes of a task's hash
SETTLING_RETRY_S = 1.0  # a keyed create while the store gets its records back: ask again


def _encode(task: Task) -> tuple[bytes, bytes]:
    """The record without its result, and the result as the raw JSON it is (or b"")."""
    rec = task.record()
    rec.pop("result", None)
    return orjson.dumps(rec), task.result or b""


def _interned(task: Task) -> Task:
    """Names shared by many records kept once, as the memory store does."""
    task.owner, task.tool = sys.intern(task.owner), sys.intern(task.tool)
    task.quota = sys.intern(task.quota)
    task.upstream, task.replica = sys.intern(task.upstream), sys.intern(task.replica)
    return task


class RedisStore:
    def __init__(self, url: str | None, prefix: str, bounds: StoreBounds, replica: str = "",
                 clock: Callable[[], float] = time.time, *, sentinels: Sequence[str] = (),
                 master: str = "mymaster", min_acked: int = 0, ack_timeout_ms: int = 1000,
                 secret: bytes | None = None) -> None:
        """`secret`: replica.secret, whence the keys that seal channel messages and
        records (vault.py); without it neither is sealed (settings insist on one)."""
        self.url = url
        self.replica = replica  # the writer named in announcements
        self.bounds = bounds
        self.clock = clock
        self.link = RedisLink(url, prefix, sentinels=sentinels, master=master,
                              min_acked=min_acked, ack_timeout_ms=ack_timeout_ms,
                              secret=None if secret is None else derive(secret, "channel"))
        self.stored = Stored(None if secret is None else Vault(secret))
        self.redis = self.link.redis
        self.key = self.link.key
        # The store's generation as this replica's last beat read it (redis_bus.py): a
        # keyed create where the store's is another waits (redis_scripts.py `settling`).
        self.generation = ""
        self._scripts = Scripts(self.link, bounds, clock)
        # Finished tasks whose reads this replica wrote: read again, no round trip.
        self._marked: LRUCache[str, bool] = LRUCache(MARKED_ENTRIES)
        # Finished records read, written or announced lately (a terminal record never
        # changes; it only goes at its ttl, which reads check), bounded in bytes.
        self._finished: LRUCache[str, Task] = LRUCache(FINISHED_CACHE_BYTES,
                                                       getsizeof=lambda t: t.size + 512)
        # Running records other replicas announced, with the subscription that heard them:
        # current while that subscription is fresh (every later change would have been
        # heard), so a read of them needs no round trip.
        self._running: LRUCache[str, tuple[Task, Callable[[], bool]]] = LRUCache(
            RUNNING_CACHE_BYTES, getsizeof=lambda held: 512 + 256 * len(held[0].inputs))
        self._bytes = 0
        self.round_trips = 0

    @property
    def requests(self) -> int:
        """Made to the store server so far (round trips), leases and channels included."""
        return self.round_trips + self.link.round_trips

    # -- records ----------------------------------------------------------------------------
    @guarded
    async def create(self, task: Task) -> None:
        rec, _ = _encode(task)
        kept, _, seal = self.stored.close(task, rec, b"")
        try:
            refused, gone = await self._scripts.create(
                task, kept, seal, self._announcement(task, rec), self.generation)
        except NotAcked:
            with contextlib.suppress(*DOWN):  # not durable: no handle, so no record
                await self._forget(task.id)
            raise
        if refused == 1:
            raise StoreFull(self.bounds.said("tasks"))
        if refused == 2:
            raise StoreFull(self.bounds.said("running"))
        if refused == 3:
            raise StoreFull(self.bounds.said("held"))
        if refused == 4:
            raise StoreFull(self.bounds.said("share"))
        if refused == 5:
            raise KeyBound(gone[0])
        if refused == 6:
            raise StoreSettling(SETTLING_RETRY_S, "this call's task")
        await self._evicted(gone)

    async def get(self, task_id: str) -> Task | None:
        task = self._finished.get(task_id)
        if task is None and (heard := self._running.get(task_id)) is not None and heard[1]():
            task = heard[0]
        if task is None:
            task = await self._read(task_id)
            if task is None:
                return None
            if task.terminal:  # it never changes again: later reads need no round trip
                self._finished[task_id] = task.copy()
        else:
            task = task.copy()
        return task

    @guarded
    async def _read(self, task_id: str) -> Task | None:
        return self.stored.open(task_id, await self.redis.hmget(self.key("t", task_id), *HELD))

    @guarded
    async def owned_by(self, owner: str) -> list[Task]:
        ids = await self.redis.zrange(self.key("o", owner), 0, -1)
        async with self.redis.pipeline(transaction=False) as pipe:
            for task_id in ids:
                pipe.hmget(self.key("t", text(task_id)), *HELD)
            held = await pipe.execute()
        tasks = [self.stored.open(text(i), h) for i, h in zip(ids, held, strict=True)]
        # An id put in another owner's index names a record that is not this owner's.
        return sorted([t for t in tasks if t is not None and t.owner == owner],
                      key=lambda t: t.created_at)

    @guarded
    async def save(self, task: Task, *, keep: bool = True) -> bool:
        if task.size > self.bounds.max_result_bytes:
            raise ResultTooLarge(self.bounds.said("result", task.size))
        rec, res = _encode(task)
        kept, res, seal = self.stored.close(task, rec, res)
        saved, self._bytes, gone = await self._scripts.save(task, kept, res, seal,
                                                            self._announcement(task, rec))
        if saved == -1:
            raise ResultTooLarge(self.bounds.said("stored"))
        if saved == -2:
            raise ResultTooLarge(self.bounds.said("share"))
        if saved and task.terminal:  # read here next, most likely: no round trip then
            self._finished[task.id] = task.copy()
        await self._evicted(gone)
        return bool(saved)

    async def _evicted(self, gone: list[str]) -> None:
        """Read tasks the store forgot to make room: not kept here, nor by the other
        replicas once they hear of it (a replica that misses it serves its copy, which its
        owner has read, until its ttl)."""
        if not gone:
            return
        for task_id in gone:
            self._finished.pop(task_id, None)
            self._marked.pop(task_id, None)
        with contextlib.suppress(*DOWN):  # the store took it: a lost message costs a copy
            await self.redis.publish(self.key(EVENTS), self.link.seal.close(orjson.dumps(
                {"gone": gone, "from": self.replica})))

    @guarded
    async def read(self, task_id: str) -> None:
        if task_id not in self._marked and await self._scripts.read(task_id):
            self._marked[task_id] = True

    def _announcement(self, task: Task, rec: bytes) -> bytes:
        """What a write tells the other replicas: the task changed, and how it is now when
        its record is at most ANNOUNCED_BYTES (`live` while it runs, `end` with its result
        once it ended). Every replica keeps these, so that it reads them without a round
        trip, and writes ends back should the store lose them."""
        out: dict[str, Any] = {"task": task.id, "from": self.replica}
        if not task.terminal and len(rec) <= ANNOUNCED_BYTES:
            out["live"] = orjson.Fragment(rec)
        elif task.terminal and task.size + len(rec) <= ANNOUNCED_BYTES:
            out["end"] = task.record()
        return self.link.seal.close(orjson.dumps(out))

    def heard(self, msg: dict[str, Any], fresh: Callable[[], bool]) -> None:
        """An announcement heard on the bus (`msg` loses what it carried): another
        replica's running record is kept while `fresh()` (the bus's subscription that heard
        it is current: redis_bus.py), an end among the finished records; a change that came
        without its record makes the kept one stale, and read tasks forgotten to make room
        (`gone`) are kept no more."""
        task_id, live, end = msg.get("task"), msg.pop("live", None), msg.pop("end", None)
        if msg.get("from") == self.replica:
            return
        gone = msg.get("gone")
        if isinstance(gone, list):  # read tasks forgotten to make room
            for evicted in gone:
                self._finished.pop(str(evicted), None)
        if not isinstance(task_id, str):
            return
        self._running.pop(task_id, None)
        if isinstance(live, dict):
            self._running[task_id] = (_interned(Task(**live)), fresh)
        elif isinstance(end, dict):
            self._finished[task_id] = _interned(Task.from_record(end))

    @guarded
    async def restore(self, tasks: list[Task]) -> int:
        """Write `tasks` as they are where the store lacks them (it came back empty, or
        failed over to a replica that lagged), in pipelines of RESTORE_BATCH (then one WAIT
        for them all, with min_acked); how many it lacked. Held ones, and those whose ttl
        passed, are left."""
        tasks = [t for t in tasks if not self._due(t)]
        restored = 0
        for at in range(0, len(tasks), RESTORE_BATCH):
            restored += await self._scripts.restore([
                (task, *self.stored.close(task, *_encode(task)))
                for task in tasks[at:at + RESTORE_BATCH]])
        return restored

    def kept(self) -> list[Task]:
        """Copies of the finished records read, written or heard announced here lately,
        unexpired."""
        return [t.copy() for t in list(self._finished.values()) if not self._due(t)]

    @guarded
    async def delete(self, task_id: str) -> None:
        await self._forget(task_id)

    def holds(self, task_id: str) -> bool:
        return task_id in self._finished  # dropped when evicted, here or heard of ("gone")

    async def _forget(self, task_id: str) -> None:
        self._finished.pop(task_id, None)
        self._marked.pop(task_id, None)
        self._bytes = await self._scripts.delete(task_id)

    @guarded
    async def sweep(self) -> int:
        gone, self._bytes = await self._scripts.sweep()
        return gone

    @guarded
    async def knows(self, task_id: str) -> bool:
        return bool(await self.redis.exists(self.key("t", task_id)))

    def stored_bytes(self) -> int:
        """Of every replica, as of this replica's last write or sweep."""
        return self._bytes

    # -- the replicas' run sets (read by the bus: redis_bus.py) -------------------------------
    @guarded
    async def stranded(self, replica: str) -> list[str]:
        """The tasks `replica` runs (or ran) that have not ended."""
        return await self._scripts.stranded(replica)

    @guarded
    async def runners(self) -> list[str]:
        """Every replica with a set of tasks it runs."""
        return [text(name) for name in await self.redis.smembers(self.key("replicas"))]

    @guarded
    async def ran_none(self, replica: str) -> None:
        """`replica` (gone) left no task running: it is no longer listed."""
        await self.redis.srem(self.key("replicas"), replica)

    async def close(self) -> None:
        await self.link.close()

    def _due(self, task: Task) -> bool:
        return task.due(self.clock())
