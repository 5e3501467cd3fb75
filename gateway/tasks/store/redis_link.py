"""The shared store's connection, and what replicas do through it besides records: the
client of the primary (at `store.url`, or wherever `store.sentinels` say it is), failures
turned into `StoreUnavailable`, writes acknowledged by store replicas (`WAIT`), the
replicas' leases and their channels.

    P lease:<replica>  renewed by the replica's heartbeat; gone lease_ms after it stops;
                       its value is where the replica is reached (replica.url), or "-"
    P generation       a random id written once by the first beat that finds none: a store
                       that came back empty has a new one (tasks/generation.py)
    P members          sorted set: each replica beating, by when its lease ends
    P rejoined         hash: replica -> the generation it wrote back into after a change

A server that does not answer raises `StoreUnavailable` at once (a short connect and read
timeout, two quick retries); redis-py reconnects by itself when it is back. With sentinels,
redis-py's Sentinel support names the primary and follows it through a failover.

With `store.min_replicas_acked` N, a durable write is followed by `WAIT N` on the same
connection (one pipeline): a write that N store replicas did not take within
`ack_timeout_ms` is not durable (NotAcked, then StoreUnavailable). Beats are durable too: a
primary that its replicas left (demoted, and not told yet) holds no lease that counts, and
with sentinels a NotAcked write drops every connection, so that the next ones ask the
sentinels where the primary is now.

The channels are a trust boundary (issue 19): with `replica.secret`, every message is sealed
(AES-256-GCM over its body, its time as associated data: whoever subscribes on the store
reads nothing of the records announced, and no one without the key makes a message that
opens) and a message that fails the seal, or is older than SEAL_WINDOW_S, is dropped and
logged (`replica.message_refused`): a process that can publish on the store cannot cancel,
answer or finish another owner's task through a replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, ParamSpec, TypeVar

import orjson
import redis.asyncio as aioredis
from cachetools import TTLCache
from redis.asyncio.sentinel import Sentinel
from redis.backoff import ExponentialBackoff
from redis.commands.core import AsyncScript
from redis.connection import parse_url
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from gateway.errors import StoreUnavailable
from gateway.keyring import Cipher
from gateway.observability import log
from gateway.tasks.store import EVENTS, Beat, Handler

P = ParamSpec("P")
R = TypeVar("R")
DOWN = (RedisConnectionError, RedisTimeoutError, OSError)
Keep = Callable[[dict[str, Any]], None]  # sees each event before its handler
SEAL_WINDOW_S = 60.0  # a sealed message older (or newer) than this is refused
PING_S = 0.25  # the listening connection is pinged this often
FRESH_S = 0.5  # what was heard counts as current while a ping this recent came back
SETTLE_KEPT = 4  # leases: how long the replicas' write-back marks stay (past any grace)

# The store's generation (tasks/generation.py), beside each beat, by the server's clock:
# KEYS: lease:<replica>, generation, members (sorted set: replica -> when its lease ends,
#       ms), rejoined (hash: replica -> the generation it wrote back into)
# ARGV: where the replica is reached (or "-"), lease_ms, replica, a new generation's id
_GENERATION_KEYS = ("generation", "members", "rejoined")
_BEAT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local held = redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2], 'GET')
redis.call('SET', KEYS[2], ARGV[4], 'NX')
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[2]), ARGV[3])
redis.call('PEXPIRE', KEYS[3], 2 * tonumber(ARGV[2]))
return {held and 1 or 0, redis.call('GET', KEYS[2]),
        redis.call('ZRANGE', KEYS[3], 0, -1), redis.call('HGETALL', KEYS[4])}
"""


class Seal:
    """Seals channel messages with the channel key (derived from replica.secret):
    `<ms>.<nonce, AES-GCM ciphertext and tag of the JSON>`; with no key, messages go as
    they are (a store built without a secret: unit tests; settings insist on one)."""

    def __init__(self, key: bytes | None, clock: Callable[[], float] = time.time) -> None:
        self.cipher = None if key is None else Cipher(key)
        self.clock = clock

    def close(self, body: bytes) -> bytes:
        if self.cipher is None:
            return body
        stamp = str(int(self.clock() * 1000)).encode()
        return stamp + b"." + self.cipher.encrypt(body, stamp)

    def open(self, data: bytes) -> bytes | None:
        """The body of a genuine, timely message; None for anything else."""
        if self.cipher is None:
            return data
        stamp, _, sealed = data.partition(b".")
        if not stamp.isdigit() or abs(self.clock() - int(stamp) / 1000) > SEAL_WINDOW_S:
            return None
        return self.cipher.decrypt(sealed, stamp)


class NotAcked(RedisConnectionError):
    """Fewer store replicas than `min_replicas_acked` took a write in time: it is not
    durable (a failover could lose it), so it counts as the store not answering."""


def guarded(fn: Callable[P, Coroutine[Any, Any, R]]) -> Callable[P, Coroutine[Any, Any, R]]:
    """A server that does not answer becomes `StoreUnavailable` (a JSON-RPC error); each
    call is counted as a request to the store (one round trip, but for a few that say)."""
    async def call(*args: P.args, **kwargs: P.kwargs) -> R:
        args[0].round_trips += 1  # type: ignore[attr-defined]
        try:
            return await fn(*args, **kwargs)
        except NotAcked as exc:
            raise StoreUnavailable(str(exc)) from exc
        except DOWN as exc:
            raise StoreUnavailable(type(exc).__name__) from exc
        except (RedisError, RuntimeError) as exc:  # READONLY, LOADING, MASTERDOWN, a
            # connection closed under a command: not answering either
            raise StoreUnavailable(f"{type(exc).__name__}: {str(exc)[:80]}") from exc
    call.__name__, call.__doc__ = fn.__name__, fn.__doc__
    return call


def connect(url: str | None, sentinels: Sequence[str], master: str) -> aioredis.Redis:
    """A client of the primary: at `url`, or wherever the sentinels say it is now (a
    connection to a demoted primary is dropped and made again to the new one)."""
    timeouts: dict[str, Any] = {"socket_connect_timeout": 1, "socket_timeout": 2,
                                "retry": Retry(ExponentialBackoff(cap=0.2, base=0.02), 2)}
    if not sentinels:
        assert url is not None  # settings insist on one of them
        return aioredis.Redis(connection_pool=aioredis.BlockingConnectionPool.from_url(
            url, max_connections=64, timeout=2, **timeouts))
    # parse_url and Sentinel are untyped in redis-py.
    parsed: dict[str, Any] = parse_url(url) if url else {}  # type: ignore[no-untyped-call]
    auth = {k: v for k, v in parsed.items() if k in ("username", "password", "db")}
    hosts = [(h, int(p)) for h, _, p in (s.rpartition(":") for s in sentinels)]
    sentinel = Sentinel(hosts, sentinel_kwargs={  # type: ignore[no-untyped-call]
        "socket_connect_timeout": 1, "socket_timeout": 1}, **timeouts)
    primary: aioredis.Redis = sentinel.master_for(master, max_connections=256, **auth)
    return primary


def text(value: Any) -> str:
    """A reply's bytes as text (the client does not decode replies: records stay bytes)."""
    return value.decode() if isinstance(value, bytes) else str(value)


async def _pipelined(redis: aioredis.Redis, add: Callable[[Any], Any], replicas: int,
                     timeout_ms: int, script: AsyncScript | None = None) -> list[Any]:
    """The answers to what `add` puts in one pipeline (one round trip); with `replicas`, a
    WAIT follows on the same connection, and NotAcked unless that many store replicas took
    the writes within `timeout_ms`. A server that forgot `script` (it restarted) is given
    it, and asked again."""
    for loaded in (False, True):
        async with redis.pipeline(transaction=False) as pipe:
            add(pipe)
            if replicas:
                pipe.wait(replicas, timeout_ms)
            out = await pipe.execute(raise_on_error=False)
        acked = out.pop() if replicas else 0
        if script is not None and not loaded and any(isinstance(o, NoScriptError)
                                                     for o in out):
            await redis.script_load(script.script)
            continue
        if (failed := next((o for o in out if isinstance(o, Exception)), None)) is not None:
            raise failed
        if isinstance(acked, Exception) or acked < replicas:
            raise NotAcked(f"{acked if isinstance(acked, int) else 0} of {replicas} store "
                           f"replicas took the write within {timeout_ms} ms")
        return out
    raise AssertionError("unreachable")


async def _hand(handler: Handler, channel: str, data: bytes, keep: Keep, seal: Seal
                ) -> None:
    """One message to its handler (`keep` sees events first); whatever goes wrong there
    stays with that message, so the replica goes on hearing the others."""
    body = seal.open(data)
    if body is None:
        log.warning("replica.message_refused", channel=channel, why="seal")
        return
    try:
        msg = orjson.loads(body)
        if channel == EVENTS:
            keep(msg)
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
    pong comes back after every message published before it (`RedisLink.fresh`). Sent
    only on a connection that is up: reconnecting is the reader's."""
    while True:
        _stop_if_cancelled()
        conn = pubsub.connection
        if conn is not None and conn.is_connected:
            with contextlib.suppress(*DOWN):
                await conn.send_command("PING", repr(time.monotonic()))
        await asyncio.sleep(PING_S)


class RedisLink:
    def __init__(self, url: str | None, prefix: str, *, sentinels: Sequence[str] = (),
                 master: str = "mymaster", min_acked: int = 0, ack_timeout_ms: int = 1000,
                 secret: bytes | None = None) -> None:
        self.prefix = prefix
        self.seal = Seal(secret)
        self.min_acked, self.ack_timeout_ms = min_acked, ack_timeout_ms
        self.sentinels = bool(sentinels)
        self.redis = connect(url, sentinels, master)
        self._beat = self.redis.register_script(_BEAT)
        self._alive: TTLCache[str, bool] = TTLCache(1024, 1.0)  # leases seen held lately
        self.round_trips = 0
        # The listening connection: how many subscriptions it has made (a new one may have
        # missed messages), and when the newest ping that came back on it was sent.
        self.epoch = 0
        self._heard_through = 0.0

    def fresh(self, epoch: int) -> bool:
        """Whether what was heard during subscription `epoch` is still current: the same
        subscription, and every message published up to FRESH_S ago has been heard (a pong
        comes back after every message published before its ping: one connection, in
        order)."""
        return epoch == self.epoch and time.monotonic() - self._heard_through <= FRESH_S

    def key(self, *parts: str) -> str:
        return self.prefix + ":".join(parts)

    async def run(self, script: AsyncScript, *, durable: bool, keys: list[str],
                  args: list[Any]) -> Any:
        """`script`, acknowledged by `min_acked` store replicas when `durable`."""
        if not durable or not self.min_acked:
            return await script(keys=keys, args=args)
        (out,) = await self.pipelined(
            lambda pipe: pipe.evalsha(script.sha, len(keys), *keys, *args), script)
        return out

    async def pipelined(self, add: Callable[[Any], Any], script: AsyncScript | None = None
                        ) -> list[Any]:
        """What `add` puts in a pipeline, acknowledged by `min_acked` store replicas."""
        try:
            return await _pipelined(self.redis, add, self.min_acked, self.ack_timeout_ms,
                                    script)
        except NotAcked:
            if self.sentinels:  # perhaps a demoted primary that does not know it yet: idle
                # connections go, so that new ones ask the sentinels (those in use finish
                # their command first: closing them under it breaks it).
                await self.redis.connection_pool.disconnect(inuse_connections=False)
            raise

    # -- leases -------------------------------------------------------------------------------
    @guarded
    async def beat(self, replica: str, lease_ms: int, address: str = "") -> Beat:
        """The lease renewed, and what the store says of its generation (`Beat`). Durable
        with `min_acked`: a lease held on a primary that its replicas left (demoted, not
        told yet) is no lease: the others, on the real primary, would take this replica for
        gone."""
        keys = [self.key("lease", replica), *(self.key(k) for k in _GENERATION_KEYS)]
        out = await self.run(self._beat, durable=True, keys=keys, args=[
            address or "-", lease_ms, replica, secrets.token_hex(8)])
        held, generation, members, rejoined = out
        generation = text(generation)
        wrote = dict(zip(rejoined[::2], rejoined[1::2], strict=True))
        return Beat(bool(held), generation, frozenset(text(r) for r in members),
                    frozenset(text(r) for r, g in wrote.items() if text(g) == generation))

    @guarded
    async def generation(self) -> str | None:
        held = await self.redis.get(self.key("generation"))
        return None if held is None else text(held)

    @guarded
    async def rejoined(self, replica: str, generation: str, lease_ms: int) -> None:
        key = self.key("rejoined")
        await self.pipelined(lambda pipe: (pipe.hset(key, replica, generation),
                                           pipe.pexpire(key, SETTLE_KEPT * lease_ms)))

    @guarded
    async def address(self, replica: str) -> str | None:
        held = await self.redis.get(self.key("lease", replica))
        return None if held is None or held == b"-" else text(held)

    @guarded
    async def leave(self, replica: str) -> None:
        await self.redis.delete(self.key("lease", replica))

    async def alive(self, replica: str) -> bool:
        if replica in self._alive:
            return True
        held = await self.holds_lease(replica)
        if held:
            self._alive[replica] = True
        return held

    @guarded
    async def holds_lease(self, replica: str) -> bool:
        return bool(await self.redis.exists(self.key("lease", replica)))

    # -- channels -----------------------------------------------------------------------------
    @guarded
    async def publish(self, channel: str, message: dict[str, Any]) -> None:
        await self.redis.publish(self.key(channel), self.seal.close(orjson.dumps(message)))

    async def listen(self, channels: list[str], handler: Handler, keep: Keep,
                     joined: Callable[[], None] | None = None) -> None:
        """Messages sent while the connection is down are lost: readers fall back on the
        records (a bounded poll), and what was heard before counts no more (`fresh`).
        `joined()` at each subscription (a first one, or one made again: the connection
        came back, so the store may have restarted, and the replica beats at once rather
        than at its next beat)."""
        names = {self.key(c): c for c in channels}
        while True:
            try:
                async with self.redis.pubsub() as pubsub:
                    await pubsub.subscribe(*names)
                    pinger = asyncio.create_task(_ping(pubsub))
                    try:
                        await self._hear(pubsub, names, handler, keep, joined)
                    finally:
                        pinger.cancel()
                        await asyncio.gather(pinger, return_exceptions=True)
            except DOWN:
                self.epoch, self._heard_through = self.epoch + 1, 0.0  # lost: stale now
                await asyncio.sleep(PING_S)  # a store back is heard within a second

    async def _hear(self, pubsub: Any, names: dict[str, str], handler: Handler, keep: Keep,
                    joined: Callable[[], None] | None) -> None:
        while True:
            _stop_if_cancelled()
            msg = await pubsub.get_message(timeout=None)
            if msg is None:
                continue
            if msg["type"] == "message":
                await _hand(handler, names[msg["channel"].decode()], msg["data"], keep,
                            self.seal)
            elif msg["type"] == "pong":
                with contextlib.suppress(ValueError):
                    self._heard_through = max(self._heard_through, float(msg["data"]))
            elif msg["type"] == "subscribe":  # at first, and after redis-py reconnected by
                # itself: what was heard before may have missed messages
                self.epoch, self._heard_through = self.epoch + 1, 0.0
                if joined is not None:
                    joined()

    async def close(self) -> None:
        await self.redis.aclose(close_connection_pool=True)
