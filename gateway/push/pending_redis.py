"""Deliveries not made yet in the shared store (pending.py's contract), so that any replica
finishes what another left: a claim holds a delivery for CLAIM_S (longer than an attempt
can take), after which a replica that died mid-attempt has let it go and another takes it;
a replica that stops hands back what it was trying at once (`again`, due now). Records are
encrypted (AES-GCM, a key of replica.secret, bound to their lane): a client's webhook
secret is in them. Imported only with a shared store (redis is not loaded otherwise).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import orjson

from gateway.keyring import Cipher
from gateway.push.endpoint import Delivery, Target
from gateway.tasks.store.redis_link import RedisLink, text

CLAIM_S = 30.0  # a claimed delivery's hold: past TOTAL_S (sender.py), an attempt's bound
POLL_S = 0.5  # a lane asks this often for deliveries other replicas queued or let go

# P wh:q:<lane>       sorted set: delivery id -> when it is due (or its claim ends), ms
# P wh:r:<lane>:<id>  its record, sealed
# P wh:n, P wh:o      how many are held, in all and by owner (hash)
_PUT = """
if redis.call('EXISTS', KEYS[2]) == 1 then return 1 end
if tonumber(redis.call('GET', KEYS[3]) or '0') >= tonumber(ARGV[5]) then return 0 end
if tonumber(redis.call('HGET', KEYS[4], ARGV[4]) or '0') >= tonumber(ARGV[6]) then return 0 end
redis.call('SET', KEYS[2], ARGV[3])
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('INCR', KEYS[3])
redis.call('HINCRBY', KEYS[4], ARGV[4], 1)
return 1
"""
_CLAIM = """
local out = {}
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[3])) do
  local rec = redis.call('GET', ARGV[4] .. id)
  if rec then
    redis.call('ZADD', KEYS[1], ARGV[2], id)
    table.insert(out, rec)
  else
    redis.call('ZREM', KEYS[1], id)
  end
end
return out
"""
_DONE = """
if redis.call('DEL', KEYS[2]) == 1 then
  redis.call('DECR', KEYS[3])
  if redis.call('HINCRBY', KEYS[4], ARGV[2], -1) <= 0 then redis.call('HDEL', KEYS[4], ARGV[2]) end
end
redis.call('ZREM', KEYS[1], ARGV[1])
return 1
"""


class RedisPending:
    def __init__(self, link: RedisLink, cipher: Cipher | None, max_pending: int,
                 max_per_owner: int, clock: Callable[[], float] = time.time) -> None:
        """`cipher`: of a key of replica.secret (settings insist on one with Redis)."""
        self._link, self._cipher, self._clock = link, cipher, clock
        self.max_pending, self.max_per_owner = max_pending, max_per_owner
        register = link.redis.register_script
        self._put, self._claim, self._done = register(_PUT), register(_CLAIM), register(_DONE)

    def _keys(self, lane: str, delivery_id: str) -> list[str]:
        key = self._link.key
        return [key("wh", "q", lane), key("wh", "r", lane, delivery_id), key("wh", "n"),
                key("wh", "o")]

    async def put(self, lane: str, delivery: Delivery) -> bool:
        out = await self._put(keys=self._keys(lane, delivery.id), args=[
            delivery.id, _ms(delivery.due), self._sealed(lane, delivery), delivery.owner,
            self.max_pending, self.max_per_owner])
        return bool(out)

    async def claim(self, lane: str, n: int) -> list[Delivery]:
        now = self._clock()
        records = await self._claim(keys=[self._link.key("wh", "q", lane)], args=[
            _ms(now), _ms(now + CLAIM_S), n, self._link.key("wh", "r", lane, "")])
        return [d for d in (self._opened(lane, r) for r in records) if d is not None]

    async def done(self, lane: str, delivery: Delivery) -> None:
        await self._done(keys=self._keys(lane, delivery.id), args=[delivery.id,
                                                                    delivery.owner])

    async def again(self, lane: str, delivery: Delivery) -> None:
        queue, record = self._keys(lane, delivery.id)[:2]
        async with self._link.redis.pipeline(transaction=True) as pipe:
            pipe.set(record, self._sealed(lane, delivery), xx=True)
            pipe.zadd(queue, {delivery.id: _ms(delivery.due)}, xx=True)
            await pipe.execute()

    async def forget(self, lane: str) -> None:
        queue = self._link.key("wh", "q", lane)
        for raw in [text(i) for i in await self._link.redis.zrange(queue, 0, -1)]:
            record = await self._link.redis.get(self._keys(lane, raw)[1])
            delivery = self._opened(lane, record) if isinstance(record, bytes) else None
            if delivery is not None:
                await self.done(lane, delivery)
            else:
                await self._link.redis.zrem(queue, raw)

    def wait_s(self, lane: str) -> float:
        return POLL_S

    async def count(self, lane: str | None = None) -> int:
        if lane is not None:
            return int(await self._link.redis.zcard(self._link.key("wh", "q", lane)))
        return int(text(await self._link.redis.get(self._link.key("wh", "n")) or b"0"))

    def _sealed(self, lane: str, delivery: Delivery) -> bytes:
        target = None if delivery.target is None else delivery.target.record()
        plain = orjson.dumps({
            "id": delivery.id, "body": delivery.body.decode(), "owner": delivery.owner,
            "since": delivery.since, "attempt": delivery.attempt, "due": delivery.due,
            "target": target})
        # Bound to its lane: a record moved to another lane (or endpoint) does not open.
        return plain if self._cipher is None else self._cipher.encrypt(plain, lane.encode())

    def _opened(self, lane: str, record: bytes) -> Delivery | None:
        opened = record if self._cipher is None else self._cipher.decrypt(record,
                                                                          lane.encode())
        if opened is None:  # not sealed by a replica holding the secret: not ours to send
            return None
        data: dict[str, Any] = orjson.loads(opened)
        hook = data["target"]
        target = None if hook is None else Target(hook["url"], hook["secret"], hook["guarded"])
        return Delivery(data["due"], 0, data["id"], data["body"].encode(), data["owner"],
                        data["since"], data["attempt"], target)


def _ms(seconds: float) -> int:
    return int(seconds * 1000)
