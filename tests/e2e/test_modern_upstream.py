"""An upstream that speaks only the modern revision (tests/servers/modern_server.py, the
Python SDK `mcp` 2.x with initialize refused), over stdio and over HTTP: every client era,
its input_required rounds relayed or turned into server requests, and tasks over it."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from conftest import free_port, served
from mcp import Client
from mcp_http import next_event
from test_modern import envelope, headers_for, modern
from test_sdk_modern import on_elicit, text
from test_tasks import wait_for

SERVER = [sys.executable, str(Path(__file__).parents[1] / "servers" / "modern_server.py")]
TASKS = {"extensions": {"io.modelcontextprotocol/tasks": {}}, "elicitation": {}}


@pytest.fixture(params=["stdio", "http"])
async def url(request, gateway) -> AsyncIterator[str]:
    policy = {"tools": {"slow": {"mode": "always"}, "echo": {"mode": "never"}}}
    if request.param == "stdio":
        yield await gateway(SERVER, tasks=policy)
        return
    port = free_port()
    async with served([*SERVER, "http", str(port)], port) as base:
        yield await gateway(url=base + "/mcp", tasks=policy)


async def test_it_is_driven_as_a_modern_server(url, http) -> None:
    async with http.get(url.replace("/mcp", "/readyz?detail")) as resp:
        assert (await resp.json())["upstreams"]["main"]["era"] == "modern"
    async with Client(url, elicitation_callback=on_elicit) as client:
        assert client.protocol_version == "2026-07-28"
        assert client.server_info.name == "modern-only-test-server"
        assert {"echo", "greet", "slow"} <= {t.name for t in (await client.list_tools()).tools}
        assert text(await client.call_tool("echo", {"text": "hi"})) == "hi"
        # Its input_required round reaches the modern client as it is: the SDK answers it.
        assert text(await client.call_tool("greet", {})) == \
            "Hello, Ada (Your name?) (state asked-once)"


async def test_legacy_clients_get_server_requests(url, client, http) -> None:
    legacy = client(url)
    init = (await legacy.initialize({"elicitation": {}})).body["result"]
    assert init["serverInfo"]["name"] == "modern-only-test-server"
    assert init["protocolVersion"] == "2025-06-18"
    echo = (await legacy.call("echo", {"text": "plain"})).message["result"]
    assert echo["content"][0]["text"] == "plain" and "resultType" not in echo
    body = {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
            "params": {"name": "greet", "arguments": {}}}
    async with http.post(legacy.url, json=body, headers=legacy.headers()) as stream:
        asked = await next_event(stream)
        assert (asked["method"], asked["params"]["message"]) == ("elicitation/create",
                                                                 "Your name?")
        await legacy.send({"jsonrpc": "2.0", "id": asked["id"],
                           "result": {"action": "accept", "content": {"name": "Grace"}}})
        final = await next_event(stream)
    assert final["result"]["content"][0]["text"] == "Hello, Grace (state asked-once)"
    # A client without the capability gets a clear error, not a hang.
    bare = client(url)
    await bare.initialize({})
    refused = (await bare.call("greet")).message["error"]
    assert "elicitation/create" in refused["message"]


async def test_tasks_over_a_modern_upstream(url, http, client) -> None:
    task = (await modern(http, url, "tools/call", {"name": "slow", "arguments": {"ms": 100}},
                         TASKS)).body["result"]
    assert task["resultType"] == "task"
    done = await wait_for(http, url, task["taskId"], "completed")
    assert done["result"]["content"][0]["text"] == "slept 100"
    legacy = client(url)
    await legacy.initialize({"elicitation": {}}, version="2025-11-25")
    created = await legacy.send({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
        "name": "greet", "arguments": {}, "task": {}}})
    task_id = created.message["result"]["task"]["taskId"]
    body = {"jsonrpc": "2.0", "id": 4, "method": "tasks/result", "params": {"taskId": task_id}}
    async with http.post(legacy.url, json=body, headers=legacy.headers()) as stream:
        asked = await next_event(stream)
        assert asked["params"]["_meta"]["io.modelcontextprotocol/related-task"] == {
            "taskId": task_id}
        await legacy.send({"jsonrpc": "2.0", "id": asked["id"],
                           "result": {"action": "accept", "content": {"name": "Lin"}}})
        final = await next_event(stream)
    assert final["result"]["content"][0]["text"] == "Hello, Lin (state asked-once)"


async def test_modern_task_input_keys_are_the_servers(gateway, http) -> None:
    url = await gateway(SERVER, tasks={"tools": {"greet": {"mode": "always"}}})
    task = (await modern(http, url, "tools/call", {"name": "greet", "arguments": {}},
                         TASKS)).body["result"]
    waiting = await wait_for(http, url, task["taskId"], "input_required")
    assert list(waiting["inputRequests"]) == ["name"]  # the server's own key
    await modern(http, url, "tasks/update", {"taskId": task["taskId"], "inputResponses": {
        "name": {"action": "accept", "content": {"name": "Kay"}}}}, TASKS)
    done = await wait_for(http, url, task["taskId"], "completed")
    assert done["result"]["content"][0]["text"] == "Hello, Kay (state asked-once)"


async def test_the_servers_own_tasks_pass_through_in_mode_never(gateway, http) -> None:
    url = await gateway(SERVER, tasks={"tools": {"queued": {"mode": "never"}}})
    task = (await modern(http, url, "tools/call", {"name": "queued", "arguments": {}},
                         TASKS)).body["result"]
    assert (task["resultType"], task["taskId"]) == ("task", "server-task-1")
    got = (await modern(http, url, "tasks/get", {"taskId": "server-task-1"}, TASKS)).body
    assert got["result"]["status"] == "completed"  # answered by the server, not the gateway
    assert got["result"]["result"]["content"][0]["text"] == "done by the server's own task"


async def test_change_notifications_reach_legacy_sessions(url, client, http) -> None:
    """The gateway listens on the server (subscriptions/listen) for what its clients want."""
    watcher, other = client(url), client(url)
    await watcher.initialize()
    await other.initialize()
    sub = {"jsonrpc": "2.0", "id": 1, "method": "resources/subscribe",
           "params": {"uri": "test://watched"}}
    assert (await watcher.send(sub)).message["result"] == {}  # answered by the gateway
    async with http.get(watcher.url, headers=watcher.headers(Accept="text/event-stream")) as \
            stream, http.get(other.url, headers=other.headers(Accept="text/event-stream")) as \
            bystander:
        await asyncio.sleep(0.3)  # the listen stream upstream is opened again with the URI
        await watcher.call("change")
        changed = await next_event(stream)  # without the gateway's own listen tag
        assert changed["method"] == "notifications/tools/list_changed"
        assert "_meta" not in changed.get("params", {})
        assert (await next_event(bystander))["method"] == "notifications/tools/list_changed"
        await other.call("touch", {"uri": "test://watched"})
        updated = await next_event(stream)
        assert updated["method"] == "notifications/resources/updated"
        assert updated["params"]["uri"] == "test://watched"
        with pytest.raises(TimeoutError):  # not subscribed: not told
            await next_event(bystander, 0.5)


async def test_modern_listen_streams_over_a_modern_upstream(url, http) -> None:
    params = {"notifications": {"toolsListChanged": True,
                                "resourceSubscriptions": ["test://watched"]},
              "_meta": envelope()}
    body = {"jsonrpc": "2.0", "id": "sub-9", "method": "subscriptions/listen", "params": params}
    async with http.post(url, json=body, headers=headers_for("subscriptions/listen", params)
                         ) as stream:
        ack = await next_event(stream)
        assert ack["method"] == "notifications/subscriptions/acknowledged"
        await asyncio.sleep(0.3)  # the gateway's own listen upstream now includes the URI
        await modern(http, url, "tools/call", {"name": "touch",
                                               "arguments": {"uri": "test://watched"}})
        updated = await next_event(stream)
    assert updated["method"] == "notifications/resources/updated"
    assert updated["params"]["_meta"] == {"io.modelcontextprotocol/subscriptionId": "sub-9"}


async def test_log_levels_reach_a_modern_upstream_per_request(url, client, http) -> None:
    legacy = client(url)
    await legacy.initialize()
    quiet = await legacy.call("log", {"text": "unheard"})
    assert not [e for e in quiet.events if e.get("method") == "notifications/message"]
    level = await legacy.send({"jsonrpc": "2.0", "id": 5, "method": "logging/setLevel",
                               "params": {"level": "info"}})
    assert level.message["result"] == {}  # kept by the gateway, sent with each request
    bad = await legacy.send({"jsonrpc": "2.0", "id": 6, "method": "logging/setLevel",
                             "params": {"level": "loud"}})
    assert bad.status == 200 and bad.message["error"]["code"] == -32602
    loud = await legacy.call("log", {"text": "heard"})
    logs = [e for e in loud.events if e.get("method") == "notifications/message"]
    assert logs and logs[0]["params"]["data"] == "heard"
    modern_loud = await modern(http, url, "tools/call", {"name": "log",
                                                         "arguments": {"text": "modern"}},
                               meta={"io.modelcontextprotocol/logLevel": "debug"})
    assert [e["params"]["data"] for e in modern_loud.events
            if e.get("method") == "notifications/message"] == ["modern"]
