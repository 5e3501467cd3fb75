"""The `ReplicaBus` of replicas sharing a Redis store, over the store's own server (its link,
redis_link.py): the replicas' leases, and the channels they tell each other on. The tasks a
gone replica left running are read from the store's records (redis.py), and the records
announced on the events channel are handed to the store as they are heard (so every
replica reads them, and writes ends back, without a round trip).

    P lease:<replica>  renewed by the replica's heartbeat; gone lease_ms after it stops;
                       its value is where the replica is reached (replica.url), or "-"
    P generation       a random id written once by the first beat that finds none: a store
                       that came back empty has a new one (tasks/generation.py)
    P members          sorted set: each replica beating, by when its lease ends
    P rejoined         hash: replica -> the generation it wrote back into after a change
    P settling         after a change, until when keyed creates wait for every replica's
                       write-back (ms, the server's clock; gone after the grace)

Beats are durable with `store.min_replicas_acked`: a primary that its replicas left
(demoted, and not told yet) holds no lease that counts. Messages sent while the listening
connection is down are lost: readers fall back on the records (a bounded poll), and what
was heard before counts no more (`fresh`).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Callable
from typing import Any

import orjson
from cachetools import TTLCache

from gateway.observability import log
from gateway.tasks.generation import SETTLE_LEASES
from gateway.tasks.store import EVENTS, Beat, Handler
from gateway.tasks.store.redis import RedisStore
from gateway.tasks.store.redis_link import DOWN, guarded, text

PING_S = 0.25  # the listening connection is pinged this often
FRESH_S = 0.5  # what was heard counts as current while a ping this recent came back
SETTLE_KEPT = 4  # leases: how long the replicas' write-back marks stay (past any grace)

# The store's generation (tasks/generation.py), beside each beat, by the server's clock:
# KEYS: lease:<replica>, generation, members (sorted set: replica -> when its lease ends,
#       ms), rejoined (hash: replica -> the generation it wrote back into), settling
# ARGV: where the replica is reached (or "-"), lease_ms, replica, a new generation's id,
#       the generation the replica knew ("" none), the settling grace (ms)
# A replica that knew another generation finds the store lost its records: from then, for a
# lease (by when every replica alive has beaten in the new one, or lost its lease anyway)
# and after it until each one beating has written back, keyed creates wait (redis_scripts.py
# `settling`); never past the grace.
_GENERATION_KEYS = ("generation", "members", "rejoined", "settling")
_BEAT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local held = redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2], 'GET')
redis.call('SET', KEYS[2], ARGV[4], 'NX')
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[2]), ARGV[3])
redis.call('PEXPIRE', KEYS[3], 2 * tonumber(ARGV[2]))
local gen = redis.call('GET', KEYS[2])
if ARGV[5] ~= '' and ARGV[5] ~= gen then
  redis.call('SET', KEYS[5], now + tonumber(ARGV[2]), 'PX', ARGV[6], 'NX')
end
return {held and 1 or 0, gen,
        redis.call('ZRANGE', KEYS[3], 0, -1), redis.call('HGETALL', KEYS[4])}
"""


class RedisBus:
    def __init__(self, store: RedisStore) -> None:
        self.store = store
        self._link = store.link
        self._redis = store.link.redis
        self._key = store.link.key
        self._beat = self._redis.register_script(_BEAT)
        self._alive: TTLCache[str, bool] = TTLCache(1024, 1.0)  # leases seen held lately
        # The listening connection: how many subscriptions it has made (a new one may have
        # missed messages), and when the newest ping that came back on it was sent.
        self.epoch = 0
        self._heard_through = 0.0

    @property
    def round_trips(self) -> int:
        """Counted with the link's: the store's `requests` include leases and channels."""
        return self._link.round_trips

    @round_trips.setter
    def round_trips(self, count: int) -> None:
        self._link.round_trips = count

    # -- leases -------------------------------------------------------------------------------
    @guarded
    async def beat(self, replica: str, lease_ms: int, address: str = "", known: str = ""
                   ) -> Beat:
        """The lease renewed, and what the store says of its generation (`Beat`), which
        the store's keyed creates then expect (RedisStore.generation). Durable
        with `min_acked`: a lease held on a primary that its replicas left (demoted, not
        told yet) is no lease: the others, on the real primary, would take this replica for
        gone."""
        keys = [self._key("lease", replica), *(self._key(k) for k in _GENERATION_KEYS)]
        out = await self._link.run(self._beat, durable=True, keys=keys, args=[
            address or "-", lease_ms, replica, secrets.token_hex(8), known,
            SETTLE_LEASES * lease_ms])
        held, generation, members, rejoined = out
        generation = self.store.generation = text(generation)
        wrote = dict(zip(rejoined[::2], rejoined[1::2], strict=True))
        return Beat(bool(held), generation, frozenset(text(r) for r in members),
                    frozenset(text(r) for r, g in wrote.items() if text(g) == generation))

    @guarded
    async def generation(self) -> str | None:
        held = await self._redis.get(self._key("generation"))
        return None if held is None else text(held)

    @guarded
    async def rejoined(self, replica: str, generation: str, lease_ms: int) -> None:
        key = self._key("rejoined")
        await self._link.pipelined(lambda pipe: (pipe.hset(key, replica, generation),
                                                 pipe.pexpire(key, SETTLE_KEPT * lease_ms)))

    @guarded
    async def leave(self, replica: str) -> None:
        # Out of the members too: keyed creates wait for no write-back of a replica gone.
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.delete(self._key("lease", replica))
            pipe.zrem(self._key("members"), replica)
            await pipe.execute()

    async def alive(self, replica: str) -> bool:
        if replica in self._alive:
            return True
        held = await self._holds_lease(replica)
        if held:
            self._alive[replica] = True
        return held

    @guarded
    async def _holds_lease(self, replica: str) -> bool:
        return bool(await self._redis.exists(self._key("lease", replica)))

    async def stranded(self, replica: str | None = None) -> list[str]:
        """Running tasks of `replica`, or of every replica whose lease has gone (the
        records' run sets: redis.py)."""
        if replica is not None:
            return await self.store.stranded(replica)
        out: list[str] = []
        for gone in await self.store.runners():
            if not await self._holds_lease(gone):
                ids = await self.store.stranded(gone)
                out += ids
                if not ids:
                    await self.store.ran_none(gone)
        return out

    # -- channels -----------------------------------------------------------------------------
    @guarded
    async def publish(self, channel: str, message: dict[str, Any]) -> None:
        await self._redis.publish(self._key(channel),
                                  self._link.seal.close(orjson.dumps(message)))

    def fresh(self, epoch: int) -> bool:
        """Whether what was heard during subscription `epoch` is still current: the same
        subscription, and every message published up to FRESH_S ago has been heard (a pong
        comes back after every message published before its ping: one connection, in
        order)."""
        return epoch == self.epoch and time.monotonic() - self._heard_through <= FRESH_S

    def _lost(self) -> None:
        """The subscription is gone (or made again): what was heard on it is stale now."""
        self.epoch, self._heard_through = self.epoch + 1, 0.0

    async def listen(self, channels: list[str], handler: Handler,
                     joined: Callable[[], None] | None = None) -> None:
        """`joined()` at each subscription (a first one, or one made again: the connection
        came back, so the store may have restarted, and the replica beats at once rather
        than at its next beat)."""
        names = {self._key(c): c for c in channels}
        while True:
            try:
                async with self._redis.pubsub() as pubsub:
                    await pubsub.subscribe(*names)
                    pinger = asyncio.create_task(_ping(pubsub))
                    try:
                        await self._hear(pubsub, names, handler, joined)
                    finally:
                        pinger.cancel()
                        await asyncio.gather(pinger, return_exceptions=True)
            except DOWN:
                self._lost()
                await asyncio.sleep(PING_S)  # a store back is heard within a second

    async def _hear(self, pubsub: Any, names: dict[str, str], handler: Handler,
                    joined: Callable[[], None] | None) -> None:
        while True:
            _stop_if_cancelled()
            msg = await pubsub.get_message(timeout=None)
            if msg is None:
                continue
            if msg["type"] == "message":
                await self._hand(handler, names[msg["channel"].decode()], msg["data"])
            elif msg["type"] == "pong":
                with contextlib.suppress(ValueError):
                    self._heard_through = max(self._heard_through, float(msg["data"]))
            elif msg["type"] == "subscribe":  # at first, and after redis-py reconnected by
                # itself: what was heard before may have missed messages
                self._lost()
                if joined is not None:
                    joined()

    async def _hand(self, handler: Handler, channel: str, data: bytes) -> None:
        """One message to its handler (an event's record kept by the store first, current
        while this subscription is fresh); whatever goes wrong there stays with that
        message, so the replica goes on hearing the others."""
        body = self._link.seal.open(data)
        if body is None:
            log.warning("replica.message_refused", channel=channel, why="seal")
            return
        try:
            msg = orjson.loads(body)
            if channel == EVENTS:
                epoch = self.epoch
                self.store.heard(msg, lambda: self.fresh(epoch))
            await handler(channel, msg)
        except Exception as exc:
            log.error("replica.message_failed", channel=channel, error=repr(exc))


def _stop_if_cancelled() -> None:
    """On Python 3.11, `asyncio.wait_for` (redis-py's writes) and timed reads can swallow a
    cancellation that lands as they finish: a loop that went on would never stop."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def _ping(pubsub: Any) -> None:
    """Every PING_S, a ping on the listening connection, stamped with when it was sent: its
    pong comes back after every message published before it (`RedisBus.fresh`). Sent
    only on a connection that is up: reconnecting is the reader's."""
    while True:
        _stop_if_cancelled()
        conn = pubsub.connection
        if conn is not None and conn.is_connected:
            with contextlib.suppress(*DOWN):
                await conn.send_command("PING", repr(time.monotonic()))
        await asyncio.sleep(PING_S)


__all__ = ["RedisBus"]
