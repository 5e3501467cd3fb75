"""The promise through store incidents, on real processes: gateway replicas in front of their
stdio test servers, a real Redis server stopped, restarted empty, or failed over by real
Sentinels. A task whose handle was returned keeps its right end: an end the store did not
take waits in its replica's outbox (answered from there meanwhile) and is written once the
store is back; a store back empty gets every replica's records again; a failover loses no
acknowledged creation or end (store.min_replicas_acked)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from conftest import OPERATOR, RedisServer, Replica, free_port
from mcp_http import read
from prometheus_client.parser import text_string_to_metric_families
from test_modern import ask_round, headers_for, retry
from test_replicas import ALICE, BOB, ready_is
from test_tasks import TASKS, call, tasks_op, wait_for


async def outbox(http: aiohttp.ClientSession, replica: Replica) -> float:
    """What /metrics says the replica's outbox holds."""
    async with http.get(replica.url.replace("/mcp", "/metrics"), headers=OPERATOR) as resp:
        text = await resp.text()
    family, = (f for f in text_string_to_metric_families(text)
               if f.name == "mcp_gateway_store_outbox")
    return family.samples[0].value


async def eventually(check: Any, timeout_s: float = 15) -> None:
    for _ in range(int(timeout_s * 10)):
        if await check():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"never: {check.__name__}")


async def test_an_end_made_while_the_store_is_down_survives_it_coming_back_empty(
        group, http, tmp_path) -> None:
    """The issue's incident: Redis stops while tasks run and restarts with nothing."""
    own = RedisServer()  # no persistence: it comes back empty
    own.start()
    try:
        a, b = await group(2, redis=own)
        short = (await call(http, a.url, "sleep", {"ms": 1000}, headers=ALICE)).body["result"]
        long = (await call(http, a.url, "sleep", {"ms": 5000}, headers=ALICE)).body["result"]
        own.stop()
        # The end is made while the store is down: the replica that ran it answers for it.
        done = await wait_for(http, a.url, short["taskId"], "completed", ALICE)
        assert done["result"]["content"][0]["text"] == "slept 1000"
        assert await outbox(http, a) == 1
        await ready_is(http, a, up=False)  # reported, not fatal: /readyz stays 200
        async with http.get(a.url.replace("/mcp", "/status"), headers=OPERATOR) as resp:
            assert "outbox: 1 change(s)" in await resp.text()
        # Another replica cannot read the store: a clear 503, and pass-through goes on.
        elsewhere = await tasks_op(http, b.url, "tasks/get", short["taskId"], ALICE)
        assert elsewhere.status == 503
        assert "task store is unavailable" in elsewhere.body["error"]["message"]
        echoed = await call(http, b.url, "echo", {"text": "still"}, headers=ALICE)
        assert echoed.body["result"]["content"][0]["text"] == "still"

        own.start()  # empty
        for task, text in ((short, "slept 1000"), (long, "slept 5000")):
            got = await wait_for_long(http, b.url, task["taskId"], "completed")
            assert got["result"]["content"][0]["text"] == text  # the right result, elsewhere
        await eventually(lambda: _is(outbox(http, a), 0))
        await ready_is(http, a, up=True)
    finally:
        own.stop()


async def _is(value: Any, expected: Any) -> bool:
    return await value == expected


async def wait_for_long(http: aiohttp.ClientSession, url: str, task_id: str, status: str,
                        timeout_s: float = 20) -> dict[str, Any]:
    """Like wait_for, over a longer time and through 503s (the store coming back)."""
    got: Any = None
    for _ in range(int(timeout_s * 10)):
        reply = await tasks_op(http, url, "tasks/get", task_id, ALICE)
        got = reply.body.get("result") or reply.body.get("error")
        if reply.status == 200 and got.get("status") == status:
            return got
        await asyncio.sleep(0.1)
    raise AssertionError(f"task never reached {status}: {got}")


async def test_a_running_task_goes_on_when_the_store_restarts_empty(group, http) -> None:
    own = RedisServer()
    own.start()
    try:
        a, b = await group(2, redis=own)
        task = (await call(http, a.url, "sleep", {"ms": 4000}, headers=ALICE)).body["result"]
        own.stop()
        own.start()  # back at once, with nothing: neither replica noticed an outage
        running = await wait_for_long(http, b.url, task["taskId"], "working")
        assert running["taskId"] == task["taskId"]  # written again by the replica running it
        done = await wait_for_long(http, b.url, task["taskId"], "completed")
        assert done["result"]["content"][0]["text"] == "slept 4000"
        # And a task made after it is served as ever.
        after = (await call(http, b.url, "sleep", {"ms": 400}, headers=ALICE)).body["result"]
        assert (await wait_for(http, a.url, after["taskId"], "completed", ALICE)
                )["result"]["content"][0]["text"] == "slept 400"
    finally:
        own.stop()


async def test_an_input_round_reaches_its_replica_while_the_store_is_down(group,
                                                                         http) -> None:
    """An MRTR retry landing on another replica is handed to the one holding its call at
    the address sealed in its requestState: no store is needed for it."""
    own = RedisServer()
    own.start()
    try:
        a, b = await group(2, redis=own)
        _, first = await ask_round(http, a.url, headers=ALICE)
        (key, _), = first["inputRequests"].items()
        own.stop()
        answer = {"action": "accept", "content": {"name": "Ada"}}
        done = await retry(http, b.url, first["requestState"], {key: answer}, ALICE)
        assert json.loads(done.body["result"]["content"][0]["text"]) == answer
    finally:
        own.stop()


# -- Sentinel: the store fails over, the tasks stay ---------------------------------------------
class SentinelSet:
    """A primary, a replica and three sentinels, all redis-server processes on loopback."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.primary, self.replica = RedisServer(), RedisServer()
        self.ports = [free_port() for _ in range(3)]
        self.sentinels: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        binary = shutil.which("redis-sentinel")
        if binary is None:
            pytest.fail("redis-sentinel is missing: run scripts/test.sh")
        self.primary.start()
        self.replica.start(["--replicaof", "127.0.0.1", str(self.primary.port)])
        for port in self.ports:
            conf = self.folder / f"sentinel-{port}.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndaemonize no\n"
                f"sentinel monitor mymaster 127.0.0.1 {self.primary.port} 2\n"
                "sentinel down-after-milliseconds mymaster 1000\n"
                "sentinel failover-timeout mymaster 5000\n"
                "sentinel parallel-syncs mymaster 1\n")
            self.sentinels.append(subprocess.Popen(
                [binary, str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    @property
    def addresses(self) -> list[str]:
        return [f"127.0.0.1:{port}" for port in self.ports]

    async def primary_port(self) -> int:
        proc = await asyncio.create_subprocess_exec(
            "redis-cli", "-p", str(self.ports[0]), "sentinel", "get-master-addr-by-name",
            "mymaster", stdout=asyncio.subprocess.PIPE)
        out, _ = await proc.communicate()
        lines = out.decode().split()
        return int(lines[1]) if len(lines) == 2 else 0

    def stop(self) -> None:
        for proc in self.sentinels:
            proc.kill()
            proc.wait(10)
        self.primary.stop()
        self.replica.stop()


@pytest.fixture
async def sentinel_set(tmp_path) -> Any:
    made = SentinelSet(tmp_path)
    made.start()
    try:
        yield made
    finally:
        made.stop()


@pytest.mark.slow
async def test_no_acknowledged_task_is_lost_when_the_primary_is_killed(
        group, http, sentinel_set) -> None:
    store = {"backend": "redis", "sentinels": sentinel_set.addresses,
             "sentinel_master": "mymaster", "min_replicas_acked": 1, "lease_ms": 1000}
    replicas = await group(2, store=store)
    for _ in range(100):  # the replica has synced: creations are acknowledged
        made = (await call(http, replicas[0].url, "sleep", {"ms": 300}, headers=ALICE)
                ).body["result"]
        if made.get("resultType") == "task":
            break
        await asyncio.sleep(0.1)
    acknowledged: dict[str, int] = {}  # task id -> the ms it sleeps

    async def create(i: int) -> None:
        ms = 400 + 100 * (i % 20)
        reply = await call(http, replicas[i % 2].url, "sleep", {"ms": ms}, headers=ALICE)
        result = reply.body.get("result") or {}
        if result.get("resultType") == "task":
            acknowledged[result["taskId"]] = ms
        else:  # not durable in time: answered inline, never a handle
            assert result.get("content", [{}])[0].get("text") == f"slept {ms}", reply.body

    for batch in range(0, 100, 20):  # on a loaded host a WAIT may time out: answered inline
        await asyncio.gather(*(create(i) for i in range(batch, batch + 20)))
        if len(acknowledged) >= 20:
            break
    assert len(acknowledged) >= 20
    old = sentinel_set.primary.port
    sentinel_set.primary.stop()  # kill -9, while tasks run
    creating = asyncio.gather(*(create(i) for i in range(100, 140)))
    for _ in range(200):
        if await sentinel_set.primary_port() not in (0, old):
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError("the sentinels never promoted the replica")
    await creating  # meanwhile the new primary has no replica: creations answer inline
    before = len(acknowledged)
    assert before >= 20
    # The old primary is back, as a replica of the new one: creations are durable again.
    sentinel_set.primary.start(["--replicaof", "127.0.0.1", str(sentinel_set.replica.port)])
    for i in range(140, 280):
        await create(i)
        if len(acknowledged) >= before + 5:
            break
        await asyncio.sleep(0.1)
    assert len(acknowledged) >= before + 5
    for task_id, ms in acknowledged.items():
        done = await wait_for_long(http, replicas[1].url, task_id, "completed", 30)
        assert done["result"]["content"][0]["text"] == f"slept {ms}", task_id
    for replica in replicas:
        await eventually(lambda r=replica: _is(outbox(http, r), 0), 30)


async def test_replicas_work_as_a_least_privileged_store_user(group, http, key_prefix) -> None:
    """deploy/ runs the store with a password (an ACL user, no default user): the gateway
    needs no command the `-@dangerous` category holds, and only its own keys and channels."""
    own = RedisServer()
    own.start(["--user", "default", "off", "--user", "gateway", "on", ">a store password",
               f"~{key_prefix}*", f"&{key_prefix}*", "+@all", "-@dangerous"])
    try:
        url = f"redis://gateway:a%20store%20password@127.0.0.1:{own.port}/0"
        a, b = await group(2, store={"backend": "redis", "url": url, "key_prefix": key_prefix,
                                     "lease_ms": 1000})
        task = (await call(http, a.url, "sleep", {"ms": 5000}, headers=ALICE)).body["result"]
        assert (await tasks_op(http, b.url, "tasks/cancel", task["taskId"], ALICE)).status == 200
        done = await wait_for_long(http, a.url, task["taskId"], "cancelled")
        assert done["status"] == "cancelled"
        async with http.get(a.url.replace("/mcp", "/readyz?detail"), headers=OPERATOR) as resp:
            store = (await resp.json())["store"]
        # Its round trips to the store are counted (an empty outbox once read as none).
        assert store["up"] is True and store["requests"] > 0
    finally:
        own.stop()


# -- a store back empty: ids not found answer "retry" until the write-back settles ---------
def _answer(reply: Any) -> str:
    """What a poller makes of one tasks/* answer: the task, "retry", the store away, or
    "not found" (which makes it give up: never right for a live task)."""
    body = reply.body
    if reply.status == 200 and "result" in body:
        return "task"
    error = body["error"]
    if reply.status == 503 and error["data"].get("reason") == "store_settling":
        assert error["code"] == -32000 and error["data"]["retryAfterMs"] > 0
        assert int(reply.headers["Retry-After"]) >= 1
        return "retry"
    if reply.status == 503 and "task store is unavailable" in error["message"]:
        return "unavailable"
    assert "not found" not in error["message"].lower(), body
    raise AssertionError(f"unexpected answer {reply.status}: {body}")


def _shape(reply: Any) -> tuple[Any, ...]:
    """An error answer as a caller sees it, whatever id it was about."""
    error = reply.body["error"]
    return (reply.status, error["code"], error["message"], reply.headers.get("Retry-After"),
            {k: v for k, v in (error.get("data") or {}).items() if k != "taskId"})


async def _alike(ask: Any, task_id: str) -> tuple[Any, ...]:
    """Bob asking for Alice's id gets what he gets for an unknown id asked just before or
    just after (the store settles between two requests at most once); what he got."""
    before = _shape(await ask("never-a-task-id"))
    bobs = _shape(await ask(task_id))
    after = _shape(await ask("never-a-task-id-either"))
    assert bobs in (before, after), (bobs, before, after)
    return bobs


@dataclass
class Incident:
    """Alice's modern and core tasks (4 s sleeps) run on replica a when the store restarts
    empty (the default lease: a beats every 3.3 s); she asks from her session on b (tasks
    are the principal's), Bob from his."""

    b: Replica
    modern_id: str
    alice_on_b: Any
    bob: Any
    core_id: str = ""

    async def legacy(self, session: Any, method: str, params: dict[str, Any]) -> Any:
        who = BOB if session is self.bob else ALICE
        return await session.send({"jsonrpc": "2.0", "id": 1, "method": method,
                                   "params": params}, **who)


@contextlib.asynccontextmanager
async def store_restarted_empty(group: Any, http: aiohttp.ClientSession, client: Any,
                                key_prefix: str) -> AsyncIterator[Incident]:
    own = RedisServer()  # no persistence: it comes back empty
    own.start()
    try:
        a, b = await group(2, store={"backend": "redis", "url": own.url,
                                     "key_prefix": key_prefix, "lease_ms": 10_000})
        modern_id = (await call(http, a.url, "sleep", {"ms": 4000}, headers=ALICE)
                     ).body["result"]["taskId"]
        alice, alice_on_b, bob = client(a.url), client(b.url), client(b.url)
        for session in (alice, alice_on_b):
            await session.initialize({}, version="2025-11-25", headers=ALICE)
        await bob.initialize({}, version="2025-11-25", headers=BOB)
        incident = Incident(b, modern_id, alice_on_b, bob)
        incident.core_id = (await incident.legacy(alice, "tools/call", {
            "name": "sleep", "arguments": {"ms": 4000}, "task": {}})
                            ).body["result"]["task"]["taskId"]
        own.stop()
        own.start()  # back at once, with nothing
        yield incident
    finally:
        own.stop()


async def test_a_live_task_never_reads_not_found_when_the_store_restarts_empty(
        group, http, client, key_prefix) -> None:
    """Issue 33: the store restarts empty while Alice's tasks run on replica a. Her modern
    task and her core task, polled on b throughout, read as themselves or "retry" (503,
    Retry-After), never "Task not found", and end with their right results. Bob, asking for
    her ids meanwhile in either era, gets exactly what he gets for ids that never existed:
    "retry" while the store settles, "not found" after."""
    async with store_restarted_empty(group, http, client, key_prefix) as incident:
        b, modern_id, core_id = incident.b, incident.modern_id, incident.core_id
        alice_on_b, bob, legacy = incident.alice_on_b, incident.bob, incident.legacy
        seen: list[str] = []
        bobs: list[tuple[Any, ...]] = []
        while True:
            modern_reply = await tasks_op(http, b.url, "tasks/get", modern_id, ALICE)
            core_reply = await legacy(alice_on_b, "tasks/get", {"taskId": core_id})
            seen += [_answer(modern_reply), _answer(core_reply)]
            bobs.append(await _alike(lambda i: tasks_op(http, b.url, "tasks/get", i, BOB),
                                     modern_id))
            await _alike(lambda i: tasks_op(http, b.url, "tasks/cancel", i, BOB), modern_id)
            for method in ("tasks/get", "tasks/result", "tasks/cancel"):
                bobs.append(await _alike(lambda i, m=method: legacy(bob, m, {"taskId": i}),
                                         core_id))
            if all(r.status == 200 and r.body["result"]["status"] == "completed"
                   for r in (modern_reply, core_reply)):
                break
            await asyncio.sleep(0.1)
        assert "retry" in seen  # b was asked before a had written its tasks back
        assert modern_reply.body["result"]["result"]["content"][0]["text"] == "slept 4000"
        result = await legacy(alice_on_b, "tasks/result", {"taskId": core_id})
        assert result.body["result"]["content"][0]["text"] == "slept 4000"
        # Both eras answered Bob "retry" while the store settled, as for any unknown id.
        assert {(shape[0], shape[1]) for shape in bobs} >= {(503, -32000)}
        # Settled: an id that never existed is "not found" again, Bob's look-ups too.
        unknown = await settled(http, b)
        assert unknown.body["error"]["message"] == "Task not found"
        assert _shape(await tasks_op(http, b.url, "tasks/get", modern_id, BOB)) == \
            _shape(unknown)


async def settled(http: aiohttp.ClientSession, b: Replica) -> Any:
    """Once b has settled: its answer to an id that never existed."""
    unknown = await tasks_op(http, b.url, "tasks/get", "never-a-task-id", BOB)
    for _ in range(300):
        if unknown.status != 503:
            break
        await asyncio.sleep(0.1)
        unknown = await tasks_op(http, b.url, "tasks/get", "never-a-task-id", BOB)
    return unknown


def _listed(reply: Any) -> Any:
    """A list's answer as a client reads it: "retry" (the store settling: 503, -32000,
    Retry-After), or the task ids a legacy tasks/list (200) holds."""
    if reply.status == 503:
        return _answer(reply)
    assert reply.status == 200, reply.body
    return [task["taskId"] for task in reply.body["result"]["tasks"]]


async def listen_on(http: aiohttp.ClientSession, url: str, task_ids: list[str],
                    who: dict[str, str]) -> Any:
    """A modern subscriptions/listen on `task_ids`: "retry", or the task ids its
    acknowledgment says it follows (the stream is closed then)."""
    params = {"notifications": {"taskIds": task_ids}, "_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": TASKS}}
    body = {"jsonrpc": "2.0", "id": "s", "method": "subscriptions/listen", "params": params}
    async with http.post(url, json=body, headers={
            **headers_for("subscriptions/listen", params), **who}) as resp:
        if resp.content_type == "application/json":
            return _answer(await read(resp))
        while not (line := (await asyncio.wait_for(resp.content.readline(), 5)).decode()
                   ).startswith("data:"):
            pass
    return json.loads(line[5:])["params"]["notifications"]["taskIds"]


async def test_task_lists_read_retry_while_the_store_settles_then_whole(
        group, http, client, key_prefix) -> None:
    """What the store lost is not listed until it is written back: while it settles, a
    legacy tasks/list and a modern listen on task ids answer "retry" (503, Retry-After) as a
    look-up does, never a list without Alice's tasks; settled, her lists are whole. Bob's
    never hold her tasks: "retry" alike, then his own (none)."""
    async with store_restarted_empty(group, http, client, key_prefix) as incident:
        b, ids = incident.b, [incident.modern_id]
        whole = [[incident.core_id], [], ids, []]  # Alice's and Bob's, each era

        async def lists() -> list[Any]:
            return [_listed(await incident.legacy(incident.alice_on_b, "tasks/list", {})),
                    _listed(await incident.legacy(incident.bob, "tasks/list", {})),
                    await listen_on(http, b.url, ids, ALICE),
                    await listen_on(http, b.url, ids, BOB)]
        seen = [await lists()]
        for _ in range(300):
            if seen[-1] == whole:
                break
            await asyncio.sleep(0.1)
            seen.append(await lists())
        assert "retry" in seen[0]  # asked before a had written its tasks back
        for answers in seen:  # each "retry" (or the store away a moment) or whole, never
            # a list short of a task
            assert all(got in ("retry", "unavailable", full)
                       for got, full in zip(answers, whole, strict=True)), answers
        assert seen[-1] == whole
