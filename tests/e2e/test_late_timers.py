"""Timers armed late (gateway/laggards.py), against a gateway in front of real stdio servers:
every deferred timer still fires after its deadline, never before (request timeout,
keep-alive switch, sync budget), and what a call holds is given back on the paths a deferral
could miss: a client gone, a queue, an MRTR round, a slow reader cut off, another principal
flooding; nothing is left watched once traffic stops, and a call whose client left leaves no
cycle holding its request for the collector (app.py collects young objects rarely)."""

from __future__ import annotations

import asyncio
import itertools
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from mcp_http import ACCEPT_BOTH, McpHttp, read
from test_modern import call as modern_call
from test_modern import envelope, headers_for

TOKENS = {"alice": "alice-token-review-laggards", "bob": "bob-token-review-laggards"}
ADMIN_TOKEN = "operator-token-review-laggards"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
TASKS = {"extensions": {"io.modelcontextprotocol/tasks": {}}}
ASKHANG = [sys.executable, str(Path(__file__).parents[1] / "servers" / "askhang.py")]
_ids = itertools.count(1000)


def auth(who: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[who]}"}


def conf(timeout_ms: int | None = 400, keepalive_ms: int = 15000, per_owner: int = 50,
         **extra: Any) -> dict[str, Any]:
    return {"upstream": {"request_timeout_ms": timeout_ms, **extra.pop("upstream", {})},
            "auth": {"bearer_tokens": list(TOKENS.values()), "admin_tokens": [ADMIN_TOKEN]},
            "limits": {"max_calls_per_owner": per_owner, **extra.pop("limits", {})},
            "listen": {"sse_keepalive_ms": keepalive_ms}, **extra}


async def in_flight(http: aiohttp.ClientSession, url: str) -> int:
    async with http.get(url.replace("/mcp", "/readyz?detail"), headers=ADMIN) as resp:
        return int((await resp.json())["calls"]["in_flight"])


async def settles_to(http: aiohttp.ClientSession, url: str, want: int, within_s: float
                     ) -> int:
    deadline = time.monotonic() + within_s
    while True:
        now = await in_flight(http, url)
        if now == want or time.monotonic() > deadline:
            return now
        await asyncio.sleep(0.05)


async def modern_big(http: aiohttp.ClientSession, url: str, name: str,
                     arguments: dict[str, Any], headers: dict[str, str]) -> Any:
    """A modern tools/call whose body is big (sent from a BytesIO, as mcp_http does)."""
    import io
    import json
    params = {"name": name, "arguments": arguments, "_meta": envelope({})}
    body = {"jsonrpc": "2.0", "id": next(_ids), "method": "tools/call", "params": params}
    async with http.post(url, data=io.BytesIO(json.dumps(body).encode()),
                         headers=headers_for("tools/call", params, **headers)) as resp:
        return await read(resp)


def legacy_call(name: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": next(_ids), "method": "tools/call",
            "params": {"name": name, "arguments": args or {}}}


# -- request timeout -------------------------------------------------------------------------
@pytest.mark.parametrize("accept", [ACCEPT_BOTH, "application/json"])
async def test_legacy_hung_call_is_cut_at_its_timeout_and_frees_its_slot(
        gateway, http, accept) -> None:
    url = await gateway(**conf(timeout_ms=400))
    alice = McpHttp(http, url)
    await alice.initialize(headers=auth("alice"))
    start = time.monotonic()
    reply = await asyncio.wait_for(
        alice.send(legacy_call("hang"), Accept=accept, **auth("alice")), 5)
    took = time.monotonic() - start
    assert "did not answer within 0.4 s" in reply.message["error"]["message"]
    assert took >= 0.4, took  # never before its deadline
    assert await settles_to(http, url, 0, 1) == 0


async def test_modern_hung_call_is_cut_at_its_timeout_and_frees_its_slot(gateway, http
                                                                         ) -> None:
    url = await gateway(**conf(timeout_ms=400))
    start = time.monotonic()
    reply = await asyncio.wait_for(modern_call(http, url, "hang", headers=auth("alice")), 5)
    took = time.monotonic() - start
    assert "did not answer within 0.4 s" in reply.message["error"]["message"], reply.message
    assert took >= 0.4, took  # never before its deadline
    assert await settles_to(http, url, 0, 1) == 0


@pytest.mark.parametrize("leave_after_s", [0.01, 0.12])
async def test_legacy_client_gone_mid_call_still_times_out_and_frees_its_slot(
        gateway, http, leave_after_s) -> None:
    """Legacy calls outlive their handlers: the deferred timer must still be armed whether
    the client left before the call was told late, between the ticks, or after."""
    url = await gateway(**conf(timeout_ms=500))
    alice = McpHttp(http, url)
    await alice.initialize(headers=auth("alice"))
    job = asyncio.ensure_future(alice.send(legacy_call("hang"), **auth("alice")))
    await asyncio.sleep(leave_after_s)
    job.cancel()  # the connection is closed: the handler is cancelled
    with pytest.raises(asyncio.CancelledError):
        await job
    assert await in_flight(http, url) == 1
    assert await settles_to(http, url, 0, 2) == 0  # cut at 0.5 s, slot back


async def test_a_queued_call_is_timed_from_when_it_runs(gateway, http) -> None:
    tools = {"tools": {"hang": {"mode": "never", "max_concurrency": 1, "max_queue": 5}}}
    url = await gateway(**conf(timeout_ms=400, tasks=tools))
    alice = McpHttp(http, url)
    await alice.initialize(headers=auth("alice"))
    first = asyncio.ensure_future(alice.send(legacy_call("hang"), **auth("alice")))
    await asyncio.sleep(0.1)
    start = time.monotonic()
    second = await asyncio.wait_for(alice.send(legacy_call("hang"), **auth("alice")), 5)
    took = time.monotonic() - start
    assert "did not answer" in (await first).message["error"]["message"]
    assert "did not answer" in second.message["error"]["message"]
    assert took >= 0.6, took  # waited ~0.3 s in the queue, then ran its 0.4 s
    assert await settles_to(http, url, 0, 1) == 0


# -- keep-alive switch -----------------------------------------------------------------------
@pytest.mark.parametrize("era", ["legacy", "modern"])
async def test_a_slow_call_turns_to_sse_at_the_keepalive(gateway, http, era) -> None:
    url = await gateway(**conf(timeout_ms=None, keepalive_ms=300))
    if era == "legacy":
        alice = McpHttp(http, url)
        await alice.initialize(headers=auth("alice"))
        body, headers = legacy_call("sleep", {"ms": 1500}), alice.headers(**auth("alice"))
    else:
        params = {"name": "sleep", "arguments": {"ms": 1500}, "_meta": envelope({})}
        body = {"jsonrpc": "2.0", "id": next(_ids), "method": "tools/call", "params": params}
        headers = headers_for("tools/call", params, **auth("alice"))
    start = time.monotonic()
    async with http.post(url, json=body, headers=headers) as resp:
        first_bytes = time.monotonic() - start
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        reply = await read(resp)
    assert first_bytes >= 0.3, first_bytes  # turned to SSE at the keep-alive, not before
    assert "slept 1500" in reply.message["result"]["content"][0]["text"]


# -- sync budget -----------------------------------------------------------------------------
@pytest.mark.parametrize("budget_ms", [50, 400])
async def test_an_auto_call_becomes_a_task_at_its_budget(gateway, http, budget_ms) -> None:
    policy = {"defaults": {"mode": "auto", "sync_budget_ms": budget_ms, "ttl_ms": 60_000}}
    url = await gateway(**conf(timeout_ms=5000, tasks=policy))
    start = time.monotonic()
    reply = await asyncio.wait_for(
        modern_call(http, url, "sleep", {"ms": 3000}, TASKS, headers=auth("alice")), 5)
    took = time.monotonic() - start
    result = reply.message["result"]
    assert result.get("resultType") == "task" or "task" in result, result
    assert budget_ms / 1000 <= took < 3, took  # a task at its budget, before the call ends


# -- MRTR: a parked call resumed, then hanging -----------------------------------------------
async def test_a_resumed_mrtr_call_that_hangs_is_timed_out(gateway, http) -> None:
    url = await gateway(ASKHANG, **conf(timeout_ms=500))
    first = await modern_call(http, url, "askhang", {}, {"elicitation": {}},
                              headers=auth("alice"))
    result = first.message["result"]
    assert result["resultType"] == "input_required", result
    (key, _), = result["inputRequests"].items()
    start = time.monotonic()
    done = await asyncio.wait_for(modern_call(
        http, url, "askhang", {}, {"elicitation": {}}, auth("alice"),
        inputResponses={key: {"action": "accept", "content": {"name": "Ada"}}},
        requestState=result["requestState"]), 5)
    took = time.monotonic() - start
    assert "did not answer within 0.5 s" in str(done.message), done.message
    assert took >= 0.5, took
    assert await settles_to(http, url, 0, 1) == 0


# -- one principal cannot disturb another's timers -------------------------------------------
async def test_bobs_timeout_fires_on_time_while_alice_floods_quick_calls(gateway, http
                                                                         ) -> None:
    url = await gateway(**conf(timeout_ms=500, per_owner=100))
    alice, bob = McpHttp(http, url), McpHttp(http, url)
    await alice.initialize(headers=auth("alice"))
    await bob.initialize(headers=auth("bob"))
    stop = asyncio.Event()

    async def flood() -> None:
        while not stop.is_set():
            await asyncio.gather(*(alice.send(legacy_call("echo", {"text": "x"}),
                                              **auth("alice")) for _ in range(20)))
    flooding = asyncio.ensure_future(flood())
    try:
        start = time.monotonic()
        reply = await asyncio.wait_for(bob.send(legacy_call("hang"), **auth("bob")), 5)
        took = time.monotonic() - start
    finally:
        stop.set()
        await flooding
    assert "did not answer within 0.5 s" in reply.message["error"]["message"]
    assert took < 4, took  # cut at its time, not held up by Alice's calls


# -- idle: no tick, nothing retained ---------------------------------------------------------
async def test_after_traffic_the_tick_stops_and_the_watch_sets_hold_nothing(gateway, http
                                                                           ) -> None:
    """Calls answered, abandoned (modern client gone), timed out and switched to SSE: 200 ms
    after the last, no Laggards has a tick armed or an exchange in its sets."""
    import gc

    from gateway.laggards import Laggards
    others = {id(o) for o in gc.get_objects() if isinstance(o, Laggards)}  # other tests'
    url = await gateway(**conf(timeout_ms=300, keepalive_ms=100))
    alice = McpHttp(http, url)
    await alice.initialize(headers=auth("alice"))
    jobs = [alice.send(legacy_call("echo", {"text": "x"}), **auth("alice")) for _ in range(20)]
    jobs += [alice.send(legacy_call("hang"), **auth("alice")) for _ in range(5)]
    jobs += [alice.send(legacy_call("sleep", {"ms": 150}), **auth("alice")) for _ in range(5)]
    jobs += [modern_call(http, url, "echo", {"text": "y"}, headers=auth("alice"))
             for _ in range(5)]
    gone = [asyncio.ensure_future(modern_call(http, url, "hang", headers=auth("alice")))
            for _ in range(5)]
    await asyncio.gather(*jobs)
    for job in gone:
        job.cancel()
    await asyncio.sleep(0.25)
    lags = [o for o in gc.get_objects() if isinstance(o, Laggards) and id(o) not in others]
    assert lags
    assert all(o._handle is None and not o.young and not o.old for o in lags), [
        (o._handle, len(o.young), len(o.old)) for o in lags]
    assert await settles_to(http, url, 0, 1) == 0


# -- the collector (commit 702d01c): what only it frees, per call ------------------------------
@pytest.mark.parametrize("era", ["legacy", "modern"])
async def test_a_call_whose_client_left_leaves_no_cycle_holding_its_request(
        gateway, http, era) -> None:
    """gc threshold 700 -> 10,000 rests on "a call leaves no cycle" (app.py). A call whose
    client left does: Task -> CancelledError -> traceback -> serving.py `_serve` frame (its
    local `task`) -> Task, and with it every frame down to the era's (the parsed request,
    its 1 MiB argument here), until a collection finds it."""
    import gc
    import types
    url = await gateway(**conf(timeout_ms=2000))
    big = {"text": "q" * (1 << 20)}
    if era == "legacy":
        alice = McpHttp(http, url)
        await alice.initialize(headers=auth("alice"))
        send = lambda: alice.send(legacy_call("hang", big), **auth("alice"))  # noqa: E731
    else:
        send = lambda: modern_big(http, url, "hang", big, auth("alice"))  # noqa: E731
    gc.collect()
    gc.disable()  # what an automatic collection would find, found by this test's instead
    jobs = [asyncio.ensure_future(send()) for _ in range(5)]
    await asyncio.sleep(0.3)
    for job in jobs:
        assert not job.done(), job.result()  # still waiting when its client leaves
        job.cancel()
    await asyncio.sleep(0.3)
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        frames = [o for o in gc.garbage if isinstance(o, types.FrameType)
                  and "/gateway/" in o.f_code.co_filename]
        seen: set[int] = set()

        def big_in(o: object, depth: int) -> int:
            """Big strings and buffers reachable from `o` (a few steps, not through
            modules, classes or functions)."""
            if id(o) in seen or depth < 0 or isinstance(o, (types.ModuleType, type,
                                                            types.FunctionType)):
                return 0
            seen.add(id(o))
            if isinstance(o, (bytes, bytearray, str)):
                return len(o) if len(o) > 100_000 else 0
            return sum(big_in(r, depth - 1) for r in gc.get_referents(o))
        held = sum(big_in(v, 4) for f in frames for v in f.f_locals.values())
        names = sorted({f.f_code.co_name for f in frames})
    finally:
        gc.enable()
        gc.set_debug(0)
        gc.garbage.clear()
        gc.collect()
    assert not frames, f"{len(frames)} gateway frames in cycles ({names}); " \
                       f"big strings/bytes in their locals: {held} bytes"


# -- a modern reader cut off as slow ---------------------------------------------------------
async def test_a_modern_call_whose_slow_reader_was_cut_still_times_out(gateway, http) -> None:
    """A modern call streaming many log lines to a client that stops reading: the gateway
    cuts the reader after slow_reader_ms (sse._write aborts; pump returns normally, so no
    CancelledError reaches ModernEra._respond and `abandon` is never called), and
    `_respond`'s finally `let_go()` drops `_call` while the call is still FORWARDING. Its
    request timeout then finds `_call` None (Exchange.stop returns False): the hung call
    keeps its slot, its process, for good (found in review; older than laggards.py)."""
    url = await gateway(ASKHANG, **conf(timeout_ms=1500, keepalive_ms=100,
                                        limits={"slow_reader_ms": 300}))
    params = {"name": "floodhang", "arguments": {"lines": 20000},
              "_meta": envelope({}, **{"io.modelcontextprotocol/logLevel": "info"})}
    body = {"jsonrpc": "2.0", "id": next(_ids), "method": "tools/call", "params": params}
    async with http.post(url, json=body,
                         headers=headers_for("tools/call", params, **auth("alice"))) as resp:
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        await asyncio.sleep(2.5)  # not reading: cut off at 0.3 s of a blocked write
    assert await settles_to(http, url, 0, 3) == 0  # past the 1.5 s timeout
