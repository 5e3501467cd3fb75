"""Curated tools (issue 53, docs/tools.md) against real servers other than our own stdio one
(that is tests/e2e/test_tool_curation.py): the published server-everything over stdio (as
npx runs it) and over its own Streamable HTTP, our test server over HTTP, and a modern-only
upstream; in both client eras. A hidden tool is absent from tools/list and server/discover
and a call to it is answered byte-for-byte as an unknown tool is (inline and as a core
task); a renamed tool is listed and called under its new name while the server runs its
own; titles, descriptions and annotations are shown as configured. Two static tokens with
scopes see different lists of one server and a call beyond a token's scopes is refused (403
insufficient_scope), as a core task too. A task made before a restart that hides its tool
stays readable by its owner alone, in a shared Redis store or a single gateway's snapshot."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from conftest import NODE_BIN, ROOT, free_port, node_env
from mcp_http import BASIC, McpHttp, Reply
from test_http_upstream import basic_http
from test_modern import call, modern
from test_modern_upstream import SERVER as MODERN_SERVER
from test_scoped_tokens import bearer
from test_tasks import TASKS, tasks_op
from test_tool_curation import as_unknown

NODE_DIR = Path(__file__).parents[1] / "node"
EVERYTHING_JS = NODE_DIR / "node_modules" / "@modelcontextprotocol" / "server-everything" / \
    "dist" / "index.js"
CORE = "2025-11-25"
# server-everything's tools as an operator might curate them: its environment dump hidden, a
# glob hiding another, `echo` renamed and re-described, one description rewritten alone.
CURATED = {
    "get-env": {"expose": False},
    "gzip-*": {"expose": False},
    "echo": {"name": "say", "title": "Say", "description": "Says the message back.",
             "annotations": {"readOnlyHint": False, "openWorldHint": True}},
    "get-sum": {"description": "Adds a and b."},
}
HIDDEN = ("get-env", "gzip-file-as-resource", "echo")  # the last: a renamed tool's old name
SAY = {"name": "say", "title": "Say", "description": "Says the message back.",
       # The server's own annotations of echo, with the two configured over them.
       "annotations": {"readOnlyHint": False, "destructiveHint": False,
                       "idempotentHint": True, "openWorldHint": True}}
ALICE = "alice-token-0123456789abcdef0123456789"
BOB = "bob-token-0123456789abcdef0123456789ab"
TOKENS = [{"token": ALICE, "scopes": ["read"], "name": "alice"},
          {"token": BOB, "scopes": ["read", "write"], "name": "bob"}]
# A read-only team, as docs/tools.md writes it: the environment dump and every tool not
# named read need `write`.
SCOPED = {"get-env": {"scopes": ["write"]}, "get-*": {"scopes": ["read"]},
          "echo": {"scopes": ["read"]}, "*": {"scopes": ["write"]}}


# -- gateways shared by a module's tests: processes, as operators run them -------------------
class Process:
    """A gateway process with `conf` (and a listen address of its own) until stopped."""

    def __init__(self, conf: dict[str, Any], env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        fd, self.config = tempfile.mkstemp(suffix=".yaml")
        with os.fdopen(fd, "w") as f:
            json.dump({**conf, "logging": {"level": "warning"},
                       "listen": {"host": "127.0.0.1", "port": self.port}}, f)  # JSON is YAML
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "--config", self.config], cwd=ROOT,
            env={**(env or node_env()), "PYTHONPATH": str(ROOT)},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        ready(f"http://127.0.0.1:{self.port}/readyz", self.proc)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        os.unlink(self.config)


def ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    """Wait for `url` to answer 200 (the gateway's upstream is ready)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the gateway exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass  # not listening, or not ready yet (503)
        time.sleep(0.1)
    raise AssertionError(f"{url} never became ready")


def stdio_everything(**conf: Any) -> dict[str, Any]:
    """A gateway's settings for server-everything run by npx (the copy scripts/test.sh put
    in tests/node), as a user configures it."""
    upstream = {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-everything"],
                "cwd": str(NODE_DIR), "env": {"PATH": node_env()["PATH"]}}
    return {"upstreams": {"main": upstream}, **conf}


@pytest.fixture(scope="module")
def curated() -> Iterator[str]:
    """A gateway in front of server-everything over stdio, with CURATED."""
    gateway = Process(stdio_everything(tasks={"tools": CURATED}))
    yield gateway.url
    gateway.stop()


@pytest.fixture(scope="module")
def curated_http() -> Iterator[str]:
    """A gateway in front of server-everything over its own Streamable HTTP, with CURATED."""
    port = free_port()
    server = subprocess.Popen([str(NODE_BIN / "node"), str(EVERYTHING_JS), "streamableHttp"],
                              env={**node_env(), "PORT": str(port)},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            try:
                socket.create_connection(("127.0.0.1", port), 0.1).close()
                break
            except OSError:
                time.sleep(0.05)
        gateway = Process({"upstreams": {"main": {"url": f"http://127.0.0.1:{port}/mcp"}},
                           "tasks": {"tools": CURATED}})
        yield gateway.url
        gateway.stop()
    finally:
        server.kill()
        server.wait(10)


@pytest.fixture(scope="module")
def scoped() -> Iterator[str]:
    """A gateway in front of server-everything with Alice's and Bob's static tokens."""
    gateway = Process(stdio_everything(auth={"bearer_tokens": TOKENS},
                                       tasks={"tools": SCOPED}))
    yield gateway.url
    gateway.stop()


# -- the two eras' requests --------------------------------------------------------------------
async def legacy(http: aiohttp.ClientSession, url: str, token: str | None = None) -> McpHttp:
    """A 2025-11-25 session (core tasks), with `token`'s Authorization when given."""
    client = McpHttp(http, url)
    await client.initialize({"tasks": {}}, version=CORE,
                            headers=bearer(token) if token else None)
    return client


def auth(token: str | None) -> dict[str, str]:
    return bearer(token) if token else {}


async def legacy_tools(client: McpHttp, token: str | None = None) -> list[dict[str, Any]]:
    reply = await client.send({"jsonrpc": "2.0", "id": next(client.ids), "method": "tools/list"},
                              **auth(token))
    return list(reply.message["result"]["tools"])


async def legacy_call(client: McpHttp, name: str, arguments: dict[str, Any] | None = None,
                      token: str | None = None, **params: Any) -> Reply:
    return await client.send({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
        "name": name, "arguments": arguments or {}, **params}}, **auth(token))


async def modern_tools(http: aiohttp.ClientSession, url: str, token: str | None = None
                       ) -> list[dict[str, Any]]:
    reply = await modern(http, url, "tools/list", {}, headers=auth(token))
    assert reply.status == 200, reply.body
    return list(reply.body["result"]["tools"])


def names(tools: list[dict[str, Any]]) -> set[str]:
    return {t["name"] for t in tools}


def shown(tools: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """How the tool `name` is listed, but its schemas and execution."""
    tool = next(t for t in tools if t["name"] == name)
    return {k: v for k, v in tool.items() if k in ("name", "title", "description",
                                                    "annotations")}


async def core_task_answer(client: McpHttp, name: str, arguments: dict[str, Any] | None = None,
                           token: str | None = None) -> Any:
    """A core task of `name` made and its tasks/result read: the answer, but the id and the
    related-task _meta (which names the task's own id)."""
    made = await legacy_call(client, name, arguments, token, task={})
    task_id = made.message["result"]["task"]["taskId"]
    ended = await client.send({"jsonrpc": "2.0", "id": 9, "method": "tasks/result",
                               "params": {"taskId": task_id}}, **auth(token))
    answer = dict(ended.message)
    answer["result"] = {k: v for k, v in answer["result"].items() if k != "_meta"}
    return answer


# -- 1. server-everything over stdio, both eras --------------------------------------------
@pytest.mark.node
async def test_hidden_tools_are_in_no_list_of_either_era(curated, http) -> None:
    client = McpHttp(http, curated)
    init = (await client.initialize({"tasks": {}}, version=CORE)).body["result"]
    modern_list, legacy_list = await modern_tools(http, curated), await legacy_tools(client)
    for listed in (modern_list, legacy_list):
        assert not names(listed) & set(HIDDEN)
        assert {"say", "get-sum", "get-tiny-image", "trigger-long-running-operation"} <= \
            names(listed)
    # server/discover lists no tools. The server's instructions are its own text and pass
    # through as written, naming a hidden tool as they please (docs/tools.md says so).
    discovered = (await modern(http, curated, "server/discover")).body["result"]
    assert discovered["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == \
        "mcp-servers/everything"
    assert "tools" not in discovered and "get-env" not in json.dumps(discovered)
    for instructions in (discovered["instructions"], init["instructions"]):
        assert "`gzip-file-as-resource` creates session-scoped" in instructions


@pytest.mark.node
async def test_a_hidden_tool_is_answered_as_an_unknown_one_modern(curated, http) -> None:
    unknown = await call(http, curated, "made_up")
    assert "Tool made_up not found" in json.dumps(unknown.body)  # server-everything's words
    for hidden in HIDDEN:
        answered = await call(http, curated, hidden)
        assert answered.status == unknown.status
        assert as_unknown(answered.body, hidden) == as_unknown(unknown.body, "made_up")


@pytest.mark.node
async def test_a_hidden_tool_is_answered_as_an_unknown_one_legacy(curated, http) -> None:
    client = await legacy(http, curated)
    unknown = await legacy_call(client, "made_up")
    assert "Tool made_up not found" in json.dumps(unknown.message)
    for hidden in HIDDEN:
        answered = await legacy_call(client, hidden)
        assert answered.status == unknown.status
        assert as_unknown(answered.message, hidden) == as_unknown(unknown.message, "made_up")


@pytest.mark.node
async def test_a_renamed_tool_is_shown_and_called_by_its_new_name(curated, http) -> None:
    modern_list = await modern_tools(http, curated)
    client = await legacy(http, curated)
    legacy_list = await legacy_tools(client)
    for listed in (modern_list, legacy_list):
        assert shown(listed, "say") == SAY
        # A description rewritten alone: the server's title and annotations stay.
        assert shown(listed, "get-sum") == {
            "name": "get-sum", "title": "Get Sum Tool", "description": "Adds a and b.",
            "annotations": {"readOnlyHint": True, "destructiveHint": False,
                            "idempotentHint": True, "openWorldHint": False}}
    # server-everything's echo ran: its "Echo: " prefix proves it, under either era.
    said = await call(http, curated, "say", {"message": "hi"})
    assert said.body["result"]["content"] == [{"type": "text", "text": "Echo: hi"}]
    said = await legacy_call(client, "say", {"message": "again"})
    assert said.message["result"]["content"] == [{"type": "text", "text": "Echo: again"}]


@pytest.mark.node
async def test_core_tasks_of_a_hidden_and_a_renamed_tool(curated, http) -> None:
    client = await legacy(http, curated)
    unknown = await core_task_answer(client, "made_up")
    for hidden in HIDDEN:
        answered = await core_task_answer(client, hidden)
        assert as_unknown(answered, hidden) == as_unknown(unknown, "made_up")
    said = await core_task_answer(client, "say", {"message": "as a task"})
    assert said["result"]["content"] == [{"type": "text", "text": "Echo: as a task"}]


# -- 2. HTTP upstreams: server-everything's Streamable HTTP, ours, a modern-only one -----------
@pytest.mark.node
async def test_an_http_upstream_is_curated_alike(curated_http, http) -> None:
    client = await legacy(http, curated_http)
    for listed in (await modern_tools(http, curated_http), await legacy_tools(client)):
        assert not names(listed) & set(HIDDEN) and shown(listed, "say") == SAY
    unknown_modern = await call(http, curated_http, "made_up")
    unknown_legacy = await legacy_call(client, "made_up")
    for hidden in HIDDEN:
        answered = await call(http, curated_http, hidden)
        assert as_unknown(answered.body, hidden) == as_unknown(unknown_modern.body, "made_up")
        answered = await legacy_call(client, hidden)
        assert as_unknown(answered.message, hidden) == as_unknown(unknown_legacy.message,
                                                                  "made_up")
    said = await call(http, curated_http, "say", {"message": "over http"})
    assert said.body["result"]["content"][0]["text"] == "Echo: over http"
    said = await legacy_call(client, "say", {"message": "legacy"})
    assert said.message["result"]["content"][0]["text"] == "Echo: legacy"


OURS = {"crash": {"expose": False}, "echo": {"name": "say", "description": "Says it."}}


@pytest.mark.parametrize("upstream", ["ours over http", "modern-only over stdio"])
async def test_our_http_and_a_modern_only_upstream_are_curated(gateway, http,
                                                               upstream) -> None:
    if upstream == "ours over http":
        async with basic_http() as base:
            await curated_both_eras(http, await gateway(url=base + "/mcp",
                                                        tasks={"tools": OURS}), "crash")
        return
    await curated_both_eras(http, await gateway(MODERN_SERVER, tasks={"tools": {
        "greet": {"expose": False}, "echo": {"name": "say", "description": "Says it."}}}),
        "greet")


async def curated_both_eras(http: aiohttp.ClientSession, url: str, hidden: str) -> None:
    """`hidden` is unlisted and answered as unknown, echo is `say`, in both eras."""
    client = await legacy(http, url)
    for listed in (await modern_tools(http, url), await legacy_tools(client)):
        assert not names(listed) & {hidden, "echo"}
        assert shown(listed, "say")["description"] == "Says it."
    unknown_modern, unknown_legacy = (await call(http, url, "made_up"),
                                      await legacy_call(client, "made_up"))
    for name in (hidden, "echo"):
        answered = await call(http, url, name)
        assert answered.status == unknown_modern.status
        assert as_unknown(answered.body, name) == as_unknown(unknown_modern.body, "made_up")
        answered = await legacy_call(client, name)
        assert as_unknown(answered.message, name) == as_unknown(unknown_legacy.message,
                                                                "made_up")
    said = await call(http, url, "say", {"text": "mine"})
    assert said.body["result"]["content"][0]["text"] == "mine"  # the server's echo ran
    said = await legacy_call(client, "say", {"text": "legacy"})
    assert said.message["result"]["content"][0]["text"] == "legacy"


# -- 3. Alice's and Bob's static tokens on one server-everything ---------------------------
@pytest.mark.node
async def test_two_static_tokens_see_their_own_lists(scoped, http) -> None:
    alice, bob = await modern_tools(http, scoped, ALICE), await modern_tools(http, scoped, BOB)
    read_only = names(alice)
    assert {"echo", "get-sum", "get-tiny-image"} <= read_only
    assert not read_only & {"get-env", "trigger-long-running-operation",
                            "toggle-simulated-logging", "gzip-file-as-resource"}
    assert read_only < names(bob) and {"get-env", "trigger-long-running-operation"} <= names(bob)
    client = await legacy(http, scoped, ALICE)
    assert names(await legacy_tools(client, ALICE)) == read_only
    bobs = await legacy(http, scoped, BOB)
    assert names(await legacy_tools(bobs, BOB)) == names(bob)


@pytest.mark.node
async def test_a_write_tool_is_refused_to_the_read_token(scoped, http) -> None:
    refused = await call(http, scoped, "get-env", headers=bearer(ALICE))
    assert refused.status == 403, refused.body
    assert refused.headers["WWW-Authenticate"] == 'Bearer error="insufficient_scope", scope="write"'
    assert refused.body["error"]["data"] == {"requiredScopes": ["write"]}
    client = await legacy(http, scoped, ALICE)
    for params in ({}, {"task": {}}):  # a plain call, a core task
        refused = await legacy_call(client, "trigger-long-running-operation", {
            "duration": 0, "steps": 1}, ALICE, **params)
        assert refused.status == 403, refused.body
        assert 'error="insufficient_scope"' in refused.headers["WWW-Authenticate"]
    # Bob has the scope: the server runs it for him, inline and as a core task.
    env = await call(http, scoped, "get-env", headers=bearer(BOB))
    assert '"PATH"' in env.body["result"]["content"][0]["text"]
    bobs = await legacy(http, scoped, BOB)
    ran = await core_task_answer(bobs, "trigger-long-running-operation",
                                 {"duration": 0.1, "steps": 1}, BOB)
    assert "Long running operation completed" in ran["result"]["content"][0]["text"]
    # Alice's own tools still answer her.
    said = await call(http, scoped, "echo", {"message": "mine"}, headers=bearer(ALICE))
    assert said.body["result"]["content"][0]["text"] == "Echo: mine"


# -- 4. a task made before a restart that hides its tool -----------------------------------
RESTART_TOKENS = [{"token": ALICE, "scopes": ["read"], "name": "alice"},
                  {"token": BOB, "scopes": ["read"], "name": "bob"}]
SLEEPS = {"defaults": {"mode": "auto", "sync_budget_ms": 100, "ttl_ms": 60_000},
          "tools": {"sleep": {"mode": "always"}}}


class Restarts:
    """`await restarts(tasks)`: a gateway in front of basic.py with Alice's and Bob's tokens
    and the task policy `tasks`, once the one started before (if any) has stopped (SIGTERM);
    a replica of a shared Redis store, or one gateway keeping its store in a snapshot."""

    def __init__(self, store: str, group: Any, snapshot: Path) -> None:
        self.store, self.group, self.snapshot = store, group, snapshot
        self.running: Any = None

    async def __call__(self, tasks: dict[str, Any]) -> Any:
        if self.running is not None:
            self.running.stop()
        settings: dict[str, Any] = {"auth": {"bearer_tokens": RESTART_TOKENS}, "tasks": tasks}
        if self.store == "redis":
            self.running, = await self.group(1, **settings)
        else:
            self.running = Process({
                "upstreams": {"main": {"command": BASIC[0], "args": BASIC[1:]}},
                "store": {"snapshot_path": str(self.snapshot)}, **settings}, dict(os.environ))
        return self.running


@pytest.fixture(params=["redis", "snapshot"])
async def restarts(request, group, tmp_path) -> AsyncIterator[Restarts]:
    made = Restarts(request.param, group, tmp_path / "tasks.snapshot")
    yield made
    if made.store == "snapshot" and made.running is not None:
        made.running.stop()  # the group fixture stops its replicas itself


async def test_a_task_outlives_a_restart_that_hides_its_tool(restarts, http) -> None:
    """Alice's tasks of `sleep` (one of each era), still running when the gateway is told to
    stop (SIGTERM: they finish in its drain); it starts again with `sleep` not exposed; her
    tasks still answer her with their results, and Bob gets what an unknown id gets."""
    before = await restarts(SLEEPS)
    made = await call(http, before.url, "sleep", {"ms": 700}, TASKS, bearer(ALICE))
    assert made.body["result"]["resultType"] == "task", made.body
    modern_id = made.body["result"]["taskId"]
    session = await legacy(http, before.url, ALICE)
    core = await legacy_call(session, "sleep", {"ms": 700}, ALICE, task={})
    core_id = core.message["result"]["task"]["taskId"]
    assert (await tasks_op(http, before.url, "tasks/get", modern_id, bearer(ALICE))
            ).body["result"]["status"] == "working"
    hidden = {**SLEEPS, "tools": {"sleep": {"mode": "always", "expose": False}}}
    after = await restarts(hidden)
    assert "sleep" not in names(await modern_tools(http, after.url, ALICE))
    got = await tasks_op(http, after.url, "tasks/get", modern_id, bearer(ALICE))
    assert got.body["result"]["status"] == "completed", got.body
    assert got.body["result"]["result"]["content"][0]["text"] == "slept 700"

    # A new legacy session reads her core task; with replicas, her session itself goes on
    # (the store keeps sessions; a single gateway's snapshot keeps tasks alone).
    sessions = [await legacy(http, after.url, ALICE)]
    if restarts.store == "redis":
        sessions.append(McpHttp(http, after.url))
        sessions[-1].session_id, sessions[-1].version = session.session_id, CORE
    for client in sessions:
        status = await client.send({"jsonrpc": "2.0", "id": 3, "method": "tasks/get",
                                    "params": {"taskId": core_id}}, **bearer(ALICE))
        assert status.message["result"]["status"] == "completed", status.message
        result = await client.send({"jsonrpc": "2.0", "id": 4, "method": "tasks/result",
                                    "params": {"taskId": core_id}}, **bearer(ALICE))
        assert result.message["result"]["content"][0]["text"] == "slept 700"

    # Bob, as for an id nobody made, in both eras.
    for task_id in (modern_id, core_id):
        theirs = await tasks_op(http, after.url, "tasks/get", task_id, bearer(BOB))
        nobodys = await tasks_op(http, after.url, "tasks/get", "no-such-task", bearer(BOB))
        assert theirs.status == nobodys.status
        assert as_unknown(theirs.body, task_id) == as_unknown(nobodys.body, "no-such-task")
    bobs = await legacy(http, after.url, BOB)
    for method in ("tasks/get", "tasks/result"):
        answers = [(await bobs.send({"jsonrpc": "2.0", "id": 5, "method": method,
                                     "params": {"taskId": task_id}}, **bearer(BOB)))
                   for task_id in (core_id, "no-such-task")]
        assert answers[0].status == answers[1].status
        assert as_unknown(answers[0].message, core_id) == as_unknown(answers[1].message,
                                                                     "no-such-task")
