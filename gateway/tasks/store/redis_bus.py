"""The `ReplicaBus` of replicas sharing a Redis store, over the store's own server: leases
and channels are the link's (redis_link.py); the tasks a gone replica left running are read
from the store's records, and the records announced on the events channel are kept by the
store (so every replica reads them, and writes ends back, without a round trip).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.tasks.store import Beat, Handler
from gateway.tasks.store.redis import RedisStore


class RedisBus:
    def __init__(self, store: RedisStore) -> None:
        self.store = store
        self.link = store.link

    async def beat(self, replica: str, lease_ms: int, address: str = "") -> Beat:
        return await self.link.beat(replica, lease_ms, address)

    async def generation(self) -> str | None:
        return await self.link.generation()

    async def rejoined(self, replica: str, generation: str, lease_ms: int) -> None:
        await self.link.rejoined(replica, generation, lease_ms)

    async def address(self, replica: str) -> str | None:
        return await self.link.address(replica)

    async def leave(self, replica: str) -> None:
        await self.link.leave(replica)

    async def alive(self, replica: str) -> bool:
        return await self.link.alive(replica)

    async def stranded(self, replica: str | None = None) -> list[str]:
        return await self.store.stranded(replica)

    async def publish(self, channel: str, message: dict[str, Any]) -> None:
        await self.link.publish(channel, message)

    async def listen(self, channels: list[str], handler: Handler,
                     joined: Callable[[], None] | None = None) -> None:
        await self.link.listen(channels, handler, self.store.heard, joined)


__all__ = ["RedisBus"]
