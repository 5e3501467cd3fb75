"""Tasks through the io.modelcontextprotocol/tasks extension, end to end over HTTP in front of
the plain stdio test server: policy modes, lifecycle, input, progress, cancel, timeout,
ownership, bounds and notifications."""

from __future__ import annotations

import asyncio
import gc
import json
import re
from typing import Any

import pytest
from mcp_http import BASIC
from test_modern import headers_for, modern

TASKS = {"extensions": {"io.modelcontextprotocol/tasks": {}}}
POLICY = {"defaults": {"mode": "auto", "sync_budget_ms": 200, "ttl_ms": 60_000,
                       "max_ttl_ms": 120_000, "poll_interval_ms": 700},
          "tools": {"echo": {"mode": "never"}, "whoami": {"mode": "always"},
                    "blob": {"mode": "always"}, "ask": {"mode": "always"},
                    "progress": {"mode": "always"}, "crash": {"mode": "required"},
                    "ask2": {"mode": "always"},
                    "hang": {"mode": "always", "timeout_ms": 300}}}


async def call(http, url, name, arguments=None, caps=None, headers=None) -> Any:
    return await modern(http, url, "tools/call", {"name": name, "arguments": arguments or {}},
                        TASKS if caps is None else caps, headers=headers)


async def tasks_op(http, url, method, task_id, headers=None, caps=None, **params):
    return await modern(http, url, method, {"taskId": task_id, **params},
                        TASKS if caps is None else caps, headers=headers)


async def wait_for(http, url, task_id, status, headers=None) -> dict[str, Any]:
    for _ in range(100):
        task = (await tasks_op(http, url, "tasks/get", task_id, headers)).body["result"]
        if task["status"] == status:
            return task
        await asyncio.sleep(0.05)
    raise AssertionError(f"task never reached {status}: {task}")


async def misnamed_get(http, url, task_id, headers) -> tuple[int, int]:
    """A tasks/get whose Mcp-Name disagrees with its taskId: its status and error code."""
    params = {"taskId": task_id, "_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": TASKS}}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": params}
    headers = {**headers_for("tasks/get", params), **headers, "Mcp-Name": "other"}
    async with http.post(url, json=body, headers=headers) as resp:
        return resp.status, (await resp.json())["error"]["code"]


@pytest.fixture
async def url(gateway) -> str:
    return await gateway(tasks=POLICY)


async def test_policy_modes(url, http) -> None:
    assert (await call(http, url, "echo", {"text": "a"})).body["result"]["resultType"] == \
        "complete"  # never
    fast = (await call(http, url, "sleep", {"ms": 10})).body["result"]  # auto, within budget
    assert fast["resultType"] == "complete" and fast["content"][0]["text"] == "slept 10"
    slow = (await call(http, url, "sleep", {"ms": 800})).body["result"]  # auto, over budget
    assert slow["resultType"] == "task" and slow["status"] == "working"
    # Its time bound (request_timeout_ms, 600 s) plus ttl_ms, within max_ttl_ms (issue 40).
    assert (slow["ttlMs"], slow["pollIntervalMs"]) == (120_000, 700)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", slow["createdAt"])
    done = await wait_for(http, url, slow["taskId"], "completed")
    assert done["result"]["content"][0]["text"] == "slept 800"
    assert done["lastUpdatedAt"] >= done["createdAt"] and done["resultType"] == "complete"
    always = (await call(http, url, "whoami")).body["result"]  # always: a task at once
    assert always["resultType"] == "task"
    plain = (await call(http, url, "whoami", caps={})).body["result"]  # no extension: inline
    assert plain["resultType"] == "complete"


async def test_required_tool_without_the_extension(url, http) -> None:
    reply = await call(http, url, "crash", caps={})
    assert reply.status == 400 and reply.body["error"]["code"] == -32021
    assert reply.body["error"]["data"] == {
        "requiredCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}}}


async def test_tool_errors_complete_and_protocol_errors_fail(url, http) -> None:
    bad = (await call(http, url, "blob", {"bytes": "not a number"})).body["result"]
    failed = await wait_for(http, url, bad["taskId"], "failed")
    assert failed["error"]["code"] == -32603 and "statusMessage" in failed
    soft = (await modern(http, url, "tools/call", {"name": "nosuch", "arguments": {}},
                         TASKS)).body["result"]  # unknown tool: an isError result
    if soft["resultType"] == "task":
        soft = await wait_for(http, url, soft["taskId"], "completed")
    assert soft["result"]["isError"] is True if "result" in soft else soft["isError"] is True


async def test_timeout_fails_the_task_and_cancels_upstream(url, http) -> None:
    task = (await call(http, url, "hang")).body["result"]
    failed = await wait_for(http, url, task["taskId"], "failed")
    assert "timed out" in failed["error"]["message"]
    seen = json.loads((await call(http, url, "cancelled", caps={})).body["result"]["content"][0]
                      ["text"])
    assert len(seen) == 1


async def test_cancel_is_an_idempotent_ack(url, http) -> None:
    task = (await call(http, url, "sleep", {"ms": 5000})).body["result"]
    for _ in range(2):
        ack = await tasks_op(http, url, "tasks/cancel", task["taskId"])
        assert ack.body["result"] == {"resultType": "complete"}
    assert (await wait_for(http, url, task["taskId"], "cancelled"))["status"] == "cancelled"
    seen = json.loads((await call(http, url, "cancelled", caps={})).body["result"]["content"][0]
                      ["text"])
    assert len(seen) == 1  # the upstream was told


async def test_input_while_a_task_runs(url, http) -> None:
    caps = {**TASKS, "elicitation": {}}
    task = (await call(http, url, "ask", {"message": "Name?"}, caps)).body["result"]
    waiting = await wait_for(http, url, task["taskId"], "input_required")
    (key, request), = waiting["inputRequests"].items()
    assert request["method"] == "elicitation/create"
    ignored = await tasks_op(http, url, "tasks/update", task["taskId"],
                             inputResponses={"unknown-key": {"action": "decline"}})
    assert ignored.body["result"] == {"resultType": "complete"}
    assert (await wait_for(http, url, task["taskId"], "input_required"))["inputRequests"]
    answer = {"action": "accept", "content": {"name": "Ada"}}
    await tasks_op(http, url, "tasks/update", task["taskId"], inputResponses={key: answer})
    done = await wait_for(http, url, task["taskId"], "completed")
    assert json.loads(done["result"]["content"][0]["text"]) == answer


async def test_progress_is_folded_into_the_status_message(url, http) -> None:
    task = (await call(http, url, "progress", {"steps": 4, "delay_ms": 150})).body["result"]
    messages = set()
    for _ in range(60):
        got = (await tasks_op(http, url, "tasks/get", task["taskId"])).body["result"]
        messages.add(got.get("statusMessage"))
        if got["status"] == "completed":
            break
        await asyncio.sleep(0.03)
    assert any(m and re.fullmatch(r"\d/4: step \d", m) for m in messages)


async def test_ownership_and_wrong_requests(gateway, http) -> None:
    url = await gateway(tasks=POLICY, auth={"bearer_tokens": ["alice", "bob"]})
    alice, bob = {"Authorization": "Bearer alice"}, {"Authorization": "Bearer bob"}
    task = (await call(http, url, "whoami", headers=alice)).body["result"]
    foreign = await tasks_op(http, url, "tasks/get", task["taskId"], bob)
    unknown = await tasks_op(http, url, "tasks/get", "no-such-task", bob)
    assert foreign.body["error"] == {**unknown.body["error"],
                                     "data": {"taskId": task["taskId"]}}
    assert foreign.body["error"]["message"] == "Task not found"
    undeclared = await tasks_op(http, url, "tasks/get", task["taskId"], alice, caps={})
    assert undeclared.status == 400 and undeclared.body["error"]["code"] == -32021
    for method in ("tasks/result", "tasks/list"):
        gone = await tasks_op(http, url, method, task["taskId"], alice)
        assert (gone.status, gone.body["error"]["code"]) == (404, -32601)
    assert await misnamed_get(http, url, task["taskId"], alice) == (400, -32020)


async def test_a_full_store_answers_inline(gateway, http) -> None:
    url = await gateway(tasks=POLICY, limits={"max_tasks_per_owner": 1})
    first = (await call(http, url, "sleep", {"ms": 3000})).body["result"]
    assert first["resultType"] == "task"
    second = (await call(http, url, "whoami")).body["result"]  # always, but no room
    assert second["resultType"] == "complete"
    async with http.get(url.replace("/mcp", "/readyz?detail")) as resp:
        assert (await resp.json())["counters"]["tasks.inline_store_full"] >= 1


def store_of(request: pytest.FixtureRequest, backend: str) -> dict[str, Any]:
    """A gateway's `store` and `replica` keys for `backend` (Redis: the test server)."""
    if backend == "memory":
        return {}
    return {"store": {"backend": "redis", "url": request.getfixturevalue("redis_server").url,
                      "key_prefix": request.getfixturevalue("key_prefix")},
            "replica": {"secret": "a secret every replica shares"}}


@pytest.mark.parametrize("backend", ["memory", "redis"])
@pytest.mark.parametrize("reads", [True, False], ids=["reads", "never-reads"])
async def test_an_owner_that_reads_its_results_keeps_getting_tasks(
        gateway, http, request, backend, reads) -> None:
    """Issue 40: without auth (one anonymous principal) 300 slow calls, 50 at a time, with
    50 running and 100 held at most. An owner that reads each result (a tasks/get that
    shows it) gets a task for every call, its read tasks making room; one that never reads
    gets tasks until it holds 100, then inline answers, as documented."""
    limits = {"max_tasks_per_owner": 50, "max_finished_tasks_per_owner": 100,
              "task_requests_per_s": 0, "task_creations_per_s": 0}
    # Tasks from the start (mode always): a call answers inline only where no task could
    # be made, never because it ended while its task was written (a loaded machine).
    always = {**POLICY, "tools": {**POLICY["tools"], "sleep": {"mode": "always"}}}
    url = await gateway(tasks=always, limits=limits, **store_of(request, backend))
    kinds: list[str] = []
    for _ in range(6):
        replies = await asyncio.gather(*(call(http, url, "sleep", {"ms": 1000})
                                         for _ in range(50)))
        results = [r.body["result"] for r in replies]
        kinds += [r["resultType"] for r in results]
        if reads:
            for task in (r for r in results if r["resultType"] == "task"):
                done = await wait_for(http, url, task["taskId"], "completed")
                assert done["result"]["content"][0]["text"] == "slept 1000"
        else:
            await asyncio.sleep(1.2)  # they end meanwhile, unread
    expected = ["task"] * 300 if reads else ["task"] * 100 + ["complete"] * 200
    assert kinds == expected


async def test_expired_tasks_say_so(gateway, http) -> None:
    """A ttl of 300 ms asked by the operator's cap (no client asks one here): past it the
    finished task reads failed, saying so, its result gone (a poll loop ends on it)."""
    url = await gateway(tasks={**POLICY, "defaults": {**POLICY["defaults"], "ttl_ms": 300,
                                                      "max_ttl_ms": 300}})
    task = (await call(http, url, "whoami")).body["result"]
    assert task["ttlMs"] == 300
    await wait_for(http, url, task["taskId"], "completed")
    await asyncio.sleep(0.5)
    expired = (await tasks_op(http, url, "tasks/get", task["taskId"])).body["result"]
    assert expired["status"] == "failed" and "result" not in expired
    assert expired["statusMessage"] == "expired: its ttl of 300 ms passed"


async def test_listen_pushes_full_tasks(url, http) -> None:
    task = (await call(http, url, "sleep", {"ms": 400})).body["result"]
    params = {"notifications": {"taskIds": [task["taskId"], "not-mine"]},
              "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                        "io.modelcontextprotocol/clientCapabilities": TASKS}}
    body = {"jsonrpc": "2.0", "id": "s", "method": "subscriptions/listen", "params": params}
    async with http.post(url, json=body, headers=headers_for("subscriptions/listen", params)
                         ) as stream:
        events = []
        while not any(e.get("method") == "notifications/tasks" for e in events):
            line = (await asyncio.wait_for(stream.content.readline(), 5)).decode()
            if line.startswith("data:"):
                events.append(json.loads(line[5:]))
    assert events[0]["params"]["notifications"] == {"taskIds": [task["taskId"]]}
    pushed = events[-1]["params"]
    assert pushed["taskId"] == task["taskId"] and pushed["status"] == "completed"
    assert pushed["result"]["content"][0]["text"] == "slept 400"
    assert pushed["_meta"]["io.modelcontextprotocol/subscriptionId"] == "s"


async def test_two_requests_at_once_show_two_keys(url, http) -> None:
    caps = {**TASKS, "elicitation": {}}
    task = (await call(http, url, "ask2", {}, caps)).body["result"]
    for _ in range(50):
        waiting = (await tasks_op(http, url, "tasks/get", task["taskId"])).body["result"]
        if len(waiting.get("inputRequests", {})) == 2:
            break
        await asyncio.sleep(0.05)
    first, second = sorted(waiting["inputRequests"])
    await tasks_op(http, url, "tasks/update", task["taskId"],
                   inputResponses={first: {"action": "decline"}})
    partial = await wait_for(http, url, task["taskId"], "input_required")
    assert list(partial["inputRequests"]) == [second]  # only what is still outstanding
    await tasks_op(http, url, "tasks/update", task["taskId"],
                   inputResponses={second: {"action": "cancel"}, first: {"x": 1}})
    done = await wait_for(http, url, task["taskId"], "completed")
    assert json.loads(done["result"]["content"][0]["text"]) == [{"action": "decline"},
                                                               {"action": "cancel"}]


async def test_params_task_is_ignored(url, http) -> None:
    reply = await modern(http, url, "tools/call", {"name": "params", "arguments": {},
                                                   "task": {"ttl": 1000}}, TASKS)
    result = reply.body["result"]
    if result["resultType"] == "task":
        result = (await wait_for(http, url, result["taskId"], "completed"))["result"]
    assert "task" not in json.loads(result["content"][0]["text"])


async def test_rate_limits_per_owner_on_task_requests_and_creation(gateway, http,
                                                                   client) -> None:
    """Issue 11: too many tasks/* requests or new tasks from one owner get a JSON-RPC error
    that says to slow down (HTTP 429 for a modern client; 200 in a core-tasks session, as
    its other errors); a modern call whose task would be one too many is answered inline."""
    limits = {"task_requests_per_s": 1, "task_requests_burst": 2,
              "task_creations_per_s": 0.5, "task_creations_burst": 1}
    url = await gateway(tasks=POLICY, limits=limits)
    first = (await call(http, url, "whoami")).body["result"]
    assert first["resultType"] == "task"
    inline = (await call(http, url, "whoami")).body["result"]  # no token left for a task
    assert inline["resultType"] == "complete" and inline["content"]
    # A core-tasks session takes from its principal's buckets (here the one anonymous
    # principal's): a new session is no new bucket (issue 29).
    core = client(url)
    await core.initialize(version="2025-11-25")
    refused = await core.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                               "params": {"name": "whoami", "arguments": {}, "task": {}}})
    assert refused.status == 200 and refused.body["error"]["code"] == -32000
    replies = [await tasks_op(http, url, "tasks/get", first["taskId"]) for _ in range(3)]
    assert [r.status for r in replies] == [200, 200, 429]
    slow_down = replies[2].body["error"]
    assert slow_down["code"] == -32000 and "slow down" in slow_down["message"]
    assert slow_down["data"]["retryAfterMs"] > 0
    await asyncio.sleep(slow_down["data"]["retryAfterMs"] / 1000)
    assert (await tasks_op(http, url, "tasks/get", first["taskId"])).status == 200
    await asyncio.sleep(2.1)  # a creation token back (0.5 a second), and the requests' burst
    created = await core.send({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                               "params": {"name": "whoami", "arguments": {}, "task": {}}})
    assert "task" in created.body["result"]
    polls = [await core.send({"jsonrpc": "2.0", "id": 3 + i, "method": "tasks/list"})
             for i in range(3)]
    assert [p.status for p in polls] == [200, 200, 200]
    assert "error" in polls[2].body and "result" in polls[1].body


async def test_a_finished_task_frees_its_call_at_once(url, http) -> None:
    """Issue 11 (memory): once a task has ended, its run and upstream call wait for no
    garbage collector; only the stored record (with the result) stays, until its ttl."""
    def runs_and_calls() -> dict[int, str]:
        return {id(o): type(o).__name__ for o in gc.get_objects()
                if type(o).__name__ in ("TaskRun", "Call")}

    gc.collect()
    gc.disable()
    try:
        before = runs_and_calls()  # earlier tests' in this process are not this gateway's
        ids = [(await call(http, url, "blob", {"bytes": 1 << 20})).body["result"]["taskId"]
               for _ in range(2)]
        for task_id in ids:
            done = await wait_for(http, url, task_id, "completed")
            assert len(done["result"]["content"][0]["text"]) == 1 << 20
        held = [name for key, name in runs_and_calls().items() if key not in before]
    finally:
        gc.enable()
    assert held == []


async def test_a_finished_task_read_again_answers_its_owner_alone(gateway, http) -> None:
    """A finished task's answer is kept from its first read (tasks/kept.py): read again it is
    the same; Bob naming it gets what an unknown id gets, an undeclared extension -32021, a
    Mcp-Name that disagrees -32020, exactly as before it was kept."""
    url = await gateway(tasks=POLICY, auth={"bearer_tokens": ["alice", "bob"]})
    alice, bob = {"Authorization": "Bearer alice"}, {"Authorization": "Bearer bob"}
    task_id = (await call(http, url, "whoami", headers=alice)).body["result"]["taskId"]
    first = await wait_for(http, url, task_id, "completed", alice)
    again = [(await tasks_op(http, url, "tasks/get", task_id, alice)).body for _ in range(2)]
    assert [reply["result"] for reply in again] == [first, first]
    assert again[0]["id"] != again[1]["id"]  # each answer carries its own request's id
    assert first["result"]["content"][0]["text"].isdigit()  # the server's pid: its answer
    foreign = await tasks_op(http, url, "tasks/get", task_id, bob)
    unknown = await tasks_op(http, url, "tasks/get", "no-such-task", bob)
    assert (foreign.status, foreign.body["error"]) == (
        unknown.status, {**unknown.body["error"], "data": {"taskId": task_id}})
    undeclared = await tasks_op(http, url, "tasks/get", task_id, alice, caps={})
    assert undeclared.status == 400 and undeclared.body["error"]["code"] == -32021
    assert await misnamed_get(http, url, task_id, alice) == (400, -32020)


async def test_tasks_stay_reachable_while_the_server_cannot_start(gateway, http,
                                                                  tmp_path) -> None:
    """Issue 51: a modern request the gateway answers by itself no longer waits for the
    server's route. While the server cannot start again, Alice's finished task is still
    read (its handle was returned); an id the gateway does not hold (unknown, or Bob's
    view of hers) is a 503, as before, never "not found" (it may be the server's own)."""
    down = tmp_path / "down"
    script = (f'[ -e "{down}" ] && BASIC_EXIT_AT_START=3 exec "{BASIC[0]}" "{BASIC[1]}"; '
              f'exec "{BASIC[0]}" "{BASIC[1]}"')
    url = await gateway(["sh", "-c", script], tasks=POLICY,
                        upstream={"restart_backoff_max_ms": 200},
                        auth={"bearer_tokens": ["alice-reach", "bob-reach"]})
    alice, bob = {"Authorization": "Bearer alice-reach"}, {"Authorization": "Bearer bob-reach"}
    made = (await call(http, url, "whoami", headers=alice)).body["result"]
    await asyncio.sleep(0.5)  # it ends; unread (a read answer is kept: tasks/kept.py)
    down.touch()
    await call(http, url, "crash", headers=alice)  # the server exits; it cannot start again
    for _ in range(100):  # until the gateway knows the server down (a call may meet it
        # gone first, while the process's exit is still being read: one loaded CI run)
        async with http.get(url.replace("/mcp", "/readyz")) as ready:
            if ready.status == 503:
                break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("the server never went down")
    assert (await call(http, url, "echo", {"text": "x"}, headers=alice)).status == 503
    got = await tasks_op(http, url, "tasks/get", made["taskId"], headers=alice)
    assert got.status == 200, got.body
    assert got.body["result"]["status"] == "completed" and got.body["result"]["result"]
    for who, named in ((alice, "no-such-task"), (bob, made["taskId"])):
        reply = await tasks_op(http, url, "tasks/get", named, headers=who)
        assert reply.status == 503, reply.body
        assert reply.body["error"]["data"]["upstream"] == "main"
    down.unlink()
