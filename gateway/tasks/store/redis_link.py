"""The shared store's connection: the client of the primary (at `store.url`, or wherever
`store.sentinels` say it is), failures turned into `StoreUnavailable`, writes acknowledged
by store replicas (`WAIT`), and the seal of what replicas tell each other. The records
(redis.py), the replicas' leases and channels (redis_bus.py) and legacy sessions
(redis_sessions.py) go through it.

A server that does not answer raises `StoreUnavailable` at once (a short connect and read
timeout, two quick retries); redis-py reconnects by itself when it is back. With sentinels,
redis-py's Sentinel support names the primary and follows it through a failover.

With `store.min_replicas_acked` N, a durable write is followed by `WAIT N` on the same
connection (one pipeline): a write that N store replicas did not take within
`ack_timeout_ms` is not durable (NotAcked, then StoreUnavailable). With sentinels a
NotAcked write drops every connection, so that the next ones ask the sentinels where the
primary is now.

The channels are a trust boundary (issue 19): with `replica.secret`, every message is sealed
(AES-256-GCM over its body, its time as associated data: whoever subscribes on the store
reads nothing of the records announced, and no one without the key makes a message that
opens) and a message that fails the seal, or is older than SEAL_WINDOW_S, is dropped and
logged (`replica.message_refused`): a process that can publish on the store cannot cancel,
answer or finish another owner's task through a replica.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, ParamSpec, TypeVar

import redis.asyncio as aioredis
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

P = ParamSpec("P")
R = TypeVar("R")
DOWN = (RedisConnectionError, RedisTimeoutError, OSError)
SEAL_WINDOW_S = 60.0  # a sealed message older (or newer) than this is refused


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
    if url is not None and not sentinels:  # settings insist on one of them
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


class RedisLink:
    def __init__(self, url: str | None, prefix: str, *, sentinels: Sequence[str] = (),
                 master: str = "mymaster", min_acked: int = 0, ack_timeout_ms: int = 1000,
                 secret: bytes | None = None) -> None:
        self.prefix = prefix
        self.seal = Seal(secret)
        self.min_acked, self.ack_timeout_ms = min_acked, ack_timeout_ms
        self.sentinels = bool(sentinels)
        self.redis = connect(url, sentinels, master)
        self.round_trips = 0  # leases and channels (redis_bus.py), counted with the store's

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

    async def close(self) -> None:
        await self.redis.aclose(close_connection_pool=True)
