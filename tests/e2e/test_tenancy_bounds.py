"""Issue 29, item 4: quotas and bounds belong to the principal. Two static tokens (alice, bob)
on one gateway in front of the stdio test server; Bob opens many sessions, fills tasks,
holds calls, parks calls and floods replay buffers, and each time Alice's running task,
session and parked call keep working and she can still create tasks, while Bob gets a clear
refusal of his own."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
from mcp_http import McpHttp, read
from test_core_tasks import as_task, request, wait_for
from test_modern import ask_round, modern, retry

POLICY = {"defaults": {"mode": "auto", "sync_budget_ms": 200, "ttl_ms": 60_000,
                       "max_ttl_ms": 120_000, "poll_interval_ms": 500}}
TOKENS = {"auth": {"bearer_tokens": ["alice", "bob"]}}
ALICE = {"Authorization": "Bearer alice"}
BOB = {"Authorization": "Bearer bob"}
Open = Callable[..., Any]


@pytest.fixture
async def https() -> AsyncIterator[dict[str, aiohttp.ClientSession]]:
    """One HTTP client per principal, each sending its own token."""
    async with aiohttp.ClientSession(headers=ALICE) as alice, \
            aiohttp.ClientSession(headers=BOB) as bob:
        yield {"alice": alice, "bob": bob}


@pytest.fixture
def open_session(https) -> Open:
    async def open_(url: str, who: str) -> McpHttp:
        c = McpHttp(https[who], url)
        await c.initialize({"elicitation": {}}, version="2025-11-25")
        return c
    return open_


async def start(gateway, **limits: Any) -> str:
    return await gateway(tasks=POLICY, limits=limits, **TOKENS)


def error_of(msg: dict[str, Any]) -> str:
    assert "error" in msg, msg
    return str(msg["error"]["message"])


@pytest.mark.parametrize("backend", ["memory", "redis"])
async def test_many_sessions_of_one_token_share_one_task_quota(gateway, open_session, backend,
                                                                request) -> None:
    store = {"backend": "redis", "url": request.getfixturevalue("redis_server").url,
             "key_prefix": request.getfixturevalue("key_prefix")} if backend == "redis" else {}
    shared = {"replica": {"secret": "a secret every replica shares"}} if store else {}
    url = await gateway(tasks=POLICY, limits={"max_tasks": 6, "max_tasks_per_owner": 3},
                        store=store, **shared, **TOKENS)
    alice = await open_session(url, "alice")
    running = (await as_task(alice, "sleep", {"ms": 3000}))["result"]["task"]
    outcomes = []
    for _ in range(10):  # one session a task, as a client that opens many would
        bob = await open_session(url, "bob")
        outcomes.append(await as_task(bob, "sleep", {"ms": 3000}))
    assert sum("result" in o for o in outcomes) == 3
    assert all("this client holds its maximum of 3 tasks" in error_of(o)
               for o in outcomes[3:])
    second = await as_task(alice, "echo", {"text": "mine"})  # Alice can still create tasks
    assert "result" in second, second
    done = await wait_for(alice, second["result"]["task"]["taskId"], "completed")
    assert done["status"] == "completed"
    assert (await wait_for(alice, running["taskId"], "completed"))["status"] == "completed"


async def fetched(c: McpHttp, method: str, task_id: str) -> dict[str, Any]:
    """tasks/result or tasks/get of `task_id` (a test whose `request` is pytest's)."""
    return await request(c, method, {"taskId": task_id})


@pytest.mark.parametrize("backend", ["memory", "redis"])
async def test_bob_at_his_result_bytes_never_blocks_or_evicts_alice(
        gateway, open_session, backend, request) -> None:
    """Issue 40: per-principal result bytes hold on Redis as in memory. Bob fills his share
    with results he has not read: a result past it fails, his unread ones stay; Alice's
    results still fit, and her read one is not evicted for Bob; once Bob reads his, the
    first he read makes room for his next."""
    store = {"store": {"backend": "redis", "url": request.getfixturevalue("redis_server").url,
                       "key_prefix": request.getfixturevalue("key_prefix")},
             "replica": {"secret": "a secret every replica shares"}} if backend == "redis" \
        else {}
    url = await gateway(tasks={**POLICY, "tools": {"blob": {"mode": "always"}}},
                        limits={"max_stored_bytes_per_principal": 30_000}, **store, **TOKENS)
    alice, bob = await open_session(url, "alice"), await open_session(url, "bob")
    mine = (await as_task(alice, "blob", {"bytes": 1000}))["result"]["task"]["taskId"]
    await wait_for(alice, mine, "completed")
    assert "result" in await fetched(alice, "tasks/result", mine)  # read

    async def blob(who: McpHttp, size: int, status: str = "completed") -> dict[str, Any]:
        task = (await as_task(who, "blob", {"bytes": size}))["result"]["task"]
        return await wait_for(who, task["taskId"], status)

    bobs = [(await blob(bob, 14_000))["taskId"] for _ in range(2)]
    over = await blob(bob, 5000, "failed")  # 33,000 bytes: none of his read to make room
    assert "this client's share of the result storage (30000 bytes) is full" in \
        over["statusMessage"]
    assert (await blob(alice, 1000))["status"] == "completed"  # Alice's results still fit
    for task_id in bobs:
        assert "result" in await fetched(bob, "tasks/result", task_id)
    assert (await blob(bob, 5000))["status"] == "completed"  # his first read one made room
    assert "Task not found" in error_of(await fetched(bob, "tasks/get", bobs[0]))
    assert "result" in await fetched(bob, "tasks/get", bobs[1])
    assert (await wait_for(alice, mine, "completed"))["status"] == "completed"


async def test_many_sessions_of_one_token_share_one_creation_rate(gateway,
                                                                  open_session) -> None:
    url = await start(gateway, task_creations_per_s=0.01, task_creations_burst=3)
    answers = []
    for _ in range(5):
        bob = await open_session(url, "bob")
        answers.append(await as_task(bob, "echo", {"text": "b"}))
    assert [("result" in a) for a in answers] == [True, True, True, False, False]
    assert "Too many tasks created" in error_of(answers[3])
    alice = await open_session(url, "alice")
    assert "result" in await as_task(alice, "echo", {"text": "a"})


async def test_a_task_holds_a_call_slot_until_it_ends(gateway, open_session) -> None:
    url = await start(gateway, max_calls_per_owner=2)
    bob = await open_session(url, "bob")
    tasks = [(await as_task(bob, "sleep", {"ms": 1500}))["result"]["task"] for _ in range(2)]
    third = await as_task(bob, "sleep", {"ms": 10})
    assert "Too many calls in flight" in error_of(third)
    plain = await request(bob, "tools/call", {"name": "echo", "arguments": {"text": "x"}})
    assert "Too many calls in flight" in error_of(plain)
    alice = await open_session(url, "alice")  # the slots are Bob's, not Alice's
    mine = await request(alice, "tools/call", {"name": "echo", "arguments": {"text": "a"}})
    assert mine["result"]["content"][0]["text"] == "a"
    for task in tasks:
        await wait_for(bob, task["taskId"], "completed")
    again = await request(bob, "tools/call", {"name": "echo", "arguments": {"text": "y"}})
    assert again["result"]["content"][0]["text"] == "y"  # ended tasks gave their slots back


async def test_bob_opening_sessions_never_evicts_alices(gateway, open_session) -> None:
    url = await start(gateway, max_sessions=4, max_sessions_per_principal=3)
    alice = await open_session(url, "alice")
    running = (await as_task(alice, "sleep", {"ms": 2500}))["result"]["task"]
    bobs = [await open_session(url, "bob") for _ in range(3)]  # the gateway is full now
    fourth = await open_session(url, "bob")  # makes room among Bob's own: his oldest idle
    gone = await bobs[0].send({"jsonrpc": "2.0", "id": 9, "method": "ping"})
    assert gone.status == 404
    for bob in [*bobs[1:], fourth]:  # now every session of Bob's has work running
        assert "result" in await as_task(bob, "sleep", {"ms": 2500})
    reply = await McpHttp(fourth.http, url).send({
        "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"}}})
    assert reply.status == 503 and "none idle" in error_of(reply.body)
    task = await wait_for(alice, running["taskId"], "completed")  # never "evicted"
    assert task["status"] == "completed"
    ping = await request(alice, "ping", {})
    assert ping["result"] == {}


async def test_bobs_parked_calls_never_drop_alices(gateway, https) -> None:
    url = await start(gateway, max_parked=4, max_parked_per_principal=2)
    _, mine = await ask_round(https["alice"], url)
    assert mine["resultType"] == "input_required"
    states = []
    for _ in range(5):
        _, parked = await ask_round(https["bob"], url)
        states.append(parked)
    (key, _), = mine["inputRequests"].items()
    done = await retry(https["alice"], url, mine["requestState"],
                       {key: {"action": "accept", "content": {"name": "Ada"}}})
    assert json.loads(done.body["result"]["content"][0]["text"])["content"] == {"name": "Ada"}
    (bkey, _), = states[0]["inputRequests"].items()  # Bob's oldest gave way to his newest
    stale = await retry(https["bob"], url, states[0]["requestState"], {bkey: {}})
    assert stale.status == 400 and "no longer waiting" in error_of(stale.body)
    (bkey, _), = states[-1]["inputRequests"].items()
    kept = await retry(https["bob"], url, states[-1]["requestState"],
                       {bkey: {"action": "decline"}})
    assert json.loads(kept.body["result"]["content"][0]["text"]) == {"action": "decline"}


async def test_a_full_gateway_refuses_parking_for_a_principal_with_none(gateway,
                                                                         https) -> None:
    url = await start(gateway, max_parked=2, max_parked_per_principal=2)
    for _ in range(2):
        await ask_round(https["bob"], url)
    refused, _ = await ask_round(https["alice"], url)
    assert refused.status == 429
    assert "Too many calls waiting for input" in error_of(refused.body)


async def test_listen_streams_are_bounded_in_all(gateway, https) -> None:
    url = await start(gateway, max_listeners_per_owner=2, max_listeners=2)
    streams = []
    for _ in range(2):
        params = {"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                            "io.modelcontextprotocol/clientCapabilities": {}},
                  "notifications": {"toolsListChanged": True}}
        streams.append(asyncio.ensure_future(https["bob"].post(url, json={
            "jsonrpc": "2.0", "id": 1, "method": "subscriptions/listen", "params": params},
            headers={"Accept": "application/json, text/event-stream",
                     "MCP-Protocol-Version": "2026-07-28",
                     "Mcp-Method": "subscriptions/listen"})))
    responses = [await s for s in streams]
    try:
        assert all(r.status == 200 for r in responses)
        refused = await modern(https["alice"], url, "subscriptions/listen",
                               {"notifications": {"toolsListChanged": True}})
        assert refused.status == 429 and "the gateway holds its maximum of 2" in \
            error_of(refused.body)
    finally:
        for r in responses:
            r.close()


SSE_ONLY = "text/event-stream"


async def streamed(c: McpHttp, name: str, arguments: dict[str, Any]) -> str:
    """A call answered on an SSE stream; the stream's key (its events resume as key-N)."""
    reply = await c.send({"jsonrpc": "2.0", "id": next(c.ids), "method": "tools/call",
                          "params": {"name": name, "arguments": arguments}}, Accept=SSE_ONLY)
    assert reply.status == 200 and "result" in reply.message, reply.raw[:200]
    return reply.event_ids[-1].rpartition("-")[0]


async def resumed(c: McpHttp, key: str) -> list[dict[str, Any]]:
    """What a client that lost stream `key` from its start gets back."""
    headers = {**c.headers(Accept=SSE_ONLY), "Last-Event-ID": f"{key}-0"}
    headers.pop("Content-Type")
    async with c.http.get(c.url, headers=headers) as resp:
        assert resp.status == 200
        reply = await read(resp)
    return reply.events


async def test_bobs_flood_sheds_his_own_replay_before_alices(gateway, open_session) -> None:
    url = await start(gateway, replay_budget_bytes=3_500_000)
    alice = await open_session(url, "alice")
    mine = await streamed(alice, "blob", {"bytes": 1_000_000})
    bob = await open_session(url, "bob")
    his = [await streamed(bob, "blob", {"bytes": 1_000_000}) for _ in range(5)]
    replay = await resumed(alice, mine)  # Alice can still resume her answer
    assert len(replay[0]["result"]["content"][0]["text"]) == 1_000_000
    assert await resumed(bob, his[0]) == []  # Bob's oldest went to stay under the budget
    assert len((await resumed(bob, his[-1]))[0]["result"]["content"][0]["text"]) == 1_000_000


async def test_answered_replay_goes_after_its_linger_an_unread_answer_stays(
        gateway, open_session) -> None:
    url = await start(gateway, replay_linger_ms=200)
    alice = await open_session(url, "alice")
    answered = await streamed(alice, "blob", {"bytes": 100_000})
    assert len(await resumed(alice, answered)) == 1  # within its linger: kept
    body = {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
            "params": {"name": "sleep", "arguments": {"ms": 300}}}
    async with alice.http.post(url, json=body, headers=alice.headers(Accept=SSE_ONLY)):
        pass  # the client drops off before the answer: it was never delivered
    await asyncio.sleep(1.0)
    assert await resumed(alice, answered) == []  # delivered long ago: the memory is back
    tag, _, number = answered.rpartition(".")  # the session's streams: <tag>.<number>
    unread = await resumed(alice, f"{tag}.{int(number) + 1}")  # the next: the dropped call
    assert unread[-1]["result"]["content"][0]["text"] == "slept 300"
