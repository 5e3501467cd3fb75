"""Legacy sessions' records in the shared store, so that any replica can adopt a session
another one made (issue 35; the records' users are downstream/resume.py's).

Keys, under `store.key_prefix` (P), where <key> is a digest of the session id (never the id:
it is a bearer capability) and <group> names an upstream and a principal:

    P s:<key>       the record (what downstream/resume.py writes), expiring at the
                    session's idle expiry; renewed while a replica sees it used
    P sx:<key>      a session ended (DELETE, or evicted): no replica writes it back,
                    nor reads a record written back under <key> (by the store's operator)
    P sp:<group>    sorted set of the group's sessions, scored by their expiry (ms):
                    `limits.max_sessions_per_principal` across replicas

With `replica.secret` a record is encrypted and authenticated (AES-256-GCM under the
session-record key, its key as associated data: a record moved to another session's key, or
written by someone without the secret, does not open); a record that fails is refused as
if it were not held, and audited (`session.record_refused`), the rules of vault.py.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from gateway.keyring import Cipher, derive
from gateway.observability import log
from gateway.tasks.store.redis_link import RedisLink, guarded

# A session in its group's set until `at`; the set lives as long as its last member.
_INDEX = """
local function index(group, member, now, at)
  redis.call('ZADD', group, at, member)
  if redis.call('PTTL', group) < tonumber(at) - tonumber(now) then
    redis.call('PEXPIREAT', group, at)
  end
end
"""

# KEYS: s:<key>, sp:<group>, sx:<key>; ARGV: now (ms), expiry (ms), limit, record, member
_OPEN = _INDEX + """
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[3]) then return 0 end
redis.call('SET', KEYS[1], ARGV[4], 'PXAT', ARGV[2])
index(KEYS[2], ARGV[5], ARGV[1], ARGV[2])
return 1
"""

# A session a replica holds and saw used: its expiry moves on; a record the store lost
# (restarted empty) is written back, unless the session was ended meanwhile (0).
# KEYS: s:<key>, sp:<group>, sx:<key>; ARGV: now (ms), expiry (ms), record, member
_RENEW = _INDEX + """
if redis.call('EXISTS', KEYS[3]) == 1 then return 0 end
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('PEXPIREAT', KEYS[1], ARGV[2])
else redis.call('SET', KEYS[1], ARGV[3], 'PXAT', ARGV[2]) end
index(KEYS[2], ARGV[4], ARGV[1], ARGV[2])
return 1
"""

# KEYS: s:<key>, sp:<group>, sx:<key>; ARGV: member, how long the end is remembered (ms)
_END = """
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('SET', KEYS[3], '1', 'PX', ARGV[2])
return 1
"""


class RedisSessions:
    """The session records of one shared store (its connection: the task store's link)."""

    def __init__(self, link: RedisLink, secret: bytes | None,
                 clock: Callable[[], float] = time.time) -> None:
        self.link = link
        self.redis = link.redis
        self.key = link.key
        self.clock = clock
        self.cipher = None if secret is None else Cipher(derive(secret, "session-record"))
        self._open = self.redis.register_script(_OPEN)
        self._renew = self.redis.register_script(_RENEW)
        self._end = self.redis.register_script(_END)
        self.round_trips = 0

    def _keys(self, key: str, group: str) -> list[str]:
        return [self.key("s", key), self.key("sp", group), self.key("sx", key)]

    def _sealed(self, key: str, record: bytes) -> bytes:
        return record if self.cipher is None else self.cipher.encrypt(record, key.encode())

    @guarded
    async def open(self, key: str, group: str, record: bytes, ttl_ms: int, limit: int
                   ) -> bool:
        """Keep a new session's record until `ttl_ms` from now; False (nothing kept) when
        `group` holds `limit` live sessions already."""
        now = _ms(self.clock())
        kept = await self._open(keys=self._keys(key, group), args=[
            now, now + ttl_ms, limit, self._sealed(key, record), key])
        return bool(kept)

    @guarded
    async def read(self, key: str) -> bytes | None:
        """The record held under `key`, as it was given to `open`; None when there is none
        (never made, ended, expired, or refused: it failed its seal). An ended session's
        record is none even if written back (by whoever writes to the store), as long as
        its end is remembered: one round trip reads both."""
        held, ended = await self.redis.mget(self.key("s", key), self.key("sx", key))
        if ended is not None:
            return None
        if not isinstance(held, bytes) or self.cipher is None:
            return held if isinstance(held, bytes) else None  # replies are not decoded
        plain = self.cipher.decrypt(held, key.encode())
        if plain is None:
            log.warning("session.record_refused", audit=True, why="seal")
        return plain

    @guarded
    async def renew(self, held: list[tuple[str, str, bytes]], ttl_ms: int) -> list[str]:
        """Each (key, group, record) lives on until `ttl_ms` from now (written back where
        the store lost it); the keys of those ended meanwhile (they are not written)."""
        if not held:
            return []
        now = _ms(self.clock())

        def add(pipe: Any) -> None:
            for key, group, record in held:
                keys = self._keys(key, group)
                pipe.evalsha(self._renew.sha, len(keys), *keys, now, now + ttl_ms,
                             self._sealed(key, record), key)
        out = await self.link.pipelined(add, self._renew)
        return [key for (key, _, _), kept in zip(held, out, strict=True) if not kept]

    @guarded
    async def end(self, key: str, group: str, remember_ms: int) -> None:
        """The session ended: its record goes, and no replica writes it back for
        `remember_ms` (it outlives every record's expiry)."""
        await self._end(keys=self._keys(key, group), args=[key, remember_ms])

    async def close(self) -> None:
        """The link is the task store's: it closes it."""


def _ms(seconds: float) -> int:
    return math.ceil(seconds * 1000)


__all__ = ["RedisSessions"]
