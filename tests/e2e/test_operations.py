"""What an operator sees: /metrics (read with prometheus-client's own parser), audit events,
and access to both, in front of the plain stdio test server."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import structlog
from prometheus_client.parser import text_string_to_metric_families
from test_core_tasks import as_task, session
from test_core_tasks import wait_for as core_wait_for
from test_modern import modern
from test_tasks import POLICY, TASKS, call, tasks_op, wait_for

from gateway.observability import owner_hash

TOKEN = "client-secret-token"
ADMIN = "operator-secret-token"


async def scrape(http, url: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
    """Every sample of /metrics: (name, sorted label items) -> value."""
    async with http.get(url.replace("/mcp", "/metrics"), headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = await resp.text()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: dict[str, Any], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.fixture
async def url(gateway) -> str:
    return await gateway(tasks=POLICY, limits={"max_body_bytes": 4096})


async def test_metrics_count_requests_tasks_and_refusals(url, http, client) -> None:
    before = await scrape(http, url)
    assert value(before, "mcp_gateway_upstream_up", upstream="main") == 1
    assert value(before, "mcp_gateway_tasks_live", status="working") == 0
    await modern(http, url, "tools/list", {}, TASKS)
    task = (await call(http, url, "sleep", {"ms": 1500})).body["result"]
    assert task["resultType"] == "task"
    running = await scrape(http, url)
    assert value(running, "mcp_gateway_tasks_live", status="working") == 1
    assert value(running, "mcp_gateway_tasks_created_total", upstream="main", tool="sleep",
                 dialect="extension") == 1
    await wait_for(http, url, task["taskId"], "completed")
    # A JSON-RPC error is an error, though HTTP says 200.
    failing = await modern(http, url, "tools/call", {"name": "blob", "arguments": {
        "bytes": "not a number"}}, {})
    assert failing.status == 200 and "error" in failing.body
    async with http.post(url, data=b"x" * 5000,
                         headers={"Content-Type": "application/json"}) as resp:
        assert resp.status == 413
    legacy = client(url)
    await legacy.initialize()
    after = await scrape(http, url)
    assert value(after, "mcp_gateway_tasks_live", status="working") == 0
    assert value(after, "mcp_gateway_tasks_finished_total", upstream="main", tool="sleep",
                 status="completed") == 1
    assert value(after, "mcp_gateway_task_duration_seconds_count", upstream="main",
                 tool="sleep") == 1
    assert 1.0 < value(after, "mcp_gateway_task_duration_seconds_sum", upstream="main",
                       tool="sleep") < 10
    assert value(after, "mcp_gateway_requests_total", upstream="main", method="tools/call",
                 era="modern", outcome="ok") == 1
    assert value(after, "mcp_gateway_requests_total", upstream="main", method="tools/call",
                 era="modern", outcome="error") == 1
    assert value(after, "mcp_gateway_requests_total", upstream="main", method="tasks/get",
                 era="modern", outcome="ok") >= 1
    assert value(after, "mcp_gateway_requests_total", upstream="main", method="other",
                 era="legacy", outcome="error") == 1
    assert value(after, "mcp_gateway_requests_total", upstream="main", method="initialize",
                 era="legacy", outcome="ok") == 1
    assert value(after, "mcp_gateway_request_duration_seconds_count", upstream="main",
                 method="tools/list") == 1
    assert value(after, "mcp_gateway_rejections_total", reason="body_too_large", cause="") == 1
    assert value(after, "mcp_gateway_sessions") == 1
    assert value(after, "mcp_gateway_store_bytes") > 0


async def test_tools_are_named_from_the_first_call_whatever_the_client_asked(gateway, http
                                                                            ) -> None:
    """Issue 21: the gateway lists the upstream's tools itself after the handshake, and
    again when the server says its list changed, so no client has to list them first for
    metrics to name its tools."""
    url = await gateway(tasks={**POLICY, "tools": {**POLICY["tools"],
                                                   "added": {"mode": "always"}}})
    first = (await call(http, url, "whoami")).body["result"]  # no tools/list by anyone
    await wait_for(http, url, first["taskId"], "completed")
    await call(http, url, "changed", caps={})  # the server adds a tool, "added"
    for _ in range(50):
        task = (await modern(http, url, "tools/call", {"name": "added", "arguments": {}},
                             TASKS)).body["result"]
        samples = await scrape(http, url)
        if value(samples, "mcp_gateway_tasks_created_total", upstream="main", tool="added",
                 dialect="extension"):
            break
        await asyncio.sleep(0.02)  # the gateway's own tools/list may still be on its way
    assert task["resultType"] in ("task", "complete")
    assert value(samples, "mcp_gateway_tasks_created_total", upstream="main", tool="whoami",
                 dialect="extension") == 1
    assert value(samples, "mcp_gateway_tasks_created_total", upstream="main", tool="added",
                 dialect="extension") >= 1


async def test_metric_labels_stay_bounded_whatever_clients_send(url, http) -> None:
    """Methods and tool names a client makes up are counted as "other", never as labels."""
    for n in range(5):
        await modern(http, url, f"made/up-{n}", {}, TASKS)
        reply = await call(http, url, f"nosuch-{n}", caps=TASKS)
        assert reply.status == 200
    samples = await scrape(http, url)
    labels = {dict(k[1]).get("method") for k in samples} | {dict(k[1]).get("tool")
                                                            for k in samples}
    assert not any(str(x).startswith(("made/", "nosuch-")) for x in labels)
    assert value(samples, "mcp_gateway_requests_total", upstream="main", method="other",
                 era="modern", outcome="error") == 5


def per_tool(samples: dict[str, Any], tool: str, outcome: str) -> float:
    return value(samples, "mcp_gateway_tool_calls_total", upstream="main", tool=tool,
                 outcome=outcome)


async def test_every_tool_call_counts_per_tool_inline_or_task_in_both_eras(url, http, client
                                                                        ) -> None:
    """Issue 44: mcp_gateway_tool_calls_total and its duration, per upstream and tool, for
    every tools/call: an inline one when answered, one answered with a task when the task
    ends (by its end, its duration the task's), never both; legacy and modern alike."""
    await modern(http, url, "tools/list", {}, TASKS)  # the catalogue, read by now
    await call(http, url, "echo", {"text": "hi"})  # modern, inline (mode never)
    await modern(http, url, "tools/call", {"name": "blob", "arguments": {
        "bytes": "not a number"}}, {})  # modern, inline, the server's error
    task = (await call(http, url, "sleep", {"ms": 400})).body["result"]  # modern, a task
    legacy = await session(client, url)
    assert "result" in (await legacy.call("echo", {"text": "hi"})).message  # legacy, inline
    core = (await as_task(legacy, "whoami"))["result"]["task"]  # legacy, a core task
    running = await scrape(http, url)
    assert per_tool(running, "echo", "ok") == 2 and per_tool(running, "blob", "error") == 1
    assert per_tool(running, "sleep", "ok") == 0  # counted when it ends, not when created
    await wait_for(http, url, task["taskId"], "completed")
    await core_wait_for(legacy, core["taskId"], "completed")
    after = await scrape(http, url)
    assert per_tool(after, "sleep", "ok") == 1 and per_tool(after, "whoami", "ok") == 1
    assert value(after, "mcp_gateway_tool_call_duration_seconds_count", upstream="main",
                 tool="sleep") == 1
    assert value(after, "mcp_gateway_tool_call_duration_seconds_sum", upstream="main",
                 tool="sleep") >= 0.15  # the task's run: 400 ms less the 200 ms sync budget
    assert value(after, "mcp_gateway_tool_call_duration_seconds_count", upstream="main",
                 tool="echo") == 2


async def test_ten_thousand_made_up_tool_names_leave_the_tool_labels_alone(url, http) -> None:
    """A client that calls 10,000 tools no upstream listed adds no label value: each is
    counted under "other", and the listed tools keep their own."""
    await modern(http, url, "tools/list", {}, TASKS)
    await call(http, url, "echo", {"text": "hi"})
    sem = asyncio.Semaphore(32)

    async def made_up(n: int) -> None:
        async with sem:
            await call(http, url, f"nosuch-{n}", caps={})

    await asyncio.gather(*(made_up(n) for n in range(10_000)))
    samples = await scrape(http, url)
    tools = {dict(k[1]).get("tool") for k in samples if k[0].startswith("mcp_gateway_tool_")}
    assert tools == {"echo", "other"}, sorted(map(str, tools))[:10]
    assert per_tool(samples, "other", "ok") + per_tool(samples, "other", "error") == 10_000


async def test_metrics_and_status_are_for_operators_only(gateway, http) -> None:
    """Issue 29: they show every owner's work, so a client's token does not open them."""
    url = await gateway(auth={"bearer_tokens": [TOKEN], "admin_tokens": [ADMIN]})
    base = url.removesuffix("/mcp")
    for path in ("/metrics", "/status"):
        async with http.get(base + path) as resp:
            assert resp.status == 401 and resp.headers["WWW-Authenticate"] == "Bearer"
        async with http.get(base + path, headers={"Authorization": "Bearer nope"}) as resp:
            assert resp.status == 401
        async with http.get(base + path, headers={"Authorization": f"Bearer {TOKEN}"}) as resp:
            assert resp.status == 403
        async with http.get(base + path, headers={"Authorization": f"Bearer {ADMIN}"}) as resp:
            assert resp.status == 200
    async with http.get(base + "/healthz") as resp:
        assert resp.status == 200  # probes stay open
    samples = await scrape(http, url, {"Authorization": f"Bearer {ADMIN}"})
    # Auth refusals are counted by cause too: none sent, a wrong one, a client's, on each path.
    for cause in ("missing", "wrong", "operator"):
        assert value(samples, "mcp_gateway_rejections_total", reason="auth", cause=cause) == 2


async def test_audit_events_follow_a_task_and_never_show_tokens(gateway, http) -> None:
    url = await gateway(tasks=POLICY, auth={"bearer_tokens": [TOKEN, "other-token"]})
    mine = {"Authorization": f"Bearer {TOKEN}"}
    with structlog.testing.capture_logs() as events:
        task = (await call(http, url, "ask", {"message": "Name?"},
                           {**TASKS, "elicitation": {}}, headers=mine)).body["result"]
        asked = await wait_for(http, url, task["taskId"], "input_required", mine)
        key = next(iter(asked["inputRequests"]))
        await tasks_op(http, url, "tasks/update", task["taskId"], mine,
                       inputResponses={key: {"action": "accept", "content": {"name": "x"}}})
        await wait_for(http, url, task["taskId"], "completed", mine)
        for _ in range(2):  # another owner guesses the id
            await tasks_op(http, url, "tasks/get", task["taskId"],
                           {"Authorization": "Bearer other-token"})
        async with http.post(url, json={}, headers={"Authorization": "Bearer wrong"}):
            pass
        await asyncio.sleep(0.1)
    audit = [e for e in events if e.get("audit")]
    names = [e["event"] for e in audit]
    for name in ("task.created", "task.input_required", "task.input_answered",
                 "task.completed", "task.lookup_failed", "auth.failed"):
        assert name in names, names
    # The owner is a digest of the Authorization header; logs show a hash of that digest.
    owner = owner_hash(owner_hash(f"Bearer {TOKEN}"))
    assert {e["owner"] for e in audit if e["event"].startswith("task.")
            and e["event"] != "task.lookup_failed"} == {owner}
    misses = [e for e in audit if e["event"] == "task.lookup_failed"]
    assert [e["failures"] for e in misses] == [1, 2]
    assert misses[0]["owner"] == owner_hash(owner_hash("Bearer other-token"))
    assert next(e for e in audit if e["event"] == "auth.failed")["reason"] == "wrong"
    assert not any(TOKEN in repr(e) or "other-token" in repr(e) or "wrong" in
                   repr({k: v for k, v in e.items() if k != "reason"}) for e in events)
