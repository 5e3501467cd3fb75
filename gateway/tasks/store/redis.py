"""The shared task store: Redis or Valkey (>= 6.2, standalone), for several gateway replicas.

Keys, under `store.key_prefix` (P):

    P t:<id>           hash: status, owner, replica, quota, rec (the record as JSON,
                       without its result), res (the result's raw JSON), seal: rec and res
                       encrypted, all sealed (vault.py); it lingers EXPIRED_MEMORY_S past
                       the task's ttl, so that its id answers "expired" meanwhile
    P live             sorted set of every task held, scored by the end of its ttl (ms):
                       what `limits.max_tasks` counts
    P o:<owner>        the same, per owner: core tasks/list; and `max_tasks_per_owner` for
                       a task counted against its owner
    P q:<principal>    the same, per principal, for tasks counted against another than
                       their owner (a legacy session's, against its principal: Task.quota)
    P sizes, P bytes   bytes of each result or error held, and their sum: `max_stored_bytes`
    P run:<replica>    the tasks a replica runs; P replicas: every replica with such a set
    P lease:<replica>  (redis_link.py)
    P gone:<id>        the owner of a running task ended at its ttl (it answers "expired")

Whatever checks a bound or a status is one Lua script, atomic across replicas: creation
checks both task bounds; a save is compare-and-set against the transition table (a terminal
record stays terminal, whoever writes last) and checks the bytes bound. The scripts name a
task's hash from the prefix, so a cluster (keys spread over shards) is not supported.

The connection (URL or Sentinel), its failures, acknowledgements by store replicas, leases
and channels are redis_link.py's. With `store.min_replicas_acked` N, a creation, an input
request and an end wait for N store replicas: a creation they did not take is undone (no
handle goes out), a change stays in the replica's outbox and is written again.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import orjson
from cachetools import LRUCache

from gateway.keyring import derive
from gateway.tasks.model import EXPIRED_MEMORY_S, LIVE, TERMINAL, TRANSITIONS, Status, Task
from gateway.tasks.store import EVENTS, ResultTooLarge, StoreFull
from gateway.tasks.store.redis_link import DOWN, NotAcked, RedisLink, guarded, text
from gateway.tasks.store.vault import Stored, Vault

# Tasks whose ttl passed leave the bounds (their hashes linger as "expired" a while).
_PRUNE = """
local function prune(live, sizes, bytes, now)
  local gone = redis.call('ZRANGEBYSCORE', live, '-inf', now, 'LIMIT', 0, 500)
  for _, id in ipairs(gone) do
    local size = redis.call('HGET', sizes, id)
    if size then
      redis.call('DECRBY', bytes, size)
      redis.call('HDEL', sizes, id)
    end
  end
  if #gone > 0 then redis.call('ZREM', live, unpack(gone)) end
  return #gone
end
"""

# KEYS: live, what it is counted in (q:<quota>, else o:<owner>), t:<id>, run:<replica>,
#       replicas, sizes, bytes, events, o:<owner>
# ARGV: id, now, score, max_tasks, max_per_owner, status, owner, replica, rec, pexpireat,
#       the announcement, quota, seal
_CREATE = _PRUNE + """
prune(KEYS[1], KEYS[6], KEYS[7], ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[2])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[4]) then return 1 end
if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[5]) then return 2 end
redis.call('HSET', KEYS[3], 'status', ARGV[6], 'owner', ARGV[7], 'replica', ARGV[8],
           'rec', ARGV[9], 'quota', ARGV[12], 'seal', ARGV[13])
if ARGV[10] ~= '' then redis.call('PEXPIREAT', KEYS[3], ARGV[10]) end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
redis.call('ZADD', KEYS[9], ARGV[3], ARGV[1])
if ARGV[8] ~= '' then
  redis.call('SADD', KEYS[4], ARGV[1])
  redis.call('SADD', KEYS[5], ARGV[8])
end
redis.call('PUBLISH', KEYS[8], ARGV[11])
return 0
"""

# KEYS: t:<id>, live, sizes, bytes, run:<replica>, events
# ARGV: id, ",<statuses that may move to status>,", status, size, max_stored, rec, res,
#       terminal ("1" or "0"), the announcement, seal (over rec and res as they are
#       stored: a save without a result drops any held, so the seal holds for what is kept)
_SAVE = """
local total = tonumber(redis.call('GET', KEYS[4]) or '0')
local cur = redis.call('HGET', KEYS[1], 'status')
if not cur or not redis.call('ZSCORE', KEYS[2], ARGV[1]) then return {0, total} end
if cur ~= ARGV[3] and not string.find(ARGV[2], ',' .. cur .. ',', 1, true) then
  return {0, total}
end
local old = tonumber(redis.call('HGET', KEYS[3], ARGV[1]) or '0')
local new = tonumber(ARGV[4])
if new ~= old then
  if total - old + new > tonumber(ARGV[5]) then return {-1, total} end
  total = redis.call('INCRBY', KEYS[4], new - old)
  if new > 0 then redis.call('HSET', KEYS[3], ARGV[1], new)
  else redis.call('HDEL', KEYS[3], ARGV[1]) end
end
redis.call('HSET', KEYS[1], 'status', ARGV[3], 'rec', ARGV[6], 'seal', ARGV[10])
if ARGV[7] ~= '' then redis.call('HSET', KEYS[1], 'res', ARGV[7])
else redis.call('HDEL', KEYS[1], 'res') end
if ARGV[8] == '1' then redis.call('SREM', KEYS[5], ARGV[1]) end
redis.call('PUBLISH', KEYS[6], ARGV[9])
return {1, total}
"""

# A record written again as it is, where the store has lost it (restarted empty, or failed
# over to a replica that lagged): no bound is checked, the task was accepted already.
# KEYS: t:<id>, live, o:<owner>, run:<replica>, replicas, sizes, bytes, what it is counted
#       in (q:<quota>, else o:<owner>)
# ARGV: id, status, owner, replica, rec, res, score, pexpireat, size, running ("1"/"0"),
#       quota, seal
_RESTORE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'status', ARGV[2], 'owner', ARGV[3], 'replica', ARGV[4],
           'rec', ARGV[5], 'quota', ARGV[11], 'seal', ARGV[12])
if ARGV[6] ~= '' then redis.call('HSET', KEYS[1], 'res', ARGV[6]) end
if ARGV[8] ~= '' then redis.call('PEXPIREAT', KEYS[1], ARGV[8]) end
redis.call('ZADD', KEYS[2], ARGV[7], ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[7], ARGV[1])
redis.call('ZADD', KEYS[8], ARGV[7], ARGV[1])
if tonumber(ARGV[9]) > 0 then
  redis.call('HSET', KEYS[6], ARGV[1], ARGV[9])
  redis.call('INCRBY', KEYS[7], ARGV[9])
end
if ARGV[10] == '1' and ARGV[4] ~= '' then
  redis.call('SADD', KEYS[4], ARGV[1])
  redis.call('SADD', KEYS[5], ARGV[4])
end
return 1
"""

# KEYS: t:<id>, live, sizes, bytes, gone:<id>; ARGV: id, expired, remember ms, prefix
_DELETE = """
local held = redis.call('HMGET', KEYS[1], 'owner', 'replica', 'quota')
if not held[1] then return tonumber(redis.call('GET', KEYS[4]) or '0') end
local size = redis.call('HGET', KEYS[3], ARGV[1])
if size then
  redis.call('DECRBY', KEYS[4], size)
  redis.call('HDEL', KEYS[3], ARGV[1])
end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', ARGV[4] .. 'o:' .. held[1], ARGV[1])
if held[3] and held[3] ~= '' then redis.call('ZREM', ARGV[4] .. 'q:' .. held[3], ARGV[1]) end
redis.call('SREM', ARGV[4] .. 'run:' .. held[2], ARGV[1])
if ARGV[2] == '1' then redis.call('SET', KEYS[5], held[1], 'PX', ARGV[3]) end
return tonumber(redis.call('GET', KEYS[4]) or '0')
"""

# KEYS: live, sizes, bytes; ARGV: now
_SWEEP = _PRUNE + """
local gone = prune(KEYS[1], KEYS[2], KEYS[3], ARGV[1])
return {gone, tonumber(redis.call('GET', KEYS[3]) or '0')}
"""

# Tasks a replica ran that have not ended (a LIVE status); ids that ended or went leave
# its set.
# KEYS: run:<replica>; ARGV: prefix
_STRANDED = """
local out = {}
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local status = redis.call('HGET', ARGV[1] .. 't:' .. id, 'status')
  if """ + " or ".join(f"status == '{s}'" for s in LIVE) + """ then table.insert(out, id)
  else redis.call('SREM', KEYS[1], id) end
end
return out
"""

FINISHED_CACHE_BYTES = 32 << 20
RUNNING_CACHE_BYTES = 16 << 20
ANNOUNCED_BYTES = 64 << 10  # records up to this size travel whole in their announcement
RESTORE_BATCH = 200
HELD = ("rec", "res", "owner", "seal")  # the fields a read takes of a task's hash


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


def _ms(seconds: float) -> int:
    return math.ceil(seconds * 1000)


# From which statuses each status may be reached (itself included: a new message, inputs).
_SOURCES = {s: "," + ",".join([str(s), *(str(f) for f in Status if s in TRANSITIONS[f])]) + ","
            for s in Status}


class RedisStore:
    def __init__(self, url: str | None, prefix: str, max_tasks: int, max_per_owner: int,
                 max_result_bytes: int, max_stored_bytes: int, replica: str = "",
                 clock: Callable[[], float] = time.time, *, sentinels: Sequence[str] = (),
                 master: str = "mymaster", min_acked: int = 0, ack_timeout_ms: int = 1000,
                 secret: bytes | None = None) -> None:
        """`secret`: replica.secret, whence the keys that seal channel messages and
        records (vault.py); without it neither is sealed (settings insist on one)."""
        self.url = url
        self.replica = replica  # the writer named in announcements
        self.prefix = prefix
        self.max_tasks = max_tasks
        self.max_per_owner = max_per_owner
        self.max_result_bytes = max_result_bytes
        self.max_stored_bytes = max_stored_bytes
        self.clock = clock
        self.link = RedisLink(url, prefix, sentinels=sentinels, master=master,
                              min_acked=min_acked, ack_timeout_ms=ack_timeout_ms,
                              secret=None if secret is None else derive(secret, "channel"))
        self.stored = Stored(None if secret is None else Vault(secret))
        self.redis = self.link.redis
        self._run = self.link.run
        self.key = self.link.key
        self._create = self.redis.register_script(_CREATE)
        self._save = self.redis.register_script(_SAVE)
        self._restore = self.redis.register_script(_RESTORE)
        self._delete = self.redis.register_script(_DELETE)
        self._sweep = self.redis.register_script(_SWEEP)
        self._stranded = self.redis.register_script(_STRANDED)
        # Finished records read, written or announced lately (a terminal record never
        # changes; it only goes at its ttl, which reads check), bounded in bytes.
        self._finished: LRUCache[str, Task] = LRUCache(FINISHED_CACHE_BYTES,
                                                       getsizeof=lambda t: t.size + 512)
        # Running records other replicas announced, with the subscription that heard them:
        # current while that subscription is fresh (every later change would have been
        # heard), so a read of them needs no round trip.
        self._running: LRUCache[str, tuple[Task, int]] = LRUCache(
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
        end = task.expires_at
        try:
            refused = await self._run(self._create, durable=True, keys=[
                self.key("live"), self._counted_in(task), self.key("t", task.id),
                self.key("run", task.replica), self.key("replicas"), self.key("sizes"),
                self.key("bytes"), self.key(EVENTS), self.key("o", task.owner)], args=[
                task.id, _ms(self.clock()), "+inf" if end is None else _ms(end),
                self.max_tasks, self.max_per_owner, str(task.status), task.owner,
                task.replica, kept, "" if end is None else _ms(end + EXPIRED_MEMORY_S),
                self._announcement(task, rec), task.quota, seal])
        except NotAcked:
            with contextlib.suppress(*DOWN):  # not durable: no handle, so no record
                await self._forget(task.id, expired=False)
            raise
        if refused == 1:
            raise StoreFull(f"the gateway holds its maximum of {self.max_tasks} tasks")
        if refused == 2:
            raise StoreFull(f"this client holds its maximum of {self.max_per_owner} tasks")

    def _counted_in(self, task: Task) -> str:
        """The key whose size `max_tasks_per_owner` bounds for this task."""
        return self.key("q", task.quota) if task.quota else self.key("o", task.owner)

    async def get(self, task_id: str) -> Task | None:
        task = self._finished.get(task_id)
        if task is None and (heard := self._running.get(task_id)) is not None and \
                self.link.fresh(heard[1]):
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
    async def expired_owner(self, task_id: str) -> str | None:
        owner = await self.redis.get(self.key("gone", task_id))
        return None if owner is None else text(owner)

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
        if task.size > self.max_result_bytes:
            raise ResultTooLarge(f"the result is {task.size} bytes; the gateway keeps at most "
                                 f"{self.max_result_bytes} bytes per task")
        rec, res = _encode(task)
        kept, res, seal = self.stored.close(task, rec, res)
        terminal = task.status in TERMINAL
        # What a client must act on waits for the store replicas; progress does not (the
        # next change or the end writes it again).
        saved, self._bytes = await self._run(self._save, durable=terminal or bool(task.inputs),
            keys=[self.key("t", task.id), self.key("live"), self.key("sizes"),
                  self.key("bytes"), self.key("run", task.replica), self.key(EVENTS)],
            args=[task.id, _SOURCES[task.status], str(task.status), task.size,
                  self.max_stored_bytes, kept, res, "1" if terminal else "0",
                  self._announcement(task, rec), seal])
        if saved == -1:
            raise ResultTooLarge(f"the gateway's result storage ({self.max_stored_bytes} "
                                 "bytes) is full")
        if saved and terminal:  # read here next, most likely: no round trip then
            self._finished[task.id] = task.copy()
        return bool(saved)

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

    def heard(self, msg: dict[str, Any]) -> None:
        """An announcement heard on the bus (`msg` loses what it carried): another
        replica's running record is kept while the bus stays fresh, an end among the
        finished records; a change that came without its record makes the kept one stale."""
        task_id, live, end = msg.get("task"), msg.pop("live", None), msg.pop("end", None)
        if msg.get("from") == self.replica or not isinstance(task_id, str):
            return
        self._running.pop(task_id, None)
        if isinstance(live, dict):
            self._running[task_id] = (_interned(Task(**live)), self.link.epoch)
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
            batch = tasks[at:at + RESTORE_BATCH]
            def add(pipe: Any, batch: list[Task] = batch) -> None:
                for task in batch:
                    self._restore_one(pipe, task)
            out = await self.link.pipelined(add, self._restore)
            restored += sum(int(n) for n in out)
        return restored

    def _restore_one(self, pipe: Any, task: Task) -> None:
        rec, res, seal = self.stored.close(task, *_encode(task))
        end = task.expires_at
        keys = [self.key("t", task.id), self.key("live"), self.key("o", task.owner),
                self.key("run", task.replica), self.key("replicas"), self.key("sizes"),
                self.key("bytes"), self._counted_in(task)]
        pipe.evalsha(self._restore.sha, len(keys), *keys, task.id, str(task.status),
                     task.owner, task.replica, rec, res, "+inf" if end is None else _ms(end),
                     "" if end is None else _ms(end + EXPIRED_MEMORY_S), task.size,
                     "0" if task.terminal else "1", task.quota, seal)

    def kept(self) -> list[Task]:
        """Copies of the finished records read, written or heard announced here lately,
        unexpired."""
        return [t.copy() for t in list(self._finished.values()) if not self._due(t)]

    @guarded
    async def delete(self, task_id: str, *, expired: bool = False) -> None:
        await self._forget(task_id, expired=expired)

    async def _forget(self, task_id: str, *, expired: bool) -> None:
        self._finished.pop(task_id, None)
        self._bytes = await self._delete(
            keys=[self.key("t", task_id), self.key("live"), self.key("sizes"),
                  self.key("bytes"), self.key("gone", task_id)],
            args=[task_id, "1" if expired else "0", _ms(EXPIRED_MEMORY_S), self.prefix])

    @guarded
    async def sweep(self) -> int:
        gone, self._bytes = await self._sweep(
            keys=[self.key("live"), self.key("sizes"), self.key("bytes")],
            args=[_ms(self.clock())])
        return int(gone)

    @guarded
    async def knows(self, task_id: str) -> bool:
        return bool(await self.redis.exists(self.key("t", task_id), self.key("gone", task_id)))

    def stored_bytes(self) -> int:
        """Of every replica, as of this replica's last write or sweep."""
        return self._bytes

    @guarded
    async def stranded(self, replica: str | None = None) -> list[str]:
        """Running tasks of `replica`, or of every replica whose lease has gone."""
        if replica is not None:
            return await self._stranded_on(replica)
        out: list[str] = []
        for name in await self.redis.smembers(self.key("replicas")):
            gone = text(name)
            if not await self.redis.exists(self.key("lease", gone)):
                ids = await self._stranded_on(gone)
                out += ids
                if not ids:
                    await self.redis.srem(self.key("replicas"), gone)
        return out

    async def _stranded_on(self, replica: str) -> list[str]:
        ids = await self._stranded(keys=[self.key("run", replica)], args=[self.prefix])
        return [i.decode() for i in ids]

    async def close(self) -> None:
        await self.link.close()

    def _due(self, task: Task) -> bool:
        return task.due(self.clock())
