"""Core tasks (protocol 2025-11-25) for legacy sessions, end to end over HTTP in front of the
plain stdio test server: negotiation, creation, tasks/*, status semantics, input, progress,
status notifications, and both dialects side by side on one gateway."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import pytest
from mcp_http import McpHttp, next_event
from test_modern import modern

RELATED = "io.modelcontextprotocol/related-task"
POLICY = {"defaults": {"mode": "auto", "sync_budget_ms": 200, "ttl_ms": 60_000,
                       "max_ttl_ms": 120_000, "poll_interval_ms": 700},
          "tools": {"echo": {"mode": "never"}, "crash": {"mode": "required"},
                    "whoami": {"mode": "always"},
                    "sleep": {"immediate_response": "Started; results follow."}}}


@pytest.fixture
async def url(gateway) -> str:
    return await gateway(tasks=POLICY)


async def session(client, url: str, capabilities: dict[str, Any] | None = None,
                  version: str = "2025-11-25") -> McpHttp:
    c = client(url)
    await c.initialize(capabilities or {"elicitation": {}}, version=version)
    return c


async def request(c: McpHttp, method: str, params: dict[str, Any]) -> dict[str, Any]:
    reply = await c.send({"jsonrpc": "2.0", "id": next(c.ids), "method": method,
                          "params": params})
    assert reply.status == 200, reply.raw
    return reply.message


async def as_task(c: McpHttp, name: str, arguments: dict[str, Any] | None = None,
                  task: dict[str, Any] | None = None, meta: dict[str, Any] | None = None
                  ) -> dict[str, Any]:
    params: dict[str, Any] = {"name": name, "arguments": arguments or {}, "task": task or {}}
    if meta:
        params["_meta"] = meta
    return await request(c, "tools/call", params)


async def wait_for(c: McpHttp, task_id: str, status: str) -> dict[str, Any]:
    for _ in range(200):
        task = (await request(c, "tasks/get", {"taskId": task_id}))["result"]
        if task["status"] == status:
            return task
        await asyncio.sleep(0.03)
    raise AssertionError(f"task never reached {status}: {task}")


async def test_negotiation(url, client) -> None:
    c = client(url)
    init = (await c.initialize({}, version="2025-11-25")).body["result"]
    assert init["protocolVersion"] == "2025-11-25"
    assert init["capabilities"]["tasks"] == {"list": {}, "cancel": {},
                                             "requests": {"tools": {"call": {}}}}
    assert "extensions" not in init["capabilities"]  # the extension is modern-only
    tools = (await request(c, "tools/list", {}))["result"]["tools"]
    support = {t["name"]: t["execution"]["taskSupport"] for t in tools}
    assert (support["echo"], support["sleep"], support["whoami"], support["crash"]) == (
        "forbidden", "optional", "optional", "required")
    assert all(t["inputSchema"] == {"type": "object"} for t in tools)  # the rest untouched
    old = client(url)
    init = (await old.initialize({}, version="2025-06-18")).body["result"]
    assert "tasks" not in init["capabilities"]
    assert all("execution" not in t for t in (await request(old, "tools/list", {}))[
        "result"]["tools"])


async def test_creation_and_result(url, client) -> None:
    c = await session(client, url)
    created = (await as_task(c, "sleep", {"ms": 300}, {"ttl": 10**9}))["result"]
    task = created["task"]
    assert task["status"] == "working" and task["ttl"] == 120_000  # clamped to max_ttl_ms
    assert task["pollInterval"] == 700 and task["createdAt"].endswith("Z")
    assert created["_meta"]["io.modelcontextprotocol/model-immediate-response"] == \
        "Started; results follow."
    # tasks/result before completion blocks until the task is done, then returns exactly
    # the call's result with the related-task _meta.
    result = (await request(c, "tasks/result", {"taskId": task["taskId"]}))["result"]
    assert result["content"] == [{"type": "text", "text": "slept 300"}]
    assert result["_meta"][RELATED] == {"taskId": task["taskId"]}
    done = (await request(c, "tasks/get", {"taskId": task["taskId"]}))["result"]
    assert done["status"] == "completed" and done["lastUpdatedAt"] >= done["createdAt"]
    # The upstream saw a plain call: no params.task.
    seen = (await as_task(c, "params"))["result"]["task"]["taskId"]
    keys = json.loads((await request(c, "tasks/result", {"taskId": seen}))["result"][
        "content"][0]["text"])
    assert "task" not in keys and "name" in keys


async def test_forbidden_required_and_plain_calls(url, client) -> None:
    c = await session(client, url)
    refused = await as_task(c, "echo", {"text": "x"})
    assert refused["error"]["code"] == -32601 and "forbidden" in refused["error"]["message"]
    plain = await request(c, "tools/call", {"name": "crash", "arguments": {}})
    assert plain["error"]["code"] == -32601 and "required" in plain["error"]["message"]
    inline = await request(c, "tools/call", {"name": "echo", "arguments": {"text": "hi"}})
    assert inline["result"]["content"][0]["text"] == "hi"  # plain calls pass through
    bad = await request(c, "tools/call", {"name": "sleep", "arguments": {}, "task": 5})
    assert bad["error"]["code"] == -32602


async def test_full_store_answers_internal_error(gateway, client) -> None:
    url = await gateway(tasks=POLICY, limits={"max_tasks_per_owner": 1})
    c = await session(client, url)
    assert "task" in (await as_task(c, "sleep", {"ms": 2000}))["result"]
    full = await as_task(c, "sleep", {"ms": 10})
    assert full["error"]["code"] == -32603 and "maximum of 1 tasks" in full["error"]["message"]


async def test_a_client_that_fetches_its_results_keeps_getting_tasks(gateway,
                                                                     client) -> None:
    """Issue 40: tasks/result marks a result read, so the task makes room for the next one
    once the client holds its maximum; a task whose result was never fetched never does."""
    url = await gateway(tasks=POLICY, limits={"max_finished_tasks_per_owner": 3})
    c = await session(client, url)
    ids = []
    for _ in range(6):
        created = await as_task(c, "sleep", {"ms": 10})
        ids.append(created["result"]["task"]["taskId"])
        final = await request(c, "tasks/result", {"taskId": ids[-1]})
        assert final["result"]["content"][0]["text"] == "slept 10"
    unread = [(await as_task(c, "sleep", {"ms": 10}))["result"]["task"]["taskId"]
              for _ in range(3)]  # the last one read made room for the third
    full = await as_task(c, "sleep", {"ms": 10})
    assert "none of them finished with its result read" in full["error"]["message"]
    for task_id in unread:  # kept, whatever came after
        assert (await wait_for(c, task_id, "completed"))["status"] == "completed"
    gone = await request(c, "tasks/get", {"taskId": ids[0]})  # read and evicted: unknown
    assert gone["error"]["message"] == "Failed to retrieve task: Task not found"


async def test_list_pages_and_ownership(url, client) -> None:
    c = await session(client, url)
    ids = [(await as_task(c, "sleep", {"ms": 0}))["result"]["task"][
        "taskId"] for _ in range(55)]
    first = (await request(c, "tasks/list", {}))["result"]
    assert len(first["tasks"]) == 50 and "nextCursor" in first
    second = (await request(c, "tasks/list", {"cursor": first["nextCursor"]}))["result"]
    assert "nextCursor" not in second
    assert [t["taskId"] for t in first["tasks"] + second["tasks"]] == ids
    bad = await request(c, "tasks/list", {"cursor": "not-a-cursor"})
    assert bad["error"]["code"] == -32602
    forged = base64.urlsafe_b64encode(b'{"x":1}').decode()
    assert (await request(c, "tasks/list", {"cursor": forged}))["error"]["code"] == -32602
    # Another session sees none of them, and their ids are "not found" to it.
    other = await session(client, url)
    assert (await request(other, "tasks/list", {}))["result"]["tasks"] == []
    for method in ("tasks/get", "tasks/result", "tasks/cancel"):
        err = (await request(other, method, {"taskId": ids[0]}))["error"]
        assert err["code"] == -32602 and "not found" in err["message"]
    assert (await request(c, "tasks/get", {"taskId": "nope"}))["error"]["code"] == -32602


async def test_is_error_and_protocol_errors_fail(url, client) -> None:
    c = await session(client, url)
    soft = (await as_task(c, "nosuch"))["result"]["task"]["taskId"]
    failed = await wait_for(c, soft, "failed")
    assert failed["taskId"] == soft
    result = (await request(c, "tasks/result", {"taskId": soft}))["result"]
    assert result["isError"] is True and result["_meta"][RELATED] == {"taskId": soft}
    hard = (await as_task(c, "blob", {"bytes": "many"}))["result"]["task"]["taskId"]
    await wait_for(c, hard, "failed")
    error = (await request(c, "tasks/result", {"taskId": hard}))["error"]
    assert error["code"] == -32603 and "many" in error["message"]  # the server's own error


async def test_cancel_while_running_and_after_completion(url, client) -> None:
    c = await session(client, url)
    before = json.loads((await c.call("cancelled")).message["result"]["content"][0]["text"])
    running = (await as_task(c, "sleep", {"ms": 5000}))["result"]["task"]["taskId"]
    cancelled = (await request(c, "tasks/cancel", {"taskId": running}))["result"]
    assert cancelled["status"] == "cancelled" and cancelled["taskId"] == running
    after = json.loads((await c.call("cancelled")).message["result"]["content"][0]["text"])
    assert len(after) == len(before) + 1  # the upstream got notifications/cancelled
    again = (await request(c, "tasks/cancel", {"taskId": running}))["error"]
    assert again["code"] == -32602 and "'cancelled'" in again["message"]
    quick = (await as_task(c, "sleep", {"ms": 0}))["result"]["task"]["taskId"]
    await wait_for(c, quick, "completed")
    late = (await request(c, "tasks/cancel", {"taskId": quick}))["error"]
    assert late["code"] == -32602 and "already in terminal status 'completed'" in late["message"]
    gone = await request(c, "tasks/result", {"taskId": running})
    assert gone["error"]["code"] == -32800


async def test_a_task_outliving_its_ttl_ends_and_lets_go(gateway, client, http) -> None:
    """A ttl shorter than the tool, by the operator's cap (a client's own ttl no longer
    ends a run: issue 40). The waiting tasks/result answers at the ttl (it never hangs), the
    upstream call is cancelled, the task then reads failed, and the result that would have
    come is never counted against the store."""
    url = await gateway(tasks={**POLICY, "defaults": {**POLICY["defaults"],
                                                      "max_ttl_ms": 300}})
    c = await session(client, url)
    before = json.loads((await c.call("cancelled")).message["result"]["content"][0]["text"])
    task_id = (await as_task(c, "sleep", {"ms": 1500}, {"ttl": 300}))["result"]["task"][
        "taskId"]
    answer = await asyncio.wait_for(request(c, "tasks/result", {"taskId": task_id}), 1.2)
    assert "expired" in answer["error"]["message"]
    after = json.loads((await c.call("cancelled")).message["result"]["content"][0]["text"])
    assert len(after) == len(before) + 1  # the upstream got notifications/cancelled
    gone = (await request(c, "tasks/get", {"taskId": task_id}))["result"]
    assert gone["status"] == "failed" and gone["statusMessage"].startswith("expired")
    await asyncio.sleep(1.5)  # past the moment the sleep would have answered
    async with http.get(url.replace("/mcp", "/readyz?detail")) as resp:
        tasks = (await resp.json())["tasks"]
    assert tasks == {"running": 0, "stored_bytes": 0}


async def test_input_on_the_tasks_result_stream(url, client, http) -> None:
    c = await session(client, url)
    task_id = (await as_task(c, "ask", {"message": "Name?"}))["result"]["task"]["taskId"]
    assert (await wait_for(c, task_id, "input_required"))["taskId"] == task_id
    body = {"jsonrpc": "2.0", "id": 99, "method": "tasks/result", "params": {"taskId": task_id}}
    async with http.post(c.url, json=body, headers=c.headers()) as stream:
        asked = await next_event(stream)
        assert asked["method"] == "elicitation/create"
        assert asked["params"]["_meta"][RELATED] == {"taskId": task_id}
        reply = await c.send({"jsonrpc": "2.0", "id": asked["id"],
                              "result": {"action": "accept", "content": {"name": "Ada"}}})
        assert reply.status == 202
        final = await next_event(stream)
    assert final["id"] == 99
    assert json.loads(final["result"]["content"][0]["text"])["content"] == {"name": "Ada"}
    assert final["result"]["_meta"][RELATED] == {"taskId": task_id}


async def test_input_progress_and_status_on_the_get_stream(url, client, http) -> None:
    c = await session(client, url)
    async with http.get(c.url, headers=c.headers(Accept="text/event-stream")) as stream:
        task_id = (await as_task(c, "ask"))["result"]["task"]["taskId"]
        events = [await next_event(stream), await next_event(stream)]
        status = next(e for e in events if e.get("method") == "notifications/tasks/status")
        assert status["params"]["status"] == "input_required"
        assert status["params"]["taskId"] == task_id and "ttl" in status["params"]
        asked = next(e for e in events if e.get("method") == "elicitation/create")
        assert asked["params"]["_meta"][RELATED] == {"taskId": task_id}
        await c.send({"jsonrpc": "2.0", "id": asked["id"],
                      "result": {"action": "decline"}})
        seen = [(await next_event(stream))["params"]["status"] for _ in range(2)]
        assert seen == ["working", "completed"]
        # Progress keeps the client's own token, on the session's stream, until the end.
        progress = (await as_task(c, "progress", {"steps": 3},
                                  meta={"progressToken": "mine"}))["result"]["task"]["taskId"]
        got = [await next_event(stream) for _ in range(4)]
        notes = [e["params"] for e in got if e["method"] == "notifications/progress"]
        assert [(n["progressToken"], n["progress"]) for n in notes] == [
            ("mine", 1), ("mine", 2), ("mine", 3)]
        assert got[-1]["method"] == "notifications/tasks/status"
        assert got[-1]["params"] == (await request(c, "tasks/get", {"taskId": progress}))[
            "result"]


async def test_session_end_cancels_its_tasks(url, client) -> None:
    c = await session(client, url)
    task_id = (await as_task(c, "sleep", {"ms": 5000}))["result"]["task"]["taskId"]
    watcher = await session(client, url)
    before = json.loads((await watcher.call("cancelled")).message["result"]["content"][0][
        "text"])
    async with c.http.delete(c.url, headers=c.headers()) as resp:
        assert resp.status == 200
    after = json.loads((await watcher.call("cancelled")).message["result"]["content"][0][
        "text"])
    assert len(after) == len(before) + 1
    gone = (await request(watcher, "tasks/get", {"taskId": task_id}))["error"]
    assert gone["code"] == -32602


async def outlived(client, url: str, token: str, ms: int) -> dict[str, Any]:
    """`token`'s core task of `sleep` (`ms`) made in a session that is then DELETEd: the
    answer its tasks/result gets in a new session of the same principal."""
    auth = {"Authorization": f"Bearer {token}"}
    first = client(url)
    await first.initialize({}, "2025-11-25", headers=auth)
    created = await first.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "sleep", "arguments": {"ms": ms}, "task": {}}}, **auth)
    task_id = created.message["result"]["task"]["taskId"]
    async with first.http.delete(first.url, headers=first.headers(**auth)) as resp:
        assert resp.status == 200
    again = client(url)
    await again.initialize({}, "2025-11-25", headers=auth)
    ended = await asyncio.wait_for(again.send(
        {"jsonrpc": "2.0", "id": 2, "method": "tasks/result", "params": {"taskId": task_id}},
        **auth), 10)
    return {"taskId": task_id, **ended.message}


async def test_with_auth_a_task_outlives_its_session(gateway, client) -> None:
    """With auth a core task is its principal's: its session's end (DELETE) leaves it
    running, and another session of the principal gets its result. (The session's end
    cancelled its call upstream, and the task stayed `working` until its ttl.) Bob, another
    principal, finds it no more than an unknown id."""
    url = await gateway(tasks=POLICY, auth={"bearer_tokens": ["alice-core", "bob-core"]})
    ended = await outlived(client, url, "alice-core", 800)
    assert ended["result"]["content"][0]["text"] == "slept 800"
    bob = client(url)
    await bob.initialize({}, "2025-11-25", headers={"Authorization": "Bearer bob-core"})
    for named in (ended["taskId"], "no-such-task"):
        probe = await bob.send({"jsonrpc": "2.0", "id": 3, "method": "tasks/get",
                                "params": {"taskId": named}}, Authorization="Bearer bob-core")
        assert probe.message["error"]["code"] == -32602


async def test_a_tasks_call_in_its_sessions_own_process_says_why_it_ended(gateway, client
                                                                          ) -> None:
    """Under `isolation: client` a session's process is its own and closes with it: a task
    that outlives the session (auth) fails there, saying its session's process closed, not
    that the gateway stops (reason `session_lost`, not `shutdown`)."""
    url = await gateway(tasks=POLICY, auth={"bearer_tokens": ["alice-own"]},
                        upstream={"isolation": "client"})
    error = (await outlived(client, url, "alice-own", 5000))["error"]
    assert error["data"]["reason"] == "session_lost", error
    assert "session ended" in error["message"] and "shutting down" not in error["message"]


async def test_both_dialects_side_by_side(url, client, http) -> None:
    legacy = await session(client, url)
    core_id = (await as_task(legacy, "sleep", {"ms": 0}))["result"]["task"]["taskId"]
    ext = {"extensions": {"io.modelcontextprotocol/tasks": {}}}
    modern_task = (await modern(http, url, "tools/call", {"name": "whoami", "arguments": {}},
                                ext)).body["result"]
    assert modern_task["resultType"] == "task" and "ttlMs" in modern_task
    # Each task renders only in the dialect that created it.
    assert (await request(legacy, "tasks/get", {"taskId": modern_task["taskId"]}))[
        "error"]["code"] == -32602
    foreign = await modern(http, url, "tasks/get", {"taskId": core_id}, ext)
    assert foreign.body["error"]["code"] == -32602
    # A plain legacy client still gets plain answers.
    plain = await session(client, url, version="2025-06-18")
    assert (await plain.call("sleep", {"ms": 0})).message["result"]["content"][0]["text"] == \
        "slept 0"


async def test_a_cancelled_task_reads_the_same_in_both_eras(url, client, http) -> None:
    """Issue 33: a client that cancels its task reads one status message, whichever era it
    speaks."""
    legacy = await session(client, url)
    core_id = (await as_task(legacy, "sleep", {"ms": 5000}))["result"]["task"]["taskId"]
    core_end = (await request(legacy, "tasks/cancel", {"taskId": core_id}))["result"]
    ext = {"extensions": {"io.modelcontextprotocol/tasks": {}}}
    handle = (await modern(http, url, "tools/call", {"name": "sleep", "arguments": {
        "ms": 5000}}, ext)).body["result"]
    await modern(http, url, "tasks/cancel", {"taskId": handle["taskId"]}, ext)
    modern_end = (await modern(http, url, "tasks/get", {"taskId": handle["taskId"]}, ext)
                  ).body["result"]
    assert core_end["status"] == modern_end["status"] == "cancelled"
    assert core_end["statusMessage"] == modern_end["statusMessage"] == "cancelled by the client"


async def test_a_finished_task_read_again_is_its_sessions_alone(url, client) -> None:
    """tasks/get and tasks/result of a finished core task are kept from their first read
    (tasks/kept.py): read again, the same answers; another session gets "not found"."""
    c = await session(client, url)
    task_id = (await as_task(c, "whoami"))["result"]["task"]["taskId"]
    await wait_for(c, task_id, "completed")
    reads = [await request(c, method, {"taskId": task_id})
             for method in ("tasks/get", "tasks/result") for _ in range(2)]
    assert reads[0]["result"] == reads[1]["result"] and reads[0]["id"] != reads[1]["id"]
    assert reads[2]["result"] == reads[3]["result"]
    assert reads[2]["result"]["_meta"][RELATED] == {"taskId": task_id}
    assert reads[2]["result"]["content"][0]["text"].isdigit()
    other = await session(client, url)
    for method in ("tasks/get", "tasks/result"):
        err = (await request(other, method, {"taskId": task_id}))["error"]
        assert err["code"] == -32602 and "not found" in err["message"]
