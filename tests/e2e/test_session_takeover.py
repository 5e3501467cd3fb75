"""Issue 35's resumable sessions attacked by Bob, who holds one valid token and Alice's
session id, and checked where Alice's own traffic meets a replica that adopts: real gateway
replicas on a real Redis server, the shipped HAProxy in front where the balancer matters.

Bob on Alice's session must get exactly what an unknown id gets, on every replica and in
every state of the store; Alice's requests that race an adoption are served; after an
adoption the balancer learns the adopting replica."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import signal
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from conftest import RedisServer
from mcp_http import BASIC
from test_load_balancer import POLICY, balancing
from test_session_resume import Authed, adopted_elsewhere, counters, holder_of, presenting

CORE = "2025-11-25"


async def test_during_a_store_outage_bob_on_alices_session_gets_what_an_unknown_id_gets(
        group, http) -> None:
    """With the store down a replica cannot tell an unknown id from a live one it does not
    hold (a 503: try again); Alice's session held right there must look the same to Bob,
    not a 404 that says "this one is live here"."""
    own = RedisServer()
    own.start()
    try:
        (a,) = await group(1, tasks=POLICY, redis=own)
        alice = Authed(http, a.url, "alice-token")
        await alice.initialize(version=CORE)
        own.stop()
        bob = presenting(http, a.url, "bob-token", alice)
        unknown = Authed(http, a.url, "bob-token")
        unknown.session_id, unknown.version = secrets.token_urlsafe(32), CORE
        for method in ("tools/list", "ping"):
            on_alices, on_unknown = await bob.op(method), await unknown.op(method)
            assert on_alices.status == on_unknown.status == 503
            assert on_alices.body == on_unknown.body
        async with http.delete(a.url, headers=bob.headers()) as on_alices, \
                http.delete(a.url, headers=unknown.headers()) as on_unknown:
            assert on_alices.status == on_unknown.status == 503
        # Alice's own session goes on where it is held: pass-through needs no store.
        assert (await alice.op("tools/list")).status == 200
    finally:
        own.stop()


async def test_requests_racing_an_adoption_are_served(group, http) -> None:
    """Alice's replica went away; her client's next requests come together to another one
    (parallel calls, a notification). Those arriving while the adopting replica starts
    her session's own upstream process must wait for it, not meet a half-made session."""
    own_process = {"command": BASIC[0], "args": BASIC[1:], "isolation": "client"}
    a, b = await group(2, tasks=POLICY, upstreams={"main": own_process})
    alice = Authed(http, a.url, "alice-token")
    await alice.initialize(version=CORE)
    elsewhere = presenting(http, b.url, "alice-token", alice)

    async def later(i: int) -> int:
        await asyncio.sleep(0.02 * i)  # spread over the adopting replica's process start
        return (await elsewhere.op("tools/list")).status
    assert await asyncio.gather(*(later(i) for i in range(12))) == [200] * 12
    assert (await counters(http, b)).get("sessions.adopted") == 1


async def test_the_balancer_keeps_an_adopted_session_on_the_adopting_replica(group,
                                                                           http) -> None:
    """After the replica holding Alice's session stops, HAProxy (which sticks on the
    answer's Mcp-Session-Id, deploy/haproxy.cfg) learns the replica that adopted it from
    that replica's first answer, JSON ones included: one adoption, not one per replica."""
    replicas = await group(3, tasks=POLICY)
    async with balancing(replicas) as url:
        alice = Authed(http, url, "alice-token")
        await alice.initialize(version=CORE)
        holder = await holder_of(http, replicas)
        holder.stop(signal.SIGTERM)
        for _ in range(6):  # answered as JSON by the gateway itself: ping, tasks/list
            for method in ("ping", "tasks/list"):
                reply = await alice.op(method)
                assert reply.status == 200
                assert reply.headers.get("Mcp-Session-Id") == alice.session_id
        others = [r for r in replicas if r is not holder]
        assert await adopted_elsewhere(http, others) == [1, 0]


async def test_a_session_deleted_on_one_replica_ends_at_once_where_a_copy_is_held(group,
                                                                                 http) -> None:
    """DELETE ends the session everywhere: a replica holding a copy (it adopted it) is told
    over the replicas' bus, and stops serving it long before its next renewal would have
    found the record gone (app.REAP_EVERY_S: 30 s)."""
    a, b = await group(2, tasks=POLICY)
    alice = Authed(http, a.url, "alice-token")
    await alice.initialize(version=CORE)
    copy = presenting(http, b.url, "alice-token", alice)
    assert (await copy.op("tools/list")).status == 200  # b holds a copy now
    async with http.delete(a.url, headers=alice.headers()) as resp:
        assert resp.status == 200
    for _ in range(100):  # a bounded wait for the announcement (no speed is asserted)
        if (await copy.op("ping")).status == 404:
            break
        await asyncio.sleep(0.05)
    assert (await copy.op("ping")).status == 404
    assert (await presenting(http, a.url, "alice-token", alice).op("ping")).status == 404


async def test_bob_deleting_alices_session_gets_404_and_ends_nothing(group, http) -> None:
    """On the replica holding it, on one holding a copy and on one that never held it: the
    404 of an unknown id, and Alice's session goes on everywhere."""
    a, b, c = await group(3, tasks=POLICY)
    alice = Authed(http, a.url, "alice-token")
    await alice.initialize(version=CORE)
    assert (await presenting(http, b.url, "alice-token", alice).op("ping")).status == 200
    unknown = Authed(http, a.url, "bob-token")
    unknown.session_id, unknown.version = secrets.token_urlsafe(32), CORE
    async with http.delete(a.url, headers=unknown.headers()) as resp:
        assert resp.status == 404
        expected = await resp.json()
    for where in (a, b, c):
        bob = presenting(http, where.url, "bob-token", alice)
        async with http.delete(where.url, headers=bob.headers()) as resp:
            assert resp.status == 404 and await resp.json() == expected
    for where in (a, b, c):
        assert (await presenting(http, where.url, "alice-token", alice).op("ping")
                ).status == 200


async def test_initializes_that_failed_upstream_take_no_share_of_the_principal(
        group, http, tmp_path) -> None:
    """A session whose upstream could not be reached at initialize was never the client's
    (it got a 503 and no id): its record must not hold one of the principal's sessions
    across replicas, or a few retries during an upstream outage lock the principal out."""
    up = tmp_path / "up"
    up.touch()
    server = ["/bin/sh", "-c", f'test -e {up} || exit 3; exec "$0" "$@"', *BASIC]
    own_process = {"command": server[0], "args": server[1:], "isolation": "client"}
    (a,) = await group(1, tasks=POLICY, upstreams={"main": own_process},
                       limits={"max_sessions_per_principal": 2})
    up.unlink()  # each session's own process fails to start from now on
    def initialize() -> Any:
        return Authed(http, a.url, "alice-token").op("initialize", {
            "protocolVersion": CORE, "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"}})
    for _ in range(3):
        failed = await initialize()
        assert failed.status == 503 and "Mcp-Session-Id" not in failed.headers
    up.touch()
    for _ in range(2):  # her whole share is hers still
        made = await initialize()
        assert made.status == 200, made.body


async def test_without_auth_core_tasks_stay_the_sessions_on_every_replica(group, http,
                                                                        client) -> None:
    """No auth: every caller is one anonymous principal, so the session id alone stands
    for the owner. Another session (on any replica) finds none of its tasks; the same
    session adopted on another replica finds them all."""
    a, b = await group(2, tasks=POLICY, auth={"bearer_tokens": []})
    first, other = client(a.url), client(b.url)
    for c in (first, other):
        await c.initialize(version=CORE)
    made = await first.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "sleep", "arguments": {"ms": 10}, "task": {"ttl": 60_000}}})
    task_id = made.message["result"]["task"]["taskId"]

    async def ask(c: Any, method: str, params: dict[str, Any]) -> Any:
        return (await c.send({"jsonrpc": "2.0", "id": 2, "method": method,
                              "params": params})).message
    assert (await ask(other, "tasks/get", {"taskId": task_id}))["error"]["code"] == -32602
    assert (await ask(other, "tasks/list", {}))["result"]["tasks"] == []
    adopted = client(b.url)
    adopted.session_id, adopted.version = first.session_id, first.version
    listed = (await ask(adopted, "tasks/list", {}))["result"]["tasks"]
    assert [t["taskId"] for t in listed] == [task_id]


def children(pid: int) -> int:
    """How many processes `pid` runs now (its upstream servers)."""
    count = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            count += int(stat.read_text().rpartition(")")[2].split()[1]) == pid
    return count


async def test_a_delete_racing_an_adoption_leaves_no_upstream_behind(group, http) -> None:
    """Alice's DELETE reaches a replica while it adopts her session (its own upstream
    process starting): the session ends after the adoption, its process with it, rather
    than the adoption finishing on an ended session and keeping a process nobody ends."""
    own_process = {"command": BASIC[0], "args": BASIC[1:], "isolation": "client"}
    a, b = await group(2, tasks=POLICY, upstreams={"main": own_process})
    alice = Authed(http, a.url, "alice-token")
    await alice.initialize(version=CORE)
    assert b.proc is not None
    alone = children(b.proc.pid)  # its primary process only
    elsewhere = presenting(http, b.url, "alice-token", alice)

    async def delete() -> int:
        await asyncio.sleep(0.05)  # within the adoption's process start
        async with http.delete(b.url, headers=elsewhere.headers()) as resp:
            return resp.status
    listed, deleted = await asyncio.gather(elsewhere.op("tools/list"), delete())
    assert (listed.status, deleted) == (200, 200)
    assert (await elsewhere.op("ping")).status == 404
    for _ in range(100):  # a bounded wait for the process to be reaped
        if children(b.proc.pid) == alone:
            break
        await asyncio.sleep(0.05)
    assert children(b.proc.pid) == alone


async def test_a_session_record_is_bounded_in_the_shared_store(group, http, redis_server,
                                                               key_prefix) -> None:
    """One token must not fill the store every tenant shares (and the renewal traffic of
    every reap) with megabytes per session: of a client's info only its name, title and
    version are kept (nothing but logs reads it); capabilities too big to keep are refused
    with a clear error, before any session is made."""
    a, b = await group(2, tasks=POLICY)
    icons = [{"src": "data:image/png;base64," + "A" * 200_000}]
    alice = Authed(http, a.url, "alice-token")
    made = await alice.op("initialize", {
        "protocolVersion": CORE, "capabilities": {},
        "clientInfo": {"name": "big", "version": "1", "icons": icons}})
    assert made.status == 200
    alice.session_id, alice.version = made.headers["Mcp-Session-Id"], CORE
    # Adopted elsewhere all the same.
    assert (await presenting(http, b.url, "alice-token", alice).op("ping")).status == 200
    redis = aioredis.from_url(redis_server.url)
    try:
        sizes = [await redis.strlen(k) async for k in redis.scan_iter(f"{key_prefix}s:*")]
    finally:
        await redis.aclose()
    assert len(sizes) == 1 and sizes[0] < 16 * 1024
    refused = await Authed(http, a.url, "alice-token").op("initialize", {
        "protocolVersion": CORE, "capabilities": {"experimental": {"blob": "A" * 200_000}},
        "clientInfo": {"name": "t", "version": "1"}})
    # 400, as on the memory store (issue 41: one cap for both; test_session_copies.py).
    assert refused.status == 400 and "Mcp-Session-Id" not in refused.headers
    assert refused.body["error"]["code"] == -32602
    assert "capabilities" in refused.body["error"]["message"]
