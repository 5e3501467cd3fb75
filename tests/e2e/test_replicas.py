"""Replicas sharing a real Redis-compatible server: three gateway processes on loopback, each
in front of its own stdio test server, reached over real HTTP by task-capable clients of
the tasks extension. A task made on one is read, answered and cancelled on the others; a
replica killed mid-task leaves its task failed, not working forever; finished results
outlive every replica's restart; a store that goes away gives clear errors and comes back."""

from __future__ import annotations

import asyncio
import json
import signal
from typing import Any

import aiohttp
import orjson
import pytest
import redis.asyncio
from conftest import OPERATOR, REPLICA_POLICY, RedisServer, Replica
from mcp_http import BASIC
from test_modern import ask_round, headers_for, retry
from test_tasks import TASKS, call, tasks_op, wait_for

from gateway.observability import owner_hash

ALICE, BOB = {"Authorization": "Bearer alice-token"}, {"Authorization": "Bearer bob-token"}


async def cancelled_upstream(http: aiohttp.ClientSession, replica: Replica) -> list[Any]:
    """Request ids the replica's own stdio server was told to cancel."""
    reply = await call(http, replica.url, "cancelled", caps={}, headers=ALICE)
    return json.loads(reply.body["result"]["content"][0]["text"])


async def test_made_on_one_read_answered_and_cancelled_on_others(group, http) -> None:
    a, b, c = await group(3)
    caps = {**TASKS, "elicitation": {}}
    asked = (await call(http, a.url, "ask", {"message": "Name?"}, caps, ALICE)).body["result"]
    waiting = await wait_for(http, b.url, asked["taskId"], "input_required", ALICE)
    (key, request), = waiting["inputRequests"].items()
    assert request["params"]["message"] == "Name?"
    answer = {"action": "accept", "content": {"name": "Ada"}}
    ack = await tasks_op(http, c.url, "tasks/update", asked["taskId"], ALICE,
                         inputResponses={key: answer})
    assert ack.body["result"] == {"resultType": "complete"}
    done = await wait_for(http, b.url, asked["taskId"], "completed", ALICE)
    assert json.loads(done["result"]["content"][0]["text"]) == answer  # a's server got it

    slow = (await call(http, a.url, "sleep", {"ms": 20_000}, headers=ALICE)).body["result"]
    assert (await tasks_op(http, b.url, "tasks/cancel", slow["taskId"], ALICE)).status == 200
    for replica in (a, b, c):
        got = await wait_for(http, replica.url, slow["taskId"], "cancelled", ALICE)
        assert got["status"] == "cancelled"
    for _ in range(100):
        if await cancelled_upstream(http, a):
            break
        await asyncio.sleep(0.05)
    assert len(await cancelled_upstream(http, a)) == 1  # notifications/cancelled reached it
    assert await cancelled_upstream(http, b) == []


async def test_a_listen_stream_on_one_replica_hears_of_a_task_run_on_another(group,
                                                                            http) -> None:
    a, b = await group(2)
    task = (await call(http, a.url, "sleep", {"ms": 800}, headers=ALICE)).body["result"]
    params = {"notifications": {"taskIds": [task["taskId"]]},
              "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                        "io.modelcontextprotocol/clientCapabilities": TASKS}}
    body = {"jsonrpc": "2.0", "id": "s", "method": "subscriptions/listen", "params": params}
    async with http.post(b.url, json=body, headers={
            **headers_for("subscriptions/listen", params), **ALICE}) as stream:
        pushed: list[dict[str, Any]] = []
        while not pushed or pushed[-1]["status"] != "completed":
            line = (await asyncio.wait_for(stream.content.readline(), 5)).decode()
            if line.startswith("data:") and "notifications/tasks" in line:
                pushed.append(json.loads(line[5:])["params"])
    assert pushed[-1]["taskId"] == task["taskId"]
    assert pushed[-1]["result"]["content"][0]["text"] == "slept 800"


async def test_an_input_round_answered_on_another_replica(group, http) -> None:
    """An MRTR retry reaching another replica than the one holding its parked call is
    handed to that one; with no way to reach it, the client is told to start afresh."""
    a, b, c = await group(3)
    _, first = await ask_round(http, a.url, headers=ALICE)
    (key, _), = first["inputRequests"].items()
    answer = {"action": "accept", "content": {"name": "Ada"}}
    done = await retry(http, b.url, first["requestState"], {key: answer}, ALICE)
    assert json.loads(done.body["result"]["content"][0]["text"]) == answer
    _, second = await ask_round(http, a.url, headers=ALICE)
    a.stop(signal.SIGKILL)
    gone = await retry(http, c.url, second["requestState"], {key: answer}, ALICE)
    assert gone.status == 400 and "without requestState" in gone.body["error"]["message"]


async def test_the_bind_address_is_where_other_replicas_hand_a_retry(group, http) -> None:
    """Issue 21: replica.url defaults to listen.host:port when that names one address, so
    a retry reaches the replica holding its call with no extra setting."""
    a, b = await group(2, address=False)
    _, first = await ask_round(http, a.url, headers=ALICE)
    (key, _), = first["inputRequests"].items()
    answer = {"action": "accept", "content": {"name": "Ada"}}
    done = await retry(http, b.url, first["requestState"], {key: answer}, ALICE)
    assert json.loads(done.body["result"]["content"][0]["text"]) == answer


async def test_a_foreign_owner_finds_nothing_on_any_replica(group, http) -> None:
    replicas = await group(3)
    task = (await call(http, replicas[0].url, "sleep", {"ms": 1000}, headers=ALICE)
            ).body["result"]
    for replica in replicas:
        reply = await tasks_op(http, replica.url, "tasks/get", task["taskId"], BOB)
        assert reply.body["error"]["code"] == -32602
        assert "not found" in reply.body["error"]["message"].lower()


async def test_a_killed_replica_leaves_its_task_failed_not_working(group, http) -> None:
    a, b = await group(2)
    task = (await call(http, a.url, "sleep", {"ms": 60_000}, headers=ALICE)).body["result"]
    assert (await tasks_op(http, b.url, "tasks/get", task["taskId"], ALICE)
            ).body["result"]["status"] == "working"
    a.stop(signal.SIGKILL)
    loop = asyncio.get_running_loop()
    began = loop.time()
    failed = await wait_for(http, b.url, task["taskId"], "failed", ALICE)
    assert loop.time() - began < 1.0 + 4  # the lease, plus a second or two (and slack)
    assert "replica" in failed["statusMessage"] and "stopped" in failed["statusMessage"]


async def test_a_stopped_replica_writes_its_tasks_end_before_it_goes(group, http) -> None:
    a, b = await group(2)
    task = (await call(http, a.url, "sleep", {"ms": 60_000}, headers=ALICE)).body["result"]
    a.stop(signal.SIGTERM)  # returns once the process has exited
    got = (await tasks_op(http, b.url, "tasks/get", task["taskId"], ALICE)).body["result"]
    assert got["status"] == "failed" and "stopping" in got["statusMessage"]


async def test_finished_results_outlive_every_replica_restarting(group, http) -> None:
    replicas = await group(2)
    task = (await call(http, replicas[0].url, "sleep", {"ms": 300}, headers=ALICE)
            ).body["result"]
    await wait_for(http, replicas[1].url, task["taskId"], "completed", ALICE)
    for replica in replicas:
        replica.stop()
    for replica in replicas:
        await replica.start()
    for replica in replicas:
        done = await wait_for(http, replica.url, task["taskId"], "completed", ALICE)
        assert done["result"]["content"][0]["text"] == "slept 300"


async def test_a_store_that_goes_away_and_comes_back(group, http, tmp_path) -> None:
    own = RedisServer(keep_in=str(tmp_path))
    own.start()
    try:
        a, = await group(1, redis=own)
        kept = (await call(http, a.url, "sleep", {"ms": 300}, headers=ALICE)).body["result"]
        await wait_for(http, a.url, kept["taskId"], "completed", ALICE)
        own.stop()
        # Pass-through goes on; a call that may become a task is answered inline.
        echoed = await call(http, a.url, "echo", {"text": "hi"}, headers=ALICE)
        assert echoed.body["result"]["content"][0]["text"] == "hi"
        inline = (await call(http, a.url, "sleep", {"ms": 300}, headers=ALICE)).body["result"]
        assert inline["resultType"] == "complete" and "taskId" not in inline
        assert inline["content"][0]["text"] == "slept 300"
        cached = await tasks_op(http, a.url, "tasks/get", kept["taskId"], ALICE)
        assert cached.body["result"]["status"] == "completed"  # finished: read before, kept
        reply = await tasks_op(http, a.url, "tasks/get", "never-read-here", ALICE)
        assert reply.status == 503 and reply.body["error"]["code"] == -32603
        assert "task store is unavailable" in reply.body["error"]["message"]
        await ready_is(http, a, up=False)  # reported; /readyz stays 200 (INTERFACE.md)
        own.start()
        await ready_is(http, a, up=True)
        back = await a_fresh_read(http, kept["taskId"], own, group)
        assert back["taskId"] == kept["taskId"]  # it was in the store, not only in memory
    finally:
        own.stop()


async def a_fresh_read(http: aiohttp.ClientSession, task_id: str, redis: RedisServer,
                       group: Any) -> dict[str, Any]:
    """The task as a replica that never read it sees it (from the store, then)."""
    fresh, = await group(1, redis=redis)
    return (await tasks_op(http, fresh.url, "tasks/get", task_id, ALICE)).body["result"]


async def test_bounds_hold_across_three_replicas_creating_at_once(group, http) -> None:
    replicas = await group(3, limits={"max_tasks": 10, "max_tasks_per_owner": 100})
    calls = [call(http, replicas[i % 3].url, "sleep", {"ms": 1500}, headers=ALICE)
             for i in range(30)]
    results = [r.body["result"] for r in await asyncio.gather(*calls)]
    assert sum("taskId" in r for r in results) == 10  # the rest answered inline
    assert all(r["content"][0]["text"] == "slept 1500" for r in results if "taskId" not in r)


async def test_a_store_that_hangs_gets_an_error_not_a_hang(group, http, tmp_path) -> None:
    own = RedisServer(keep_in=str(tmp_path))
    own.start()
    try:
        a, = await group(1, redis=own)
        assert own.proc is not None
        own.proc.send_signal(signal.SIGSTOP)  # accepts connections, answers nothing
        reply = await asyncio.wait_for(
            tasks_op(http, a.url, "tasks/get", "never-read-here", ALICE), 30)
        assert reply.status == 503 and "unavailable" in reply.body["error"]["message"]
        echoed = await call(http, a.url, "echo", {"text": "still"}, headers=ALICE)
        assert echoed.body["result"]["content"][0]["text"] == "still"
        own.proc.send_signal(signal.SIGCONT)
        await ready_is(http, a, up=True)
    finally:
        if own.proc is not None:
            own.proc.send_signal(signal.SIGCONT)
        own.stop()


async def ready_is(http: aiohttp.ClientSession, replica: Replica, *, up: bool) -> None:
    """/readyz tells the store's state in its body and stays 200 through its outage: a
    balancer must not take every replica out for a shared dependency."""
    for _ in range(100):
        async with http.get(replica.url.replace("/mcp", "/readyz?detail"),
                            headers=OPERATOR) as resp:
            assert resp.status == 200
            if (await resp.json())["store"]["up"] is up:
                return
        await asyncio.sleep(0.1)
    raise AssertionError(f"/readyz never said store.up {up}")


async def dump(url: str, prefix: str) -> dict[bytes, Any]:
    """Everything the gateway keeps in the store, as its operator reads it."""
    store = redis.asyncio.Redis.from_url(url)
    out: dict[bytes, Any] = {}
    try:
        async for key in store.scan_iter(match=f"{prefix}*"):
            kind = await store.type(key)
            if kind == b"string":
                out[key] = await store.get(key)
            elif kind == b"hash":
                out[key] = await store.hgetall(key)
            elif kind == b"zset":
                out[key] = await store.zrange(key, 0, -1)
            elif kind == b"set":
                out[key] = await store.smembers(key)
    finally:
        await store.aclose()
    return out


async def test_the_stores_operator_can_neither_read_nor_rewrite_a_task(
        group, http, redis_server, key_prefix) -> None:
    """Issue 30: with the store's password alone, rewriting a record's owner gave Bob
    Alice's task and a forged result. Now the store holds no result in clear and no plain
    owner digest (a keyed one), and a record rewritten by hand is no one's: not found for
    Alice and Bob alike (its seal fails), never the forged result."""
    a, b = await group(2)
    alice = (await call(http, a.url, "sleep", {"ms": 400}, headers=ALICE)).body["result"]
    bob = (await call(http, a.url, "sleep", {"ms": 400}, headers=BOB)).body["result"]
    for task, who in ((alice, ALICE), (bob, BOB)):
        await wait_for(http, b.url, task["taskId"], "completed", who)
    held = await dump(redis_server.url, key_prefix)
    everything = repr(held).encode()
    assert alice["taskId"].encode() in everything
    for plain in (b"slept 400", owner_hash("Bearer alice-token").encode(),
                  owner_hash("Bearer bob-token").encode(), b"alice-token"):
        assert plain not in everything, plain
    key = f"{key_prefix}t:{alice['taskId']}".encode()
    bobs = held[f"{key_prefix}t:{bob['taskId']}".encode()][b"owner"]
    forged = orjson.dumps({"content": [{"type": "text", "text": "forged"}]})
    store = redis.asyncio.Redis.from_url(redis_server.url)
    try:
        await store.hset(key, mapping={b"owner": bobs, b"res": forged})
        await store.zadd(f"{key_prefix}o:{bobs.decode()}", {alice["taskId"]: 1})
    finally:
        await store.aclose()
    b.stop()
    await b.start()  # a replica that never read the record asks the store for it
    for replica in (a, b):
        for who in (ALICE, BOB):
            reply = await tasks_op(http, replica.url, "tasks/get", alice["taskId"], who)
            assert b"forged" not in orjson.dumps(reply.body)
    for who in (ALICE, BOB):
        reply = await tasks_op(http, b.url, "tasks/get", alice["taskId"], who)
        assert "not found" in reply.body["error"]["message"].lower(), reply.body


@pytest.mark.parametrize("mode", ["always", "required"])
async def test_a_task_at_once_is_a_task_however_fast_its_server_answers(group, http,
                                                                        mode) -> None:
    """A shared store takes a round trip to write a task; an echo answers in less. A call
    that is a task at once (mode always or required) is stored before its call is sent, so
    every answer is its task's handle, and the task holds the server's result (docs/tasks.md,
    Modes). Bob, naming each of Alice's tasks, gets what an unknown id gets."""
    a, = await group(1, tasks={**REPLICA_POLICY, "tools": {"echo": {"mode": mode}}})
    replies = await asyncio.gather(*(call(http, a.url, "echo", {"text": f"n{n}"},
                                          headers=ALICE) for n in range(24)))
    assert [r.body["result"]["resultType"] for r in replies] == ["task"] * 24
    for n, reply in enumerate(replies):
        task_id = reply.body["result"]["taskId"]
        done = await wait_for(http, a.url, task_id, "completed", ALICE)
        assert done["result"]["content"][0]["text"] == f"n{n}"
        foreign = await tasks_op(http, a.url, "tasks/get", task_id, BOB)
        assert foreign.body["error"]["message"] == "Task not found"


async def test_a_client_gone_while_its_task_is_written_leaves_no_call_holding_a_slot(
        group, http, tmp_path) -> None:
    """A task at once for a client taking only SSE is adopted before its request is
    answered (modern.py `forward`): a client that leaves while the store writes the task
    (the store paused here) must not leave its call running, never timed out, on its slot
    (found in review: nothing abandoned it)."""
    own = RedisServer(keep_in=str(tmp_path))
    own.start()
    try:
        a, = await group(1, redis=own, tasks={"defaults": {"mode": "always"}},
                         upstreams={"main": {"command": BASIC[0], "args": BASIC[1:],
                                             "request_timeout_ms": 60_000}})
        assert own.proc is not None
        own.proc.send_signal(signal.SIGSTOP)  # the task's write waits
        gone = asyncio.ensure_future(call(http, a.url, "hang", {}, TASKS, headers={
            **ALICE, "Accept": "text/event-stream"}))
        await asyncio.sleep(0.5)
        gone.cancel()  # its client leaves meanwhile
        await asyncio.sleep(0.2)
        own.proc.send_signal(signal.SIGCONT)
        for _ in range(50):
            async with http.get(a.url.replace("/mcp", "/readyz?detail"),
                                headers=OPERATOR) as resp:
                in_flight = (await resp.json())["calls"]["in_flight"]
            if in_flight == 0:
                break
            await asyncio.sleep(0.1)
        assert in_flight == 0  # its call cancelled upstream, its slot back
    finally:
        if own.proc is not None:
            own.proc.send_signal(signal.SIGCONT)
        own.stop()
