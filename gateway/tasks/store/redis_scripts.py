"""The shared store's scripts: every write of the records that checks a bound or a status
is one Lua script, atomic across replicas (the keys are redis.py's). Creation checks both
task bounds; a save is compare-and-set against the transition table (a terminal record
stays terminal, whoever writes last) and checks the bytes bound. The scripts name a task's
hash from the prefix, so a cluster (keys spread over shards) is not supported.

`Scripts` puts each script's keys and arguments together and runs it, acknowledged by the
store replicas where the write is durable (redis_link.py); what a record holds (sealed,
vault.py) and what this replica keeps of it is the store's (redis.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from gateway.tasks.model import EXPIRED_MEMORY_S, LIVE, TRANSITIONS, Status, Task
from gateway.tasks.store import EVENTS
from gateway.tasks.store.redis_link import RedisLink

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


def _ms(seconds: float) -> int:
    return math.ceil(seconds * 1000)


# From which statuses each status may be reached (itself included: a new message, inputs).
_SOURCES = {s: "," + ",".join([str(s), *(str(f) for f in Status if s in TRANSITIONS[f])]) + ","
            for s in Status}


class Scripts:
    def __init__(self, link: RedisLink, max_tasks: int, max_per_owner: int,
                 max_stored_bytes: int, clock: Callable[[], float]) -> None:
        self._link = link
        self._key = link.key
        self._max_tasks = max_tasks
        self._max_per_owner = max_per_owner
        self._max_stored_bytes = max_stored_bytes
        self._clock = clock
        register = link.redis.register_script
        self._create = register(_CREATE)
        self._save = register(_SAVE)
        self._restore = register(_RESTORE)
        self._delete = register(_DELETE)
        self._sweep = register(_SWEEP)
        self._stranded = register(_STRANDED)

    async def create(self, task: Task, kept: bytes, seal: bytes, announcement: bytes) -> int:
        """Keep a new record (durable), announced; 0, or the bound that refused it: 1 the
        gateway's (`max_tasks`), 2 its owner's (`max_per_owner`)."""
        key, end = self._key, task.expires_at
        return int(await self._link.run(self._create, durable=True, keys=[
            key("live"), self._counted_in(task), key("t", task.id),
            key("run", task.replica), key("replicas"), key("sizes"),
            key("bytes"), key(EVENTS), key("o", task.owner)], args=[
            task.id, _ms(self._clock()), "+inf" if end is None else _ms(end),
            self._max_tasks, self._max_per_owner, str(task.status), task.owner,
            task.replica, kept, "" if end is None else _ms(end + EXPIRED_MEMORY_S),
            announcement, task.quota, seal]))

    def _counted_in(self, task: Task) -> str:
        """The key whose size `max_tasks_per_owner` bounds for this task."""
        return self._key("q", task.quota) if task.quota else self._key("o", task.owner)

    async def save(self, task: Task, kept: bytes, res: bytes, seal: bytes,
                   announcement: bytes) -> tuple[int, int]:
        """Replace the record where its status may move so (compare-and-set), announced:
        1 saved, 0 refused (or gone), -1 over `max_stored_bytes`; and the bytes all results
        take now. What a client must act on (an end, inputs) waits for the store replicas;
        progress does not (the next change or the end writes it again)."""
        key, terminal = self._key, task.terminal
        saved, held = await self._link.run(
            self._save, durable=terminal or bool(task.inputs),
            keys=[key("t", task.id), key("live"), key("sizes"), key("bytes"),
                  key("run", task.replica), key(EVENTS)],
            args=[task.id, _SOURCES[task.status], str(task.status), task.size,
                  self._max_stored_bytes, kept, res, "1" if terminal else "0",
                  announcement, seal])
        return int(saved), int(held)

    async def restore(self, batch: list[tuple[Task, bytes, bytes, bytes]]) -> int:
        """Write each (task, record, result, seal) where the store lacks it, whatever the
        bounds, in one pipeline (then one WAIT for them all, with min_acked); how many it
        lacked."""
        def add(pipe: Any) -> None:
            for task, rec, res, seal in batch:
                self._restore_one(pipe, task, rec, res, seal)
        return sum(int(n) for n in await self._link.pipelined(add, self._restore))

    def _restore_one(self, pipe: Any, task: Task, rec: bytes, res: bytes, seal: bytes
                     ) -> None:
        key, end = self._key, task.expires_at
        keys = [key("t", task.id), key("live"), key("o", task.owner),
                key("run", task.replica), key("replicas"), key("sizes"),
                key("bytes"), self._counted_in(task)]
        pipe.evalsha(self._restore.sha, len(keys), *keys, task.id, str(task.status),
                     task.owner, task.replica, rec, res, "+inf" if end is None else _ms(end),
                     "" if end is None else _ms(end + EXPIRED_MEMORY_S), task.size,
                     "0" if task.terminal else "1", task.quota, seal)

    async def delete(self, task_id: str, *, expired: bool) -> int:
        """Forget a record (`expired`: its owner remembered a while); the bytes all
        results take now."""
        key = self._key
        return int(await self._delete(
            keys=[key("t", task_id), key("live"), key("sizes"), key("bytes"),
                  key("gone", task_id)],
            args=[task_id, "1" if expired else "0", _ms(EXPIRED_MEMORY_S), self._link.prefix]))

    async def sweep(self) -> tuple[int, int]:
        """Tasks whose ttl passed leave the bounds: how many, and the bytes all results
        take now."""
        gone, held = await self._sweep(
            keys=[self._key("live"), self._key("sizes"), self._key("bytes")],
            args=[_ms(self._clock())])
        return int(gone), int(held)

    async def stranded(self, replica: str) -> list[str]:
        """The tasks `replica` runs that have not ended (the others leave its set)."""
        ids = await self._stranded(keys=[self._key("run", replica)], args=[self._link.prefix])
        return [i.decode() for i in ids]


__all__ = ["Scripts"]
