"""Long calls reach their caller (issue 40; docs/long-calls.md): a task lives past the ttl
its client guessed, a quiet call with a progress token hears a heartbeat whose values only
grow (the server's own included), and a hop that cuts quiet connections (nginx with a 3 s
`proxy_read_timeout`) carries calls three times as long, in both eras, on keep-alives."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from conftest import MCP130, NODE_BIN, listening, node_env
from mcp_http import text_of
from test_http_upstream import basic_http
from test_modern import call, modern
from test_sdk_core_tasks import transcript
from test_tasks import TASKS

sys.path.insert(0, str(Path(__file__).parents[2] / "bench"))
from long_calls import start_nginx

HERE = Path(__file__).parents[1]
HEARTBEAT = {"progress_heartbeat_ms": 500}


def increasing(values: list[float]) -> bool:
    return all(a < b for a, b in itertools.pairwise(values))


def progress_of(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e["params"] for e in events if e.get("method") == "notifications/progress"]


# -- the heartbeat ---------------------------------------------------------------------------
@pytest.mark.node
async def test_typescript_sdk_resetting_on_progress_outlives_its_timeout(gateway) -> None:
    """A 2 s request timeout, reset on progress, and an 8 s call whose server is quiet for
    1.5 s, then reports from 0: the heartbeat keeps the client waiting, and the server's 0
    (below the heartbeat's values by then) is raised, never sent going back."""
    url = await gateway(listen=HEARTBEAT)
    args = {"wait_ms": 1500, "start": 0, "steps": 2, "delay_ms": 3300}
    proc = await asyncio.create_subprocess_exec(
        str(NODE_BIN / "node"), str(HERE / "node" / "long_call.mjs"), url, "progress",
        json.dumps(args), "2000", env=node_env(), stdout=asyncio.subprocess.PIPE)
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    seen = json.loads(out.splitlines()[-1])
    assert seen.get("text") == "done 2", seen
    assert seen["seconds"] >= 8
    values = [p[0] for p in seen["progress"]]
    assert increasing(values), values
    server = [p for p in seen["progress"] if (p[2] or "").startswith("step")]
    assert [p[2] for p in server] == ["step 1", "step 2"]
    assert server[0][0] > 0 and server[1][0] == 1  # 0 raised above the beats; 1 as sent
    beats = [p for p in seen["progress"] if (p[2] or "").startswith("still running")]
    assert len(beats) >= 8 and all(p[1] is None for p in beats)


async def test_without_a_token_no_progress_ever(gateway, client) -> None:
    url = await gateway(listen={**HEARTBEAT, "sse_keepalive_ms": 300})
    mcp = client(url)
    await mcp.initialize()
    reply = await mcp.call("sleep", {"ms": 1800})
    assert text_of(reply) == "slept 1800"
    assert progress_of(reply.events) == []
    assert b": keep-alive" in reply.raw  # the stream was kept awake all the same


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_a_quiet_modern_call_hears_heartbeats(gateway, http, transport) -> None:
    async with contextlib.AsyncExitStack() as stack:
        if transport == "http":
            base = await stack.enter_async_context(basic_http())
            url = await gateway(url=base + "/mcp", listen=HEARTBEAT)
        else:
            url = await gateway(listen=HEARTBEAT)
        reply = await modern(http, url, "tools/call", {"name": "sleep", "arguments": {
            "ms": 2300}}, meta={"progressToken": "p-1"})
    assert text_of(reply) == "slept 2300"
    beats = progress_of(reply.events)
    assert len(beats) >= 3 and {b["progressToken"] for b in beats} == {"p-1"}
    assert increasing([b["progress"] for b in beats])
    assert all(b["message"].startswith("still running") for b in beats)


async def test_a_call_waiting_in_its_queue_says_so(gateway, client) -> None:
    """It says it waits, not how many are ahead: those are Bob's calls (issue 49)."""
    url = await gateway(listen=HEARTBEAT, tasks={"tools": {"sleep": {
        "mode": "never", "max_concurrency": 1}}},
        auth={"bearer_tokens": ["alice-token", "bob-token"]})
    bob, alice = client(url), client(url)
    await bob.initialize(headers={"Authorization": "Bearer bob-token"})
    await alice.initialize(headers={"Authorization": "Bearer alice-token"})
    ahead = asyncio.create_task(bob.call("sleep", {"ms": 1600},
                                         Authorization="Bearer bob-token"))
    await asyncio.sleep(0.2)
    reply = await alice.call("sleep", {"ms": 100}, meta={"progressToken": 9},
                             Authorization="Bearer alice-token")
    await ahead
    notes = [b["message"] for b in progress_of(reply.events)]
    assert notes and notes[0].startswith("queued ("), notes
    assert not any("ahead" in note for note in notes)
    assert text_of(reply) == "slept 100"


async def test_alice_never_hears_bobs_heartbeat(gateway, client) -> None:
    """Two principals on one upstream: each call's heartbeat goes to its own stream."""
    url = await gateway(listen=HEARTBEAT, auth={"bearer_tokens": ["alice-token", "bob-token"]})
    alice, bob = client(url), client(url)
    await alice.initialize(headers={"Authorization": "Bearer alice-token"})
    await bob.initialize(headers={"Authorization": "Bearer bob-token"})
    bobs = asyncio.create_task(bob.call("sleep", {"ms": 1500}, meta={"progressToken": "bob"},
                                        Authorization="Bearer bob-token"))
    alices = await alice.call("sleep", {"ms": 1500}, meta={"progressToken": "alice"},
                              Authorization="Bearer alice-token")
    for reply, token in ((alices, "alice"), (await bobs, "bob")):
        assert {b["progressToken"] for b in progress_of(reply.events)} == {token}


# -- the ttl ---------------------------------------------------------------------------------
async def test_python_sdk_1_30_asking_a_short_ttl_gets_its_result(gateway) -> None:
    """mcp 1.30 asks 1 s on a 5 s tool: the task lives its time bound plus that second."""
    if not MCP130.exists():
        pytest.fail("the mcp==1.30.0 environment is missing: run scripts/test.sh")
    url = await gateway(tasks={"defaults": {"poll_interval_ms": 200},
                               "tools": {"sleep": {"timeout_ms": 8000}}})
    seen = await transcript(str(MCP130), str(HERE / "clients" / "mcp130_long.py"), url,
                            "sleep", json.dumps({"ms": 5000}), "1000")
    assert seen.get("text") == "slept 5000", seen
    assert seen["granted"] == seen["ttl"] == 9000  # timeout_ms + the ttl asked
    assert seen["statuses"][-1] == "completed"


@pytest.mark.parametrize("backend", ["memory", "redis"])
async def test_a_wait_in_a_queue_pushes_the_ttl(gateway, http, request, backend) -> None:
    """Bob's task holds the tool's one slot; Alice's waits behind it longer than her ttl
    (the time bound, 3 s, plus 100 ms): her ttl grows by the wait, so she gets her result,
    and every answer reports the ttl as it is."""
    store = {}
    if backend == "redis":
        redis = request.getfixturevalue("redis_server")
        store = {"store": {"backend": "redis", "url": redis.url,
                           "key_prefix": request.getfixturevalue("key_prefix")},
                 "replica": {"secret": "a secret every replica shares"}}
    url = await gateway(tasks={"defaults": {"mode": "always", "ttl_ms": 100,
                                            "poll_interval_ms": 100},
                               "tools": {"sleep": {"timeout_ms": 3000, "max_concurrency": 1}}},
                        auth={"bearer_tokens": ["alice-token", "bob-token"]}, **store)
    alice, bob = ({"Authorization": f"Bearer {who}-token"} for who in ("alice", "bob"))
    await call(http, url, "sleep", {"ms": 2500}, caps=TASKS, headers=bob)
    made = (await call(http, url, "sleep", {"ms": 1000}, caps=TASKS, headers=alice)).body[
        "result"]
    assert made["ttlMs"] == 3100 and made["statusMessage"].startswith("queued")
    for _ in range(100):
        got = (await modern(http, url, "tasks/get", {"taskId": made["taskId"]}, TASKS,
                            headers=alice)).body["result"]
        if got["status"] != "working":
            break
        await asyncio.sleep(0.1)
    assert got["status"] == "completed", got
    assert got["result"]["content"][0]["text"] == "slept 1000"
    assert got["ttlMs"] >= 3100 + 2000  # pushed by the wait, reported


async def test_an_expired_task_reads_failed_in_both_dialects(gateway, http, client) -> None:
    """An operator's low max_ttl_ms still ends a long run at it; the task then reads as
    failed, saying why, so a poll loop ends, while Bob's look at Alice's id is not found."""
    url = await gateway(tasks={"defaults": {"mode": "always", "max_ttl_ms": 600,
                                            "poll_interval_ms": 100}},
                        auth={"bearer_tokens": ["alice-token", "bob-token"]})
    alice = {"Authorization": "Bearer alice-token"}
    made = await call(http, url, "sleep", {"ms": 5000}, caps=TASKS, headers=alice)
    task_id = made.body["result"]["taskId"]
    assert made.body["result"]["ttlMs"] == 600
    await asyncio.sleep(1.0)
    got = (await modern(http, url, "tasks/get", {"taskId": task_id}, TASKS,
                        headers=alice)).body["result"]
    assert got["status"] == "failed" and "expired" in got["statusMessage"]
    assert "ttl of 600 ms" in got["error"]["message"]
    bobs = await modern(http, url, "tasks/get", {"taskId": task_id}, TASKS,
                        headers={"Authorization": "Bearer bob-token"})
    assert bobs.body["error"]["message"] == "Task not found"

    legacy = client(url)
    await legacy.initialize({"tasks": {}}, "2025-11-25", headers=alice)
    made = await legacy.send({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {
        "name": "sleep", "arguments": {"ms": 5000}, "task": {"ttl": 60_000}}}, **alice)
    task_id = made.body["result"]["task"]["taskId"]
    assert made.body["result"]["task"]["ttl"] == 600  # the cap, reported
    await asyncio.sleep(1.0)
    got = await legacy.send({"jsonrpc": "2.0", "id": 6, "method": "tasks/get",
                             "params": {"taskId": task_id}}, **alice)
    assert got.body["result"]["status"] == "failed"


# -- a hop that cuts quiet connections -------------------------------------------------------
@contextlib.asynccontextmanager
async def nginx_before(url: str) -> AsyncIterator[str]:
    """nginx (Debian's nginx-light, as bench/long_calls.py runs it) in front of the gateway
    at `url`, cutting a response quiet for 3 s; yields the same URL through it."""
    if not (shutil.which("nginx") or Path("/usr/sbin/nginx").exists()):
        pytest.fail("nginx is missing: run scripts/test.sh (it installs nginx-light)")
    with tempfile.TemporaryDirectory() as folder:
        proc, front, port = start_nginx(url, Path(folder), read_timeout="3s")
        try:
            await listening(port)
            yield front
        finally:
            proc.terminate()
            proc.wait(10)


async def test_a_hop_cutting_at_3s_cuts_a_quiet_call(gateway, client) -> None:
    """The control: with keep-alives rarer than the hop's timeout, nginx cuts the call."""
    url = await gateway()  # sse_keepalive_ms 15 s: nothing for nginx to see for 4 s
    async with nginx_before(url) as front:
        mcp = client(front)
        await mcp.initialize()
        reply = await mcp.call("sleep", {"ms": 4000})
    assert reply.status == 504


async def test_both_eras_outlive_a_hop_that_cuts_at_3s(gateway, client, http) -> None:
    """Keep-alive comments every second carry a legacy and a modern call of 9.5 s through
    it, side by side."""
    url = await gateway(listen={"sse_keepalive_ms": 1000})
    async with nginx_before(url) as front:
        legacy = client(front)
        await legacy.initialize()
        both = await asyncio.gather(legacy.call("sleep", {"ms": 9500}),
                                    call(http, front, "sleep", {"ms": 9500}))
    assert [text_of(r) for r in both] == ["slept 9500"] * 2
