"""A retry handed to another replica (issue 41, item 7; docs/security.md): it goes only to
the address sealed with its requestState, never to one read from the store, and it carries
no client credential: the replicas vouch for the caller with their shared secret. Real
gateway processes on a real Redis server (conftest's replica fixtures); the listeners here
are the test's own."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
import redis.asyncio
from aiohttp import web
from conftest import BASIC, REPLICA_POLICY, Replica, free_port
from test_modern import ask_round, retry

STRONG = {"alice": "alice-" + "a" * 40, "bob": "bob-" + "b" * 40}  # beyond loopback: long
ANSWER = {"action": "accept", "content": {"name": "Ada"}}


def bearer(who: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {STRONG[who]}"}


class Listener:
    """A listener the test owns: it records each request, and forwards it to `to` if set
    (a recording hop in front of a replica), else answers 502."""

    def __init__(self, to: str | None = None) -> None:
        self.to = to
        self.edit: Callable[[bytes], bytes] = lambda body: body  # what the hop forwards
        self.port = free_port()
        self.heard: list[tuple[dict[str, str], bytes]] = []
        self.runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.heard.append((dict(request.headers), body))
        if self.to is None:
            return web.Response(status=502)
        headers = {k: v for k, v in request.headers.items()
                   if k.lower() not in ("host", "content-length")}
        async with aiohttp.ClientSession() as http, http.post(
                self.to + request.path, data=self.edit(body), headers=headers) as answer:
            return web.Response(status=answer.status, body=await answer.read(),
                                content_type=answer.content_type)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    def carried_a_token(self) -> bool:
        return any(token in json.dumps(headers) or token.encode() in body
                   for headers, body in self.heard for token in STRONG.values())


def replica(name: str, redis_url: str, prefix: str, **replica_conf: Any) -> Replica:
    """A replica whose `replica` settings (and bind host) are the test's to say."""
    conf = {"upstreams": {"main": {"command": BASIC[0], "args": BASIC[1:]}},
            "tasks": REPLICA_POLICY, "auth": {"bearer_tokens": list(STRONG.values())},
            "store": {"backend": "redis", "url": redis_url, "key_prefix": prefix,
                      "lease_ms": 1000},
            "security": {"allowed_hosts": ["127.0.0.1"]}, "logging": {"level": "warning"}}
    made = Replica(name, conf)
    with open(made.config) as f:
        written = json.load(f)
    host = replica_conf.pop("host", "127.0.0.1")
    written["listen"]["host"] = host
    written["replica"] = {"id": name, "secret": "a secret every replica shares",
                          **replica_conf}
    with open(made.config, "w") as f:
        json.dump(written, f)
    return made


@pytest.fixture
async def made() -> Any:
    started: list[Replica] = []
    listeners: list[Listener] = []
    yield started, listeners
    for r in started:
        r.stop()
        os.unlink(r.config)
    for listener in listeners:
        await listener.stop()


async def test_a_lease_rewritten_in_the_store_collects_no_token(made, redis_server,
                                                               key_prefix, http) -> None:
    """Before: a holder without replica.url (bound to 0.0.0.0) sealed no address in its
    states, and the retry went to the address in its lease key, with Alice's token."""
    started, listeners = made
    trap = Listener()
    await trap.start()
    listeners.append(trap)
    a = replica("r0", redis_server.url, key_prefix, host="0.0.0.0")
    b = replica("r1", redis_server.url, key_prefix)
    started += [a, b]
    await asyncio.gather(a.start(), b.start())
    _, first = await ask_round(http, a.url, headers=bearer("alice"))
    (key, _), = first["inputRequests"].items()
    store = redis.asyncio.from_url(redis_server.url)
    lease = f"{key_prefix}lease:r0"

    async def rewrite() -> None:  # faster than r0's heartbeat writes it back
        while True:
            await store.set(lease, trap.url, px=1000)
            await asyncio.sleep(0.01)
    writer = asyncio.ensure_future(rewrite())
    try:
        await asyncio.sleep(0.05)
        gone = await retry(http, b.url, first["requestState"], {key: ANSWER},
                           bearer("alice"))
    finally:
        writer.cancel()
        await store.aclose()
    assert gone.status == 400 and "without requestState" in gone.body["error"]["message"]
    assert trap.heard == []


async def relayed_through(hop: Listener, made: Any, redis_server: Any, key_prefix: str,
                          http: aiohttp.ClientSession) -> tuple[Replica, Any]:
    """Alice's input round on r0 (its replica.url the test's `hop` in front of it), her
    retry sent to r1, which relays it through the hop: r0 and r1's answer."""
    started, listeners = made
    a = replica("r0", redis_server.url, key_prefix, url=hop.url)
    hop.to = f"http://127.0.0.1:{a.port}"
    await hop.start()
    listeners.append(hop)
    b = replica("r1", redis_server.url, key_prefix)
    started += [a, b]
    await asyncio.gather(a.start(), b.start())
    _, first = await ask_round(http, a.url, headers=bearer("alice"))
    (key, _), = first["inputRequests"].items()
    return a, await retry(http, b.url, first["requestState"], {key: ANSWER}, bearer("alice"))


async def test_a_relayed_retry_carries_no_client_credential(made, redis_server, key_prefix,
                                                            http) -> None:
    """The relay to the sealed address (here a hop the test owns, in front of the holder)
    carries the replicas' seal instead of Alice's token, and the holder takes it."""
    a_port_hop = Listener()
    a, done = await relayed_through(a_port_hop, made, redis_server, key_prefix, http)
    assert json.loads(done.body["result"]["content"][0]["text"]) == ANSWER
    assert len(a_port_hop.heard) == 1 and not a_port_hop.carried_a_token()
    headers, body = a_port_hop.heard[0]
    assert "Authorization" not in headers and "Mcp-Gateway-Relayed" in headers
    # A seal replayed for another request, or made up, opens nothing: 401.
    for seal in (headers["Mcp-Gateway-Relayed"], "forged"):
        async with http.post(a.url, data=body, headers={
                **{k: v for k, v in headers.items() if k.lower() not in (
                    "host", "content-length", "mcp-name")},
                "Mcp-Name": "echo", "Mcp-Gateway-Relayed": seal}) as refused:
            assert refused.status == 401
    # Nor does the very relay sent again whole: a seal opens once, and for its replica
    # only (r1 is another); nor on a GET of the same path.
    same = {k: v for k, v in headers.items() if k.lower() not in ("host", "content-length")}
    for other in (a.url, made[0][-1].url):
        async with http.post(other, data=body, headers=same) as again:
            assert again.status == 401
    async with http.get(a.url, headers=same) as got:
        assert got.status == 401


async def test_a_relay_seal_vouches_for_its_own_body_only(made, redis_server, key_prefix,
                                                          http) -> None:
    """A hop that changes the relayed body (one byte, here a space) gets the holder's 401,
    and Alice's retry is not taken on the altered body."""
    hop = Listener()
    hop.edit = lambda body: body.replace(b'"id":', b'"id": ', 1)
    _, done = await relayed_through(hop, made, redis_server, key_prefix, http)
    assert len(hop.heard) == 1 and done.status == 401, done.body
