"""The shared store's scripts: every write of the records that checks a bound or a status
is one Lua script, atomic across replicas (the keys are redis.py's). Creation checks the
task bounds, in all and its principal's; a save is compare-and-set against the transition
table (a terminal record stays terminal, whoever writes last) and checks the bytes bounds.
Where a principal's bound is met, its read tasks make room in the same script (the
contract: store/__init__.py). The scripts name keys from the prefix (a task's hash, a
principal's sets), so a cluster (keys spread over shards) is not supported.

`Scripts` puts each script's keys and arguments together and runs it, acknowledged by the
store replicas where the write is durable (redis_link.py); what a record holds (sealed,
vault.py) and what this replica keeps of it is the store's (redis.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from gateway.tasks.model import EXPIRED_MEMORY_S, LIVE, TRANSITIONS, Status, Task
from gateway.tasks.store import EVENTS, StoreBounds
from gateway.tasks.store.redis_link import RedisLink, text

# A principal's keys (redis.py: w:, k:, r:, z:, b:), under prefix p, for principal c.
_PRINCIPAL = """
local function keys_of(p, c)
  return {running = p .. 'w:' .. c, done = p .. 'k:' .. c, read = p .. 'r:' .. c,
          sizes = p .. 'z:' .. c, bytes = p .. 'b:' .. c}
end

-- The principal's tasks whose ttl passed leave its bounds.
local function prune_of(p, c, now)
  local k = keys_of(p, c)
  for _, set in ipairs({k.running, k.done}) do
    local gone = redis.call('ZRANGEBYSCORE', set, '-inf', now)
    for _, id in ipairs(gone) do
      local size = redis.call('HGET', k.sizes, id)
      if size then
        redis.call('DECRBY', k.bytes, size)
        redis.call('HDEL', k.sizes, id)
      end
      redis.call('ZREM', k.read, id)
    end
    if #gone > 0 then redis.call('ZREMRANGEBYSCORE', set, '-inf', now) end
  end
end

-- Whom a task counts against (Task.counted_as): its quota, else its owner.
local function counted_as(owner, quota)
  if quota and quota ~= '' then return quota end
  return owner
end
"""

# A keyed task's key (i:<key>, tasks/keys.py) names it while it is kept: bound at its
# creation (and where written back), gone with it.
_KEYS = """
local function unbind(p, key, id)
  if key and key ~= '' and redis.call('GET', p .. 'i:' .. key) == id then
    redis.call('DEL', p .. 'i:' .. key)
  end
end

local function bind(p, key, id, t, pexpireat)
  if key == '' then return end
  redis.call('HSET', t, 'key', key)
  redis.call('SET', p .. 'i:' .. key, id)
  if pexpireat ~= '' then redis.call('PEXPIREAT', p .. 'i:' .. key, pexpireat) end
end
"""

# Tasks whose ttl passed leave the bounds, the store's and their principals' (their hashes
# linger as "expired" a while).
_PRUNE = _PRINCIPAL + _KEYS + """
local function prune(live, sizes, bytes, now, p)
  local gone = redis.call('ZRANGEBYSCORE', live, '-inf', now, 'LIMIT', 0, 500)
  local whose = {}
  for _, id in ipairs(gone) do
    local size = redis.call('HGET', sizes, id)
    if size then
      redis.call('DECRBY', bytes, size)
      redis.call('HDEL', sizes, id)
    end
    local held = redis.call('HMGET', p .. 't:' .. id, 'owner', 'quota')
    if held[1] then whose[counted_as(held[1], held[2])] = true end
    -- Out of the bounds, so out of the store: the hash lingers (read as it lapsed) but
    -- not its result.
    redis.call('HDEL', p .. 't:' .. id, 'res')
  end
  if #gone > 0 then redis.call('ZREM', live, unpack(gone)) end
  for c in pairs(whose) do prune_of(p, c, now) end
  return #gone
end
"""

# Forgetting a task, and making room by forgetting a principal's read tasks.
_FORGET = _PRUNE + """
-- Forget a task: its hash, its place in every index and bound. (A task past its ttl is
-- not forgotten so: its hash lingers until its own expiry, read as it lapsed.)
local function forget(p, id)
  local t = p .. 't:' .. id
  local held = redis.call('HMGET', t, 'owner', 'replica', 'quota', 'key')
  if not held[1] then return end
  unbind(p, held[4], id)
  local size = redis.call('HGET', p .. 'sizes', id)
  if size then
    redis.call('DECRBY', p .. 'bytes', size)
    redis.call('HDEL', p .. 'sizes', id)
  end
  redis.call('DEL', t)
  redis.call('ZREM', p .. 'live', id)
  redis.call('ZREM', p .. 'o:' .. held[1], id)
  if held[3] and held[3] ~= '' then redis.call('ZREM', p .. 'q:' .. held[3], id) end
  redis.call('SREM', p .. 'run:' .. held[2], id)
  local k = keys_of(p, counted_as(held[1], held[3]))
  redis.call('ZREM', k.running, id)
  redis.call('ZREM', k.done, id)
  redis.call('ZREM', k.read, id)
  local mine = redis.call('HGET', k.sizes, id)
  if mine then
    redis.call('DECRBY', k.bytes, mine)
    redis.call('HDEL', k.sizes, id)
  end
end

-- The principal's read tasks (`spare` aside), the first read first, that make room for
-- `tasks` more tasks and `size` more bytes, and the bytes they free; all of them where they
-- do not make room enough (the caller then refuses, forgetting none).
local function room(p, c, tasks, size, spare)
  local k = keys_of(p, c)
  local victims, freed, at = {}, 0, 0
  while #victims < tasks or freed < size do
    local ids = redis.call('ZRANGE', k.read, at, at + 63)
    if #ids == 0 then break end
    for _, id in ipairs(ids) do
      if #victims >= tasks and freed >= size then break end
      if id ~= spare then
        table.insert(victims, id)
        freed = freed + tonumber(redis.call('HGET', k.sizes, id) or '0')
      end
    end
    at = at + 64
  end
  return victims, freed
end
"""

# Whether the store may still be getting back keys it lost (restarted empty: a new
# generation, redis_bus.py): its generation is not the one this replica's last beat read
# (or it has none yet), or it changed less than a lease ago, or a replica beating in it has
# not written back what it holds yet (until the grace ends). A keyed create waits then: the
# key may name a live task its replica is about to write back, and a run now would be the
# call's second. Judged here, by the store, not by each replica's view of it: a replica
# whose beats are slow to get through after the restart is still waited for.
_SETTLING = """
local function settling(p, known)
  local gen = redis.call('GET', p .. 'generation')
  if not gen or gen ~= known then return true end
  local floor = redis.call('GET', p .. 'settling')
  if not floor then return false end
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if now < tonumber(floor) then return true end
  for _, r in ipairs(redis.call('ZRANGEBYSCORE', p .. 'members', now, '+inf')) do
    if redis.call('HGET', p .. 'rejoined', r) ~= gen then return true end
  end
  return false
end
"""

# KEYS: live, t:<id>, run:<replica>, replicas, sizes, bytes, events, o:<owner>
# ARGV: id, now, score, max_tasks, max_per_owner (running), status, owner, replica, rec,
#       pexpireat, the announcement, quota, seal, prefix, counted as, max held per owner,
#       max bytes per owner, key, the generation the replica knows
_CREATE = _FORGET + _SETTLING + """
local p, c = ARGV[14], ARGV[15]
prune(KEYS[1], KEYS[5], KEYS[6], ARGV[2], p)
prune_of(p, c, ARGV[2])
if ARGV[18] ~= '' then
  -- Its key names a task still kept (in `live`: not forgotten, its ttl not passed).
  local bound = redis.call('GET', p .. 'i:' .. ARGV[18])
  if bound and redis.call('ZSCORE', KEYS[1], bound) then return {5, bound} end
  if settling(p, ARGV[19]) then return {6} end
end
local k = keys_of(p, c)
local running = redis.call('ZCARD', k.running)
if running >= tonumber(ARGV[5]) then return {2} end
local over_all = redis.call('ZCARD', KEYS[1]) - tonumber(ARGV[4])
local over_held = running + redis.call('ZCARD', k.done) - tonumber(ARGV[16])
local over_bytes = tonumber(redis.call('GET', k.bytes) or '0') - tonumber(ARGV[17])
local victims, freed = room(p, c, math.max(over_all, over_held) + 1, over_bytes + 1, '')
if #victims <= over_all then return {1} end
if #victims <= over_held then return {3} end
if freed <= over_bytes then return {4} end
for _, id in ipairs(victims) do forget(p, id) end
redis.call('HSET', KEYS[2], 'status', ARGV[6], 'owner', ARGV[7], 'replica', ARGV[8],
           'rec', ARGV[9], 'quota', ARGV[12], 'seal', ARGV[13])
if ARGV[10] ~= '' then redis.call('PEXPIREAT', KEYS[2], ARGV[10]) end
bind(p, ARGV[18], ARGV[1], KEYS[2], ARGV[10])
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
redis.call('ZADD', KEYS[8], ARGV[3], ARGV[1])
redis.call('ZADD', k.running, ARGV[3], ARGV[1])
if ARGV[8] ~= '' then
  redis.call('SADD', KEYS[3], ARGV[1])
  redis.call('SADD', KEYS[4], ARGV[8])
end
redis.call('PUBLISH', KEYS[7], ARGV[11])
table.insert(victims, 1, 0)
return victims
"""

# KEYS: t:<id>, live, sizes, bytes, run:<replica>, events
# ARGV: id, ",<statuses that may move to status>,", status, size, max_stored, rec, res,
#       terminal ("1" or "0"), the announcement, seal (over rec and res as they are
#       stored: a save without a result drops any held, so the seal holds for what is kept),
#       prefix, counted as, max bytes per owner, now, score (its expiry), pexpireat
_SAVE = _FORGET + """
local total = tonumber(redis.call('GET', KEYS[4]) or '0')
local cur = redis.call('HGET', KEYS[1], 'status')
local score = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not cur or not score then return {0, total} end
if cur ~= ARGV[3] and not string.find(ARGV[2], ',' .. cur .. ',', 1, true) then
  return {0, total}
end
local p, c = ARGV[11], ARGV[12]
local k = keys_of(p, c)
if ARGV[15] ~= '+inf' and score ~= 'inf' and tonumber(ARGV[15]) > tonumber(score) then
  -- Its ttl grew (its call waited in a queue): what expires it moves along.
  score = ARGV[15]
  redis.call('ZADD', KEYS[2], 'XX', score, ARGV[1])
  redis.call('ZADD', k.running, 'XX', score, ARGV[1])
  redis.call('PEXPIREAT', KEYS[1], ARGV[16])
  local key = redis.call('HGET', KEYS[1], 'key')
  if key then redis.call('PEXPIREAT', p .. 'i:' .. key, ARGV[16]) end
end
local out = {1, 0}
local old = tonumber(redis.call('HGET', KEYS[3], ARGV[1]) or '0')
local new = tonumber(ARGV[4])
if new ~= old then
  prune_of(p, c, ARGV[14])
  local old_mine = tonumber(redis.call('HGET', k.sizes, ARGV[1]) or '0')
  local mine = tonumber(redis.call('GET', k.bytes) or '0') - old_mine + new
               - tonumber(ARGV[13])
  local every = total - old + new - tonumber(ARGV[5])
  local victims, freed = room(p, c, 0, math.max(mine, every), ARGV[1])
  if freed < mine then return {-2, total} end
  if freed < every then return {-1, total} end
  for _, id in ipairs(victims) do
    forget(p, id)
    table.insert(out, id)
  end
  total = redis.call('INCRBY', KEYS[4], new - old)
  redis.call('INCRBY', k.bytes, new - old_mine)
  if new > 0 then
    redis.call('HSET', KEYS[3], ARGV[1], new)
    redis.call('HSET', k.sizes, ARGV[1], new)
  else
    redis.call('HDEL', KEYS[3], ARGV[1])
    redis.call('HDEL', k.sizes, ARGV[1])
  end
end
redis.call('HSET', KEYS[1], 'status', ARGV[3], 'rec', ARGV[6], 'seal', ARGV[10])
if ARGV[7] ~= '' then redis.call('HSET', KEYS[1], 'res', ARGV[7])
else redis.call('HDEL', KEYS[1], 'res') end
if ARGV[8] == '1' then
  redis.call('SREM', KEYS[5], ARGV[1])
  redis.call('ZREM', k.running, ARGV[1])
  redis.call('ZADD', k.done, score, ARGV[1])
end
redis.call('PUBLISH', KEYS[6], ARGV[9])
out[2] = total
return out
"""

# A record written again as it is, where the store has lost it (restarted empty, or failed
# over to a replica that lagged): no bound is checked, the task was accepted already (its
# result counts as not read: that mark is the store's alone).
# KEYS: t:<id>, live, o:<owner>, run:<replica>, replicas, sizes, bytes
# ARGV: id, status, owner, replica, rec, res, score, pexpireat, size, running ("1"/"0"),
#       quota, seal, prefix, counted as, key
_RESTORE = _PRINCIPAL + _KEYS + """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'status', ARGV[2], 'owner', ARGV[3], 'replica', ARGV[4],
           'rec', ARGV[5], 'quota', ARGV[11], 'seal', ARGV[12])
if ARGV[6] ~= '' then redis.call('HSET', KEYS[1], 'res', ARGV[6]) end
if ARGV[8] ~= '' then redis.call('PEXPIREAT', KEYS[1], ARGV[8]) end
local bound = ARGV[15] ~= '' and redis.call('GET', ARGV[13] .. 'i:' .. ARGV[15])
if not (bound and redis.call('ZSCORE', KEYS[2], bound)) then  -- its key, where free
  bind(ARGV[13], ARGV[15], ARGV[1], KEYS[1], ARGV[8])
end
local k = keys_of(ARGV[13], ARGV[14])
redis.call('ZADD', KEYS[2], ARGV[7], ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[7], ARGV[1])
if ARGV[10] == '1' then redis.call('ZADD', k.running, ARGV[7], ARGV[1])
else redis.call('ZADD', k.done, ARGV[7], ARGV[1]) end
if tonumber(ARGV[9]) > 0 then
  redis.call('HSET', KEYS[6], ARGV[1], ARGV[9])
  redis.call('INCRBY', KEYS[7], ARGV[9])
  redis.call('HSET', k.sizes, ARGV[1], ARGV[9])
  redis.call('INCRBY', k.bytes, ARGV[9])
end
if ARGV[10] == '1' and ARGV[4] ~= '' then
  redis.call('SADD', KEYS[4], ARGV[1])
  redis.call('SADD', KEYS[5], ARGV[4])
end
return 1
"""

# KEYS: t:<id>, bytes; ARGV: id, prefix
_DELETE = _FORGET + """
forget(ARGV[2], ARGV[1])
return tonumber(redis.call('GET', KEYS[2]) or '0')
"""

# The owner has had a finished task's result: it joins its principal's read tasks, in the
# order of first reads (a counter, so that reads in one millisecond keep their order).
# KEYS: t:<id>, reads; ARGV: id, prefix
_READ = _PRINCIPAL + """
local held = redis.call('HMGET', KEYS[1], 'owner', 'quota')
if not held[1] then return 0 end
local k = keys_of(ARGV[2], counted_as(held[1], held[2]))
if not redis.call('ZSCORE', k.done, ARGV[1]) then return 0 end
if redis.call('ZSCORE', k.read, ARGV[1]) then return 1 end
redis.call('ZADD', k.read, redis.call('INCR', KEYS[2]), ARGV[1])
return 1
"""

# KEYS: live, sizes, bytes; ARGV: now, prefix
_SWEEP = _PRUNE + """
local gone = prune(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2])
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
    def __init__(self, link: RedisLink, bounds: StoreBounds, clock: Callable[[], float]
                 ) -> None:
        self._link = link
        self._key = link.key
        self._bounds = bounds
        self._clock = clock
        register = link.redis.register_script
        self._create = register(_CREATE)
        self._save = register(_SAVE)
        self._restore = register(_RESTORE)
        self._delete = register(_DELETE)
        self._read = register(_READ)
        self._sweep = register(_SWEEP)
        self._stranded = register(_STRANDED)

    async def create(self, task: Task, kept: bytes, seal: bytes, announcement: bytes,
                     known: str) -> tuple[int, list[str]]:
        """Keep a new record (durable), announced, its principal's read tasks making room
        where they must; 0 and the ids of those forgotten, or the bound that refused it: 1
        the gateway's (`max_tasks`), 2 its principal's running tasks (`max_per_owner`), 3
        the tasks it holds, 4 its result bytes; 5 and the id of the task its key names
        (tasks/keys.py: no record made); 6 a keyed create while the store, which lost its
        records, has not got them back (`known`: the generation this replica knows)."""
        key, end = self._key, task.expires_at
        out = await self._link.run(self._create, durable=True, keys=[
            key("live"), key("t", task.id), key("run", task.replica), key("replicas"),
            key("sizes"), key("bytes"), key(EVENTS), key("o", task.owner)], args=[
            task.id, _ms(self._clock()), "+inf" if end is None else _ms(end),
            self._bounds.max_tasks, self._bounds.max_per_owner, str(task.status), task.owner,
            task.replica, kept, "" if end is None else _ms(end + EXPIRED_MEMORY_S),
            announcement, task.quota, seal, self._link.prefix, task.counted_as,
            self._bounds.max_held_per_owner, self._bounds.max_bytes_per_owner, task.key,
            known])
        return int(out[0]), [text(i) for i in out[1:]]

    async def save(self, task: Task, kept: bytes, res: bytes, seal: bytes,
                   announcement: bytes) -> tuple[int, int, list[str]]:
        """Replace the record where its status may move so (compare-and-set), announced,
        its principal's read tasks making room for its bytes where they must: 1 saved, 0
        refused (or gone), -1 over `max_stored_bytes`, -2 over its principal's share; the
        bytes all results take now; the ids of the read tasks forgotten. What a client must
        act on (an end, inputs) waits for the store replicas; progress does not (the next
        change or the end writes it again)."""
        key, terminal, end = self._key, task.terminal, task.expires_at
        saved, held, *gone = await self._link.run(
            self._save, durable=terminal or bool(task.inputs),
            keys=[key("t", task.id), key("live"), key("sizes"), key("bytes"),
                  key("run", task.replica), key(EVENTS)],
            args=[task.id, _SOURCES[task.status], str(task.status), task.size,
                  self._bounds.max_stored_bytes, kept, res, "1" if terminal else "0",
                  announcement, seal, self._link.prefix, task.counted_as,
                  self._bounds.max_bytes_per_owner, _ms(self._clock()),
                  "+inf" if end is None else _ms(end),
                  "" if end is None else _ms(end + EXPIRED_MEMORY_S)])
        return int(saved), int(held), [text(i) for i in gone]

    async def read(self, task_id: str) -> bool:
        """Mark a finished task's result read; whether it is (False: not held finished)."""
        return bool(await self._read(keys=[self._key("t", task_id), self._key("reads")],
                                     args=[task_id, self._link.prefix]))

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
                key("run", task.replica), key("replicas"), key("sizes"), key("bytes")]
        pipe.evalsha(self._restore.sha, len(keys), *keys, task.id, str(task.status),
                     task.owner, task.replica, rec, res, "+inf" if end is None else _ms(end),
                     "" if end is None else _ms(end + EXPIRED_MEMORY_S), task.size,
                     "0" if task.terminal else "1", task.quota, seal, self._link.prefix,
                     task.counted_as, task.key)

    async def delete(self, task_id: str) -> int:
        """Forget a record; the bytes all results take now."""
        key = self._key
        return int(await self._delete(keys=[key("t", task_id), key("bytes")],
                                      args=[task_id, self._link.prefix]))

    async def sweep(self) -> tuple[int, int]:
        """Tasks whose ttl passed leave the bounds: how many, and the bytes all results
        take now."""
        gone, held = await self._sweep(
            keys=[self._key("live"), self._key("sizes"), self._key("bytes")],
            args=[_ms(self._clock()), self._link.prefix])
        return int(gone), int(held)

    async def stranded(self, replica: str) -> list[str]:
        """The tasks `replica` runs that have not ended (the others leave its set)."""
        ids = await self._stranded(keys=[self._key("run", replica)], args=[self._link.prefix])
        return [i.decode() for i in ids]


__all__ = ["Scripts"]
