"""Issue 49, item 1: no await between a bound's check and its count. On the Redis store
every round trip yields, so requests sent at once each passed a check made before an await
and were all counted after it: Bob's 20 concurrent listen streams (with taskIds, a store
read) all opened against a bound of 2 a principal and 10 in all, and Alice's was refused
for as long as he kept them. Each bound found with that shape is tested here with requests
sent at once, two principals each."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import aiohttp
from test_modern import envelope, headers_for

TOKENS = {"alice": "alice-token-bound-races", "bob": "bob-token-bound-races"}
TASKS = {"extensions": {"io.modelcontextprotocol/tasks": {}}}


def auth(who: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[who]}"}


def on_redis(redis_server: Any, key_prefix: str, **limits: Any) -> dict[str, Any]:
    return {"auth": {"bearer_tokens": list(TOKENS.values())},
            "store": {"backend": "redis", "url": redis_server.url, "key_prefix": key_prefix},
            "replica": {"secret": "a secret for the bound races"}, "limits": limits}


async def test_concurrent_listen_streams_stay_within_their_bounds(gateway, http, redis_server,
                                                                 key_prefix) -> None:
    url = await gateway(**on_redis(redis_server, key_prefix, max_listeners_per_owner=2,
                                   max_listeners=10))
    async with contextlib.AsyncExitStack() as held:
        async def listen(who: str, n: int) -> aiohttp.ClientResponse:
            params = {"notifications": {"taskIds": ["t-1"]}, "_meta": envelope(TASKS)}
            body = {"jsonrpc": "2.0", "id": f"{who}-{n}", "method": "subscriptions/listen",
                    "params": params}
            return await held.enter_async_context(http.post(
                url, json=body, headers={**headers_for("subscriptions/listen", params),
                                         **auth(who)}))
        bobs = await asyncio.gather(*(listen("bob", n) for n in range(20)))
        assert sorted(r.status for r in bobs) == [200] * 2 + [429] * 18
        alices = [await listen("alice", n) for n in range(2)]
        assert [r.status for r in alices] == [200, 200]  # Bob's flood left her places
