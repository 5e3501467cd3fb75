"""Issue 50: a tools/call retried with its `Idempotency-Key` runs once, per principal.

Alice and Bob share one stdio server (tests/servers/basic.py) whose journal says what
reached it. Concurrent keyed calls join the one run; a retry after its end gets the same
answer at once; a retry whose first request was dropped joins the call still running; a
key reused for another call is refused and never sent; a bad key is a 400; Bob under
Alice's key runs his own call, and her task ids are unknown to him; a key outlives its
task's ttl as nothing (a new run); a keyed flood stays within its principal's task bounds.
Both eras; the cross-replica case is in test_replicas.py's neighbour below (Redis)."""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from conftest import NODE_BIN, ROOT, node_env, settings_for
from mcp import Client
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_http import McpHttp, Reply, next_event, text_of
from test_modern import modern

TOKENS = {"alice": "alice-token-idempotency", "bob": "bob-token-idempotency"}
TASKS = {"extensions": {"io.modelcontextprotocol/tasks": {}}}
ELICITS = {"elicitation": {}}
CORE = {"tasks": {"requests": {"tools": {"call": {}}}}}
_ids = itertools.count(1000)


def auth(who: str, key: str | None = None) -> dict[str, str]:
    out = {"Authorization": f"Bearer {TOKENS[who]}"}
    if key is not None:
        out["Idempotency-Key"] = key
    return out


def conf(journal: Path, **tasks: Any) -> dict[str, Any]:
    base = settings_for()
    return {"upstream": {**base["upstreams"]["main"], "env": {"BASIC_JOURNAL": str(journal)}},
            "auth": {"bearer_tokens": list(TOKENS.values())},
            "tasks": {"defaults": {"mode": "auto"}, **tasks}}


def runs(journal: Path, tool: str) -> int:
    """How many calls of `tool` reached the server."""
    if not journal.exists():
        return 0
    return sum(line.startswith(f"call {tool}") for line in journal.read_text().splitlines())


async def ran(journal: Path, tool: str, times: int) -> None:
    """The server has had `times` calls of `tool`, no more (a task's call is sent after its
    handle is answered: waited for a moment)."""
    for _ in range(40):
        if runs(journal, tool) >= times:
            break
        await asyncio.sleep(0.05)
    assert runs(journal, tool) == times


@pytest.fixture
async def served(gateway, tmp_path) -> tuple[str, Path]:
    journal = tmp_path / "journal"
    return await gateway(**conf(journal)), journal


async def legacy(http: aiohttp.ClientSession, url: str, who: str,
                 caps: dict[str, Any] | None = None) -> McpHttp:
    session = McpHttp(http, url)
    await session.initialize(caps, "2025-11-25" if caps else "2025-06-18",
                             headers=auth(who))
    return session


def tools_call(name: str, args: dict[str, Any], **params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": next(_ids), "method": "tools/call",
            "params": {"name": name, "arguments": args, **params}}


async def keyed_modern(http: aiohttp.ClientSession, url: str, who: str, key: str,
                       name: str, args: dict[str, Any], caps: dict[str, Any] | None = None,
                       **params: Any) -> Reply:
    return await modern(http, url, "tools/call", {"name": name, "arguments": args, **params},
                        caps, headers=auth(who, key))


# -- legacy ---------------------------------------------------------------------------------
async def test_concurrent_keyed_calls_run_once_and_a_retry_after_gets_it_at_once(
        served, http) -> None:
    url, journal = served
    alice = await legacy(http, url, "alice")
    calls = [tools_call("sleep", {"ms": 800}) for _ in range(2)]
    first, second = await asyncio.gather(*(
        alice.send(call, **auth("alice", "deploy-1")) for call in calls))
    assert text_of(first) == text_of(second) == "slept 800"
    assert [first.message["id"], second.message["id"]] == [c["id"] for c in calls]
    assert runs(journal, "sleep") == 1
    loop = asyncio.get_running_loop()
    began = loop.time()
    third = await alice.send(tools_call("sleep", {"ms": 800}), **auth("alice", "deploy-1"))
    assert text_of(third) == "slept 800"
    assert loop.time() - began < 0.7  # answered from what the key kept, not run again
    assert runs(journal, "sleep") == 1
    # Bob's key of the same name is his own: his call runs.
    bob = await legacy(http, url, "bob")
    assert text_of(await bob.send(tools_call("sleep", {"ms": 1}),
                                  **auth("bob", "deploy-1"))) == "slept 1"
    assert runs(journal, "sleep") == 2
    # Unkeyed calls run each time, as before.
    for _ in range(2):
        assert text_of(await alice.send(tools_call("sleep", {"ms": 1}), **auth("alice"))) \
            == "slept 1"
    assert runs(journal, "sleep") == 4


async def test_a_dropped_keyed_call_is_joined_by_its_retry(served, http) -> None:
    """Streamable HTTP: a dropped connection is not a cancel. The client gives up on its
    first request; its retry with the key joins the call still running."""
    url, journal = served
    alice = await legacy(http, url, "alice")
    first = asyncio.ensure_future(alice.send(tools_call("sleep", {"ms": 1200}),
                                             **auth("alice", "migrate-7")))
    await asyncio.sleep(0.4)
    first.cancel()  # the connection closes
    retry = await alice.send(tools_call("sleep", {"ms": 1200}), **auth("alice", "migrate-7"))
    assert text_of(retry) == "slept 1200"
    assert runs(journal, "sleep") == 1


async def test_a_key_reused_for_another_call_is_refused_and_never_sent(served, http) -> None:
    url, journal = served
    alice = await legacy(http, url, "alice")
    assert text_of(await alice.send(tools_call("echo", {"text": "one"}),
                                    **auth("alice", "k-1"))) == "one"
    for other in (tools_call("echo", {"text": "two"}), tools_call("sleep", {"ms": 1})):
        refused = await alice.send(other, **auth("alice", "k-1"))
        assert refused.status == 200  # a legacy session's refusals are JSON-RPC errors
        error = refused.body["error"]
        assert error["code"] == -32602 and error["data"] == {"idempotencyKey": "k-1"}
        assert "k-1" in error["message"]
    assert runs(journal, "echo") == 1 and runs(journal, "sleep") == 0
    # Bob may use Alice's key for anything: it is not his.
    bob = await legacy(http, url, "bob")
    assert text_of(await bob.send(tools_call("echo", {"text": "two"}),
                                  **auth("bob", "k-1"))) == "two"


@pytest.mark.parametrize("key", ["x" * 256, "", "caf\u00e9", "a b", "tab\there"])
async def test_a_bad_key_is_a_clear_400(served, http, key) -> None:
    url, journal = served
    alice = await legacy(http, url, "alice")
    headers = alice.headers(**auth("alice"))
    async with http.post(url, json=tools_call("echo", {"text": "x"}),
                         headers={**headers, "Idempotency-Key": key}) as resp:
        body = await resp.json()
    assert resp.status == 400
    assert "Idempotency-Key" in body["error"]["message"]
    reply = await modern(http, url, "tools/call", {"name": "echo", "arguments": {"text": "x"}},
                         headers={**auth("alice"), "Idempotency-Key": key})
    assert reply.status == 400 and "Idempotency-Key" in reply.body["error"]["message"]
    assert runs(journal, "echo") == 0


async def test_two_key_headers_are_a_400_and_a_quoted_key_is_the_bare_one(served, http
                                                                         ) -> None:
    url, journal = served
    alice = await legacy(http, url, "alice")
    twice = alice.headers(**auth("alice"))
    body = tools_call("echo", {"text": "x"})
    async with http.post(url, json=body, headers=[*twice.items(), ("Idempotency-Key", "a"),
                                                  ("Idempotency-Key", "b")]) as resp:
        assert resp.status == 400
    first = await alice.send(tools_call("echo", {"text": "q"}), **auth("alice", '"q-1"'))
    again = await alice.send(tools_call("echo", {"text": "q"}), **auth("alice", "q-1"))
    assert text_of(first) == text_of(again) == "q"
    assert runs(journal, "echo") == 1


async def test_a_core_task_with_a_key_is_one_task(served, http) -> None:
    url, journal = served
    alice = await legacy(http, url, "alice", CORE)
    ids = set()
    for _ in range(3):
        call = tools_call("sleep", {"ms": 300}, task={})
        reply = await alice.send(call, **auth("alice", "task-key"))
        assert reply.body["id"] == call["id"]
        ids.add(reply.body["result"]["task"]["taskId"])
    assert len(ids) == 1
    (task_id,) = ids
    result = await alice.send({"jsonrpc": "2.0", "id": next(_ids), "method": "tasks/result",
                               "params": {"taskId": task_id}}, **auth("alice"))
    assert text_of(result) == "slept 300"
    assert runs(journal, "sleep") == 1
    # Bob: his own task under the same key; Alice's id is unknown to him.
    bob = await legacy(http, url, "bob", CORE)
    his = await bob.send(tools_call("sleep", {"ms": 1}, task={}), **auth("bob", "task-key"))
    assert his.body["result"]["task"]["taskId"] != task_id
    for task_id_ in (task_id, "no-such-task"):
        probe = await bob.send({"jsonrpc": "2.0", "id": 5, "method": "tasks/get",
                                "params": {"taskId": task_id_}}, **auth("bob"))
        assert probe.body["error"]["code"] == -32602
    # The plain call under the same key names the same call: its answer, not a new run.
    plain = await alice.send(tools_call("sleep", {"ms": 300}), **auth("alice", "task-key"))
    assert text_of(plain) == "slept 300"
    await ran(journal, "sleep", 2)  # Alice's one and Bob's one


async def test_a_keyed_call_asking_for_input_asks_on_its_stream(served, http) -> None:
    url, journal = served
    alice = await legacy(http, url, "alice", {"elicitation": {}})
    body = tools_call("ask", {"message": "Name?"})
    headers = alice.headers(**auth("alice", "ask-1"))
    async with http.post(url, json=body, headers=headers) as stream:
        asked = await next_event(stream)
        assert asked["method"] == "elicitation/create"
        await alice.send({"jsonrpc": "2.0", "id": asked["id"],
                          "result": {"action": "accept", "content": {"name": "Ada"}}},
                         **auth("alice"))
        answer = await next_event(stream)
    assert "Ada" in answer["result"]["content"][0]["text"]
    again = await alice.send(body, **auth("alice", "ask-1"))
    assert again.message["result"]["content"] == answer["result"]["content"]
    assert runs(journal, "ask") == 1


async def test_a_key_past_its_tasks_ttl_is_forgotten(gateway, http, tmp_path) -> None:
    journal = tmp_path / "journal"
    url = await gateway(**conf(journal, tools={"echo": {"ttl_ms": 300, "max_ttl_ms": 300,
                                                        "timeout_ms": None}}))
    alice = await legacy(http, url, "alice")
    for _ in range(2):
        assert text_of(await alice.send(tools_call("echo", {"text": "t"}),
                                        **auth("alice", "ttl-key"))) == "t"
    assert runs(journal, "echo") == 1
    # Past its ttl, before the store's sweep of that whole second: a new run, never the
    # lapsed task's "expired" (a client might take that for the call's failure).
    await asyncio.sleep(0.45)
    assert text_of(await alice.send(tools_call("echo", {"text": "t"}),
                                    **auth("alice", "ttl-key"))) == "t"
    assert runs(journal, "echo") == 2
    await asyncio.sleep(1.2)  # and once swept
    assert text_of(await alice.send(tools_call("echo", {"text": "t"}),
                                    **auth("alice", "ttl-key"))) == "t"
    assert runs(journal, "echo") == 3


async def test_a_keyed_flood_stays_in_its_principals_bounds(gateway, http, tmp_path) -> None:
    journal = tmp_path / "journal"
    conf_ = conf(journal)
    conf_["limits"] = {"max_tasks_per_owner": 3, "max_calls_per_owner": 10}
    url = await gateway(**conf_)
    alice = await legacy(http, url, "alice")
    flood = [asyncio.ensure_future(alice.send(tools_call("sleep", {"ms": 800}),
                                              **auth("alice", f"flood-{i}")))
             for i in range(3)]
    await asyncio.sleep(0.3)
    refused = await alice.send(tools_call("sleep", {"ms": 1}), **auth("alice", "flood-3"))
    assert "maximum of 3 tasks" in refused.body["error"]["message"]
    bob = await legacy(http, url, "bob")  # Bob's share is his own
    assert text_of(await bob.send(tools_call("echo", {"text": "b"}),
                                  **auth("bob", "flood-3"))) == "b"
    assert [text_of(r) for r in await asyncio.gather(*flood)] == ["slept 800"] * 3
    assert runs(journal, "sleep") == 3


async def test_retries_that_wait_count_among_their_principals_calls(gateway, http,
                                                                   tmp_path) -> None:
    """A retry that joins a running keyed call waits as a call in flight: one too many is
    refused like any call over `max_calls_per_owner`, and Bob is served meanwhile."""
    journal = tmp_path / "journal"
    conf_ = conf(journal)
    conf_["limits"] = {"max_calls_per_owner": 2}
    url = await gateway(**conf_)
    first = asyncio.ensure_future(keyed_modern(http, url, "alice", "w-1", "sleep",
                                               {"ms": 1500}))
    await asyncio.sleep(0.3)
    joined = asyncio.ensure_future(keyed_modern(http, url, "alice", "w-1", "sleep",
                                                {"ms": 1500}))
    await asyncio.sleep(0.3)
    refused = await keyed_modern(http, url, "alice", "w-1", "sleep", {"ms": 1500})
    assert refused.status == 429 and "Too many calls in flight" in \
        refused.body["error"]["message"]
    assert text_of(await keyed_modern(http, url, "bob", "w-1", "echo", {"text": "b"})) == "b"
    assert [text_of(r) for r in await asyncio.gather(first, joined)] == ["slept 1500"] * 2
    assert runs(journal, "sleep") == 1


async def test_a_retry_that_joined_a_call_that_never_started_hears_why(gateway, http,
                                                                      tmp_path) -> None:
    """The first keyed call waits for a server process it never gets (its principal's
    share is taken); a retry that joined its task meanwhile is answered with the same
    refusal, not left waiting, and the key is free again."""
    journal = tmp_path / "journal"
    conf_ = conf(journal)
    conf_["upstream"] |= {"isolation": "call", "pool_size": 1}
    conf_["limits"] = {"max_processes_per_principal": 1, "process_wait_ms": 1000}
    url = await gateway(**conf_)
    holder = asyncio.ensure_future(modern(http, url, "tools/call", {
        "name": "sleep", "arguments": {"ms": 4000}}, headers=auth("alice")))
    await asyncio.sleep(0.5)
    first = asyncio.ensure_future(keyed_modern(http, url, "alice", "p-1", "echo",
                                               {"text": "e"}))
    await asyncio.sleep(0.2)
    joined = await asyncio.wait_for(keyed_modern(http, url, "alice", "p-1", "echo",
                                                 {"text": "e"}), 10)
    refused = await first
    assert "Too many server processes" in json.dumps(refused.body)
    assert joined.message["error"]["data"] == refused.body["error"]["data"]
    assert text_of(await holder) == "slept 4000"
    assert text_of(await keyed_modern(http, url, "alice", "p-1", "echo", {"text": "e"})) \
        == "e"  # the key was free: this one ran


# -- modern ---------------------------------------------------------------------------------
async def test_a_modern_keyed_task_twice_is_one_task(served, http) -> None:
    url, journal = served
    ids = set()
    for _ in range(2):
        reply = await keyed_modern(http, url, "alice", "m-1", "sleep", {"ms": 300}, TASKS)
        assert reply.body["result"]["resultType"] == "task"
        ids.add(reply.body["result"]["taskId"])
    assert len(ids) == 1
    (task_id,) = ids
    bob = await keyed_modern(http, url, "bob", "m-1", "sleep", {"ms": 1}, TASKS)
    assert bob.body["result"]["taskId"] != task_id
    probe = await modern(http, url, "tasks/get", {"taskId": task_id}, TASKS,
                         headers=auth("bob"))
    unknown = await modern(http, url, "tasks/get", {"taskId": "no-such"}, TASKS,
                           headers=auth("bob"))
    assert json.dumps(probe.body["error"]).replace(task_id, "?") == \
        json.dumps(unknown.body["error"]).replace("no-such", "?")  # as an unknown id
    for _ in range(40):
        got = await modern(http, url, "tasks/get", {"taskId": task_id}, TASKS,
                           headers=auth("alice"))
        if got.body["result"]["status"] == "completed":
            break
        await asyncio.sleep(0.1)
    assert got.body["result"]["result"]["content"][0]["text"] == "slept 300"
    await ran(journal, "sleep", 2)  # Alice's one and Bob's one


async def test_modern_keyed_inline_calls_join_and_replay(served, http) -> None:
    url, journal = served
    first, second = await asyncio.gather(*(
        keyed_modern(http, url, "alice", "inline-1", "sleep", {"ms": 600})
        for _ in range(2)))
    assert text_of(first) == text_of(second) == "slept 600"
    assert first.message["result"]["resultType"] == "complete"
    dropped = asyncio.ensure_future(
        keyed_modern(http, url, "alice", "inline-2", "sleep", {"ms": 1000}))
    await asyncio.sleep(0.3)
    dropped.cancel()  # closing the stream of a keyed call does not cancel its run
    retry = await keyed_modern(http, url, "alice", "inline-2", "sleep", {"ms": 1000})
    assert text_of(retry) == "slept 1000"
    assert runs(journal, "sleep") == 2
    reused = await keyed_modern(http, url, "alice", "inline-2", "sleep", {"ms": 5})
    assert reused.status == 422
    assert reused.body["error"]["data"] == {"idempotencyKey": "inline-2"}
    assert runs(journal, "sleep") == 2


async def test_a_key_used_in_one_era_names_another_call_in_the_other(served, http) -> None:
    """A task renders in the dialect it was made in: a legacy retry of a modern keyed
    call could not read it, so it is refused as another call, and nothing runs twice."""
    url, journal = served
    assert text_of(await keyed_modern(http, url, "alice", "era-1", "sleep", {"ms": 1})) \
        == "slept 1"
    alice = await legacy(http, url, "alice")
    refused = await alice.send(tools_call("sleep", {"ms": 1}), **auth("alice", "era-1"))
    assert refused.body["error"]["data"] == {"idempotencyKey": "era-1"}
    assert runs(journal, "sleep") == 1


async def test_a_modern_keyed_call_asks_for_input_by_mrtr(served, http) -> None:
    url, journal = served
    args = {"message": "Name?"}
    asked = await keyed_modern(http, url, "alice", "ask-m", "ask", args, ELICITS)
    result = asked.message["result"]
    assert result["resultType"] == "input_required" and "requestState" not in result
    (key, request), = result["inputRequests"].items()
    assert request["method"] == "elicitation/create"
    answered = await keyed_modern(http, url, "alice", "ask-m", "ask", args, ELICITS,
                                  inputResponses={
        key: {"action": "accept", "content": {"name": "Grace"}}})
    assert "Grace" in text_of(answered)
    # Bob's answers under Alice's key reach nothing of hers: his own call asks him.
    bobs = await keyed_modern(http, url, "bob", "ask-m", "ask", args, ELICITS, inputResponses={
        key: {"action": "accept", "content": {"name": "Mallory"}}})
    assert bobs.message["result"]["resultType"] == "input_required"
    assert runs(journal, "ask") == 2


async def test_a_key_on_another_method_is_not_used(served, http) -> None:
    """The header names calls: on tools/list it is neither kept nor checked."""
    url, _ = served
    reply = await modern(http, url, "tools/list", {}, headers={**auth("alice"),
                                                               "Idempotency-Key": "x" * 300})
    assert reply.status == 200 and reply.body["result"]["tools"]


def leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in leaves(inner)]
    return [error]


# -- the official Python SDK ----------------------------------------------------------------
@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_the_python_sdk_retries_a_timed_out_call_with_its_key(served, mode) -> None:
    """docs/clients.md's recipe: the key in the headers of the HTTP client the SDK's
    transport uses. The first attempt gives up after 0.3 s (the SDK then cancels its
    request); the retry, a new client with the same key, gets the one run's answer."""
    url, journal = served

    async def attempt(timeout_s: float | None) -> str:
        seen = ""
        try:
            async with create_mcp_http_client(headers=auth("alice", "sdk-retry")) as http, \
                    Client(streamable_http_client(url, http_client=http), mode=mode) as client:
                result = await client.call_tool("sleep", {"ms": 1500},
                                                read_timeout_seconds=timeout_s)
                seen = str(result.content[0].text)
        except* MCPError as gave_up:  # raised out of the client's task groups
            seen = " ".join(str(e) for e in leaves(gave_up))
        return seen

    assert "timed out" in await attempt(0.3)
    assert await attempt(None) == "slept 1500"
    assert runs(journal, "sleep") == 1


@pytest.mark.node
async def test_the_typescript_sdk_retries_a_timed_out_call_with_its_key(served) -> None:
    url, journal = served

    async def attempt(timeout_ms: int) -> dict[str, Any]:
        proc = await asyncio.create_subprocess_exec(
            str(NODE_BIN / "node"), str(ROOT / "tests" / "node" / "keyed_call.mjs"), url,
            TOKENS["alice"], "ts-retry", "sleep", json.dumps({"ms": 1500}), str(timeout_ms),
            env=node_env(), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err.decode()
        return dict(json.loads(out.splitlines()[-1]))

    assert "timed out" in (await attempt(300))["error"].lower()
    assert await attempt(10_000) == {"text": "slept 1500"}
    assert runs(journal, "sleep") == 1


# -- replicas sharing a store (Redis) -------------------------------------------------------
REPLICA_TOKENS = {"alice": "alice-token", "bob": "bob-token"}  # conftest's group


def replica_auth(who: str, key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {REPLICA_TOKENS[who]}", "Idempotency-Key": key}


async def replica_call(http: aiohttp.ClientSession, url: str, who: str, key: str,
                       args: dict[str, Any], caps: dict[str, Any] | None = None) -> Reply:
    return await modern(http, url, "tools/call", {"name": "sleep", "arguments": args}, caps,
                        headers=replica_auth(who, key))


def journaled(journal: Path) -> dict[str, Any]:
    return {"upstreams": {"main": {**settings_for()["upstreams"]["main"],
                                   "env": {"BASIC_JOURNAL": str(journal)}}}}


async def test_a_key_holds_across_replicas(group, http, tmp_path) -> None:
    journal = tmp_path / "journal"
    a, b = await group(2, **journaled(journal))
    made = await replica_call(http, a.url, "alice", "r-1", {"ms": 400}, TASKS)
    again = await replica_call(http, b.url, "alice", "r-1", {"ms": 400}, TASKS)
    assert again.body["result"]["taskId"] == made.body["result"]["taskId"]
    # Sent to both at once: one task, whichever replica's creation came first.
    both = await asyncio.gather(*(replica_call(http, r.url, "alice", "r-2", {"ms": 400},
                                               TASKS) for r in (a, b)))
    assert len({reply.body["result"]["taskId"] for reply in both}) == 1
    # An inline caller dropped on one replica, its retry answered by the other.
    dropped = asyncio.ensure_future(replica_call(http, a.url, "alice", "r-3", {"ms": 1500}))
    await asyncio.sleep(0.4)
    dropped.cancel()
    assert text_of(await replica_call(http, b.url, "alice", "r-3", {"ms": 1500})) == \
        "slept 1500"
    reused = await replica_call(http, b.url, "alice", "r-3", {"ms": 1})
    assert reused.status == 422
    bobs = await replica_call(http, b.url, "bob", "r-1", {"ms": 400}, TASKS)
    assert bobs.body["result"]["taskId"] != made.body["result"]["taskId"]
    await ran(journal, "sleep", 4)  # r-1, r-2, r-3 and Bob's r-1


async def test_a_retry_joined_on_another_replica_hears_why_the_call_never_started(
        group, http, tmp_path) -> None:
    """As on one gateway: the first keyed call, on replica a, waits for a server process it
    never gets (its principal's share there is taken); a retry on replica b that joined its
    task meanwhile is answered with the same refusal, not left waiting; the key is free
    again (the next retry runs, on b)."""
    journal = tmp_path / "journal"
    main = {**journaled(journal)["upstreams"]["main"], "isolation": "call", "pool_size": 1}
    a, b = await group(2, upstreams={"main": main}, limits={
        "max_processes_per_principal": 1, "process_wait_ms": 1500})
    holder = asyncio.ensure_future(modern(http, a.url, "tools/call", {
        "name": "sleep", "arguments": {"ms": 4000}}, headers={
            "Authorization": f"Bearer {REPLICA_TOKENS['alice']}"}))
    await asyncio.sleep(0.5)
    echo = {"name": "echo", "arguments": {"text": "e"}}
    first = asyncio.ensure_future(modern(http, a.url, "tools/call", echo,
                                         headers=replica_auth("alice", "x-1")))
    await asyncio.sleep(0.3)
    joined = await asyncio.wait_for(modern(http, b.url, "tools/call", echo,
                                           headers=replica_auth("alice", "x-1")), 10)
    refused = await first
    assert "Too many server processes" in json.dumps(refused.body)
    assert joined.message["error"]["data"] == refused.body["error"]["data"]
    assert text_of(await modern(http, b.url, "tools/call", echo,
                                headers=replica_auth("alice", "x-1"))) == "e"
    assert text_of(await holder) == "slept 4000"


async def test_a_key_survives_the_store_restarting_empty(group, http, tmp_path, key_prefix
                                                         ) -> None:
    """The replica running a keyed task writes it back into a store that lost everything,
    its key with it: the retry after the restart still names the one task, even where that
    replica's beats reach the restarted store late (paused, within its lease: a loaded
    machine), after the other replica has written back its own nothing."""
    from conftest import RedisServer
    own = RedisServer()
    own.start()
    try:
        journal = tmp_path / "journal"
        # A lease of 5 s: replica a's beats must reach the restarted store within it (a
        # replica that cannot is gone, by the lease's contract), paused 3 s and then
        # reconnecting on a loaded machine (one CI run: more than the tests' usual 1 s).
        a, b = await group(2, redis=own, store={
            "backend": "redis", "url": own.url, "key_prefix": key_prefix, "lease_ms": 5000},
            **journaled(journal))
        made = await replica_call(http, a.url, "alice", "kept", {"ms": 3000}, TASKS)
        task_id = made.body["result"]["taskId"]
        await asyncio.sleep(0.3)  # its call under way on replica a
        assert a.proc is not None
        a.proc.send_signal(signal.SIGSTOP)
        own.stop()
        own.start()
        late = asyncio.get_running_loop().call_later(3.0, a.proc.send_signal, signal.SIGCONT)
        # Retried at once on the other replica: told to retry while replica a writes its
        # task back (503, Retry-After), never a second run.
        for _ in range(200):
            again = await replica_call(http, b.url, "alice", "kept", {"ms": 3000}, TASKS)
            if again.status == 200:
                break
            assert again.status == 503 and again.headers.get("Retry-After"), again.body
            await asyncio.sleep(0.1)
        late.cancel()
        a.proc.send_signal(signal.SIGCONT)
        assert again.body["result"]["taskId"] == task_id
        await asyncio.sleep(0.5)
        assert runs(journal, "sleep") == 1
    finally:
        own.stop()
