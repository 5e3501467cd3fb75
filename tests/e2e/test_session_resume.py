"""Legacy sessions outlive their replica (issue 35): three gateway replicas on one real Redis
server behind the shipped HAProxy configuration; the replica holding a client's session is
stopped (SIGTERM) or killed (-9), and the client's next request with the same session id is
served by another one. Its finished core tasks are read with their results, its running ones
failed with a reason; with auth, every session of the principal reaches its core tasks; a
session id presented with another principal's credential is 404 wherever it lands."""

from __future__ import annotations

import asyncio
import signal
from typing import Any

import aiohttp
import httpx2
from conftest import OPERATOR, Replica
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp_http import McpHttp, Reply
from test_load_balancer import POLICY, balancing

STRANDED = "the gateway replica running this task stopped"
CORE = "2025-11-25"


class Authed(McpHttp):
    """The raw client, sending one principal's token with every request."""

    def __init__(self, http: aiohttp.ClientSession, url: str, token: str) -> None:
        super().__init__(http, url)
        self.token = token

    def headers(self, **extra: str) -> dict[str, str]:
        return super().headers(Authorization=f"Bearer {self.token}", **extra)

    async def op(self, method: str, params: dict[str, Any] | None = None) -> Reply:
        return await self.send({"jsonrpc": "2.0", "id": next(self.ids), "method": method,
                                "params": params or {}})

    async def task(self, ms: int) -> str:
        reply = await self.op("tools/call", {"name": "sleep", "arguments": {"ms": ms},
                                             "task": {"ttl": 60_000}})
        return str(reply.message["result"]["task"]["taskId"])

    async def status(self, task_id: str, wanted: str) -> dict[str, Any]:
        """tasks/get until the task is `wanted` (a bounded wait)."""
        for _ in range(200):
            got = (await self.op("tasks/get", {"taskId": task_id})).message["result"]
            if got["status"] == wanted:
                return dict(got)
            await asyncio.sleep(0.05)
        raise AssertionError(f"task {task_id} is {got['status']}, never {wanted}")


def presenting(http: aiohttp.ClientSession, url: str, token: str, of: McpHttp) -> Authed:
    """A client that presents another's session id with its own credential."""
    other = Authed(http, url, token)
    other.session_id, other.version = of.session_id, of.version
    return other


async def counters(http: aiohttp.ClientSession, replica: Replica) -> dict[str, int]:
    base = replica.url.removesuffix("/mcp")
    async with http.get(base + "/readyz?detail", headers=OPERATOR) as resp:
        return dict((await resp.json())["counters"])


async def holder_of(http: aiohttp.ClientSession, replicas: list[Replica]) -> Replica:
    """The replica that made the one session of the test."""
    made = [r for r in replicas if (await counters(http, r)).get("sessions.created")]
    assert len(made) == 1
    return made[0]


async def adopted_elsewhere(http: aiohttp.ClientSession, others: list[Replica]) -> list[int]:
    """Per surviving replica: sessions adopted and sessions created (no new session)."""
    seen = [await counters(http, r) for r in others]
    return [sum(c.get("sessions.adopted", 0) for c in seen),
            sum(c.get("sessions.created", 0) for c in seen)]


async def outlived(group: Any, http: aiohttp.ClientSession, sig: int, expected: str
                   ) -> None:
    """Alice's session survives its replica stopped by `sig`; her running task ends failed
    saying `expected`; Bob, with Alice's session id, is 404 everywhere."""
    replicas = await group(3, tasks=POLICY)
    async with balancing(replicas) as url:
        alice = Authed(http, url, "alice-token")
        await alice.initialize(version=CORE)
        holder = await holder_of(http, replicas)
        done = await alice.task(50)
        await alice.status(done, "completed")
        running = await alice.task(60_000)
        holder.stop(sig)
        others = [r for r in replicas if r is not holder]
        # Bob on a replica that never held the session, then through the balancer.
        for where in (others[0].url, url):
            assert (await presenting(http, where, "bob-token", alice).op("tools/list")
                    ).status == 404
        result = (await alice.op("tasks/result", {"taskId": done})).message["result"]
        assert result["content"][0]["text"] == "slept 50"
        failed = await alice.status(running, "failed")
        assert expected in failed["statusMessage"]
        listed = (await alice.op("tasks/list")).message["result"]["tasks"]
        assert {t["taskId"] for t in listed} == {done, running}
        echoed = await alice.op("tools/call", {"name": "echo", "arguments": {"text": "on"}})
        assert echoed.message["result"]["content"][0]["text"] == "on"
        assert await adopted_elsewhere(http, others) == [1, 0]  # the same session, adopted
        for where in (url, *(r.url for r in others)):  # held now, still not Bob's
            assert (await presenting(http, where, "bob-token", alice).op("tools/list")
                    ).status == 404


async def test_a_session_outlives_its_replica_stopped_by_sigterm(group, http) -> None:
    await outlived(group, http, signal.SIGTERM, "the gateway is stopping")


async def test_a_session_outlives_its_replica_killed(group, http) -> None:
    await outlived(group, http, signal.SIGKILL, STRANDED)


async def test_the_principals_core_tasks_reach_every_session_of_it(group, http) -> None:
    """With auth, core tasks are the principal's: another session of Alice's on another
    replica lists, reads, waits on and cancels them; Bob's session finds none."""
    a, b = await group(2, tasks=POLICY)
    first, second = Authed(http, a.url, "alice-token"), Authed(http, b.url, "alice-token")
    bob = Authed(http, b.url, "bob-token")
    for client in (first, second, bob):
        await client.initialize(version=CORE)
    short, long = await first.task(300), await first.task(60_000)
    waited = (await second.op("tasks/result", {"taskId": short})).message["result"]
    assert waited["content"][0]["text"] == "slept 300"  # waited for on the other replica
    listed = (await second.op("tasks/list")).message["result"]["tasks"]
    assert {t["taskId"] for t in listed} == {short, long}
    cancelled = (await second.op("tasks/cancel", {"taskId": long})).message["result"]
    assert cancelled["status"] == "cancelled"
    assert (await first.status(long, "cancelled"))["status"] == "cancelled"
    assert (await bob.op("tasks/list")).message["result"]["tasks"] == []
    unknown = (await bob.op("tasks/get", {"taskId": "no-such-task"})).message["error"]
    foreign = (await bob.op("tasks/get", {"taskId": short})).message["error"]
    assert foreign["code"] == unknown["code"] == -32602
    assert foreign["message"] == unknown["message"]


async def test_without_auth_core_tasks_stay_with_their_session(gateway, client) -> None:
    url = await gateway(tasks=POLICY)
    first, second = client(url), client(url)
    for c in (first, second):
        await c.initialize(version=CORE)
    made = await first.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "sleep", "arguments": {"ms": 10}, "task": {"ttl": 60_000}}})
    task_id = made.message["result"]["task"]["taskId"]
    other = await second.send({"jsonrpc": "2.0", "id": 2, "method": "tasks/get",
                               "params": {"taskId": task_id}})
    assert other.message["error"]["code"] == -32602
    assert (await second.send({"jsonrpc": "2.0", "id": 3, "method": "tasks/list",
                               "params": {}})).message["result"]["tasks"] == []


async def test_a_deleted_session_ends_on_every_replica(group, http) -> None:
    a, b = await group(2, tasks=POLICY)
    alice = Authed(http, a.url, "alice-token")
    await alice.initialize(version=CORE)
    elsewhere = presenting(http, b.url, "alice-token", alice)
    assert (await elsewhere.op("tools/list")).status == 200  # adopted on b
    async with http.delete(a.url, headers=alice.headers()) as resp:
        assert resp.status == 200
    fresh = presenting(http, a.url, "alice-token", alice)
    assert (await fresh.op("tools/list")).status == 404


async def test_the_python_sdk_goes_on_with_its_session_after_a_sigterm(group, http) -> None:
    """The official Python SDK (mcp 2.x, legacy mode) behind the balancer: its session's
    replica is stopped; its next calls go on in the same session, elsewhere."""
    replicas = await group(3, tasks=POLICY)
    async with balancing(replicas) as url:
        token = {"Authorization": "Bearer alice-token"}
        async with create_mcp_http_client(headers=token, timeout=httpx2.Timeout(
                10, read=60)) as through, Client(streamable_http_client(
                    url, http_client=through), mode="legacy") as sdk:
            assert (await sdk.call_tool("echo", {"text": "before"})).content[0].text == "before"
            holder = await holder_of(http, replicas)
            holder.stop(signal.SIGTERM)
            after = await asyncio.wait_for(sdk.call_tool("echo", {"text": "after"}), 20)
            assert after.content[0].text == "after"
            assert (await sdk.call_tool("sleep", {"ms": 10})).content[0].text == "slept 10"
            others = [r for r in replicas if r is not holder]
            assert await adopted_elsewhere(http, others) == [1, 0]

