"""A deploy loses no work (issue 48): on SIGTERM the gateway drains. /readyz turns 503 at
once while /healthz stays 200, a new tools/call is refused as stopping and never reaches the
server, calls already running (inline and as tasks, both eras) finish and are answered,
tasks/* are still served to their owner alone, and the process exits as soon as its last
call ends; a call longer than `shutdown.drain_ms` is answered as stopping at the drain's end
and the server hears the cancel. On a shared store another replica serves what the draining
one finished."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
from conftest import ROOT, free_port, wait_until_ready
from mcp_http import BASIC, McpHttp, text_of
from test_tasks import call, tasks_op, wait_for

TOKENS = {"alice": "alice-token-for-the-drain", "bob": "bob-token-for-the-drain"}
ADMIN_TOKEN = "operator-token-for-the-drain"
ALICE, BOB = ({"Authorization": f"Bearer {TOKENS[who]}"} for who in ("alice", "bob"))
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
POLICY = {"defaults": {"mode": "auto", "sync_budget_ms": 200, "ttl_ms": 60_000,
                       "poll_interval_ms": 200}}


class Gateway:
    """One gateway process on a config of its own; its log events kept in a file."""

    def __init__(self, folder: Path, drain_ms: int, **overrides: Any) -> None:
        self.port = free_port()
        self.journal = folder / "journal"  # what reached the server (basic.py BASIC_JOURNAL)
        self.log = folder / f"gateway-{self.port}.log"
        upstream = {"command": BASIC[0], "args": BASIC[1:],
                    "env": {"BASIC_JOURNAL": str(self.journal)}}
        self.conf = {"listen": {"host": "127.0.0.1", "port": self.port},
                     "upstreams": {"main": upstream}, "tasks": POLICY,
                     "auth": {"bearer_tokens": list(TOKENS.values()),
                              "admin_tokens": [ADMIN_TOKEN]},
                     "shutdown": {"drain_ms": drain_ms}, **overrides}
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return self.base + "/mcp"

    async def start(self) -> Gateway:
        config = self.log.with_suffix(".yaml")  # in the test's folder, gone with it
        config.write_text(json.dumps(self.conf))  # JSON is YAML
        log = os.open(self.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gateway", "--config", config], cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL,
                stderr=log)
        finally:
            os.close(log)
        await wait_until_ready(self.base)
        return self

    def term(self) -> None:
        """SIGTERM to the gateway's own pid, not its process group (as docker stop does
        to a container's first process)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)

    async def exited(self, timeout_s: float) -> int:
        assert self.proc is not None
        return await asyncio.to_thread(self.proc.wait, timeout_s)

    def events(self) -> list[dict[str, Any]]:
        lines = self.log.read_bytes().splitlines()
        return [json.loads(line) for line in lines if line.startswith(b"{")]

    def reached(self) -> list[str]:
        """The lines of the server's journal: each call it received, each cancel heard."""
        return self.journal.read_text().splitlines() if self.journal.exists() else []

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


async def probe(http: aiohttp.ClientSession, base: str, path: str) -> tuple[int, Any]:
    async with http.get(base + path, headers=ADMIN) as resp:
        return resp.status, await resp.json()


async def until_stopping(http: aiohttp.ClientSession, gw: Gateway) -> dict[str, Any]:
    for _ in range(50):
        status, body = await probe(http, gw.base, "/readyz?detail")
        if status == 503:
            return body
        await asyncio.sleep(0.05)
    raise AssertionError("/readyz never turned 503 after SIGTERM")


async def test_sigterm_lets_running_calls_finish_and_refuses_new_ones(tmp_path, http) -> None:
    gw = await Gateway(tmp_path, drain_ms=20_000).start()
    try:
        # A 3 s task (a modern client of the tasks extension: made a task at the budget)
        # and a 4 s inline call (a legacy session), both running when the signal comes.
        task = (await call(http, gw.url, "sleep", {"ms": 3000}, headers=ALICE)
                ).body["result"]
        assert task["status"] == "working"
        legacy = McpHttp(http, gw.url)
        await legacy.initialize(headers=ALICE)
        inline = asyncio.create_task(legacy.call("sleep", {"ms": 4000}, **ALICE))
        await asyncio.sleep(0.5)
        gw.term()
        body = await until_stopping(http, gw)
        assert body["ready"] is False and body["stopping"] is True
        assert body["calls"]["in_flight"] == 2 and body["calls"]["stopping"] is True
        assert (await probe(http, gw.base, "/healthz"))[0] == 200  # alive: not restarted
        # A new call, either era, is refused as stopping and never sent upstream.
        refused = await call(http, gw.url, "echo", {"text": "after-the-signal"}, headers=BOB)
        assert refused.status == 503 and refused.headers["Retry-After"] == "1"
        assert refused.body["error"]["data"]["reason"] == "shutdown"
        late = await legacy.call("echo", {"text": "legacy-after-the-signal"}, **ALICE)
        assert late.status == 503
        assert late.message["error"]["data"]["reason"] == "shutdown"
        # Its tasks are still served, to their owner alone.
        got = await tasks_op(http, gw.url, "tasks/get", task["taskId"], ALICE)
        assert got.body["result"]["status"] == "working"
        foreign = await tasks_op(http, gw.url, "tasks/get", task["taskId"], BOB)
        unknown = await tasks_op(http, gw.url, "tasks/get", "no-such-task", BOB)
        assert {**foreign.body["error"], "data": None} == {**unknown.body["error"], "data": None}
        # The running calls finish: the task completes (read during the drain), the inline
        # call is answered.
        done = await wait_for(http, gw.url, task["taskId"], "completed", ALICE)
        assert done["result"]["content"][0]["text"] == "slept 3000"
        assert text_of(await asyncio.wait_for(inline, 10)) == "slept 4000"
        assert await gw.exited(5) == 0  # once its last call ended, not at the drain's end
        events = [e["event"] for e in gw.events()]
        assert events.index("shutdown.draining") < events.index("shutdown.drained")
        assert next(e for e in gw.events() if e["event"] == "shutdown.drained"
                    )["still_running"] == 0
        assert not any("after-the-signal" in line for line in gw.reached())
    finally:
        gw.kill()


async def test_a_call_longer_than_the_drain_is_answered_as_stopping(tmp_path, http) -> None:
    gw = await Gateway(tmp_path, drain_ms=2000).start()
    try:
        legacy = McpHttp(http, gw.url)
        await legacy.initialize(headers=ALICE)
        long = asyncio.create_task(legacy.call("sleep", {"ms": 60_000}, **ALICE))
        task = (await call(http, gw.url, "sleep", {"ms": 60_000}, headers=BOB)
                ).body["result"]
        assert task["status"] == "working"
        await asyncio.sleep(0.5)
        loop = asyncio.get_running_loop()
        began = loop.time()
        gw.term()
        answer = (await asyncio.wait_for(long, 15)).message["error"]
        assert answer["message"] == "the gateway is stopping"
        assert answer["data"]["reason"] == "shutdown"
        assert loop.time() - began >= 2.0  # the drain was waited for first
        assert await gw.exited(10) == 0
        # The server heard both cancels before it was stopped.
        assert sum(line.startswith("cancelled ") for line in gw.reached()) == 2
        ended = next(e for e in gw.events() if e["event"] == "shutdown.drained")
        assert ended["still_running"] == 2
    finally:
        gw.kill()


async def test_queued_calls_are_refused_at_the_drain_start(tmp_path, http) -> None:
    tools = {"sleep": {"mode": "never", "max_concurrency": 1, "max_queue": 4}}
    gw = await Gateway(tmp_path, drain_ms=20_000,
                       tasks={**POLICY, "tools": tools}).start()
    try:
        legacy = McpHttp(http, gw.url)
        await legacy.initialize(headers=ALICE)
        running = asyncio.create_task(legacy.call("sleep", {"ms": 2000}, **ALICE))
        await asyncio.sleep(0.3)
        bob = McpHttp(http, gw.url)
        await bob.initialize(headers=BOB)
        queued = asyncio.create_task(bob.call("sleep", {"ms": 1}, **BOB))
        await asyncio.sleep(0.3)
        gw.term()
        refused = (await asyncio.wait_for(queued, 5)).message["error"]
        assert refused["data"]["reason"] == "shutdown"
        assert text_of(await asyncio.wait_for(running, 10)) == "slept 2000"
        assert await gw.exited(5) == 0
        assert [line for line in gw.reached() if line.startswith("call sleep")] == [
            'call sleep {"ms": 2000}']
    finally:
        gw.kill()


async def test_a_single_gateway_keeps_its_finished_tasks_across_a_restart(tmp_path, http
                                                                          ) -> None:
    snap = tmp_path / "tasks.snapshot"
    gw = Gateway(tmp_path, drain_ms=20_000, store={"snapshot_path": str(snap)})
    await gw.start()
    try:
        early = (await call(http, gw.url, "sleep", {"ms": 300}, headers=ALICE)).body["result"]
        await wait_for(http, gw.url, early["taskId"], "completed", ALICE)
        late = (await call(http, gw.url, "sleep", {"ms": 2000}, headers=ALICE)).body["result"]
        bobs = (await call(http, gw.url, "sleep", {"ms": 300}, headers=BOB)).body["result"]
        gw.term()  # the late task ends in the drain, and the gateway with it
        assert await gw.exited(10) == 0
        assert snap.stat().st_mode & 0o777 == 0o600
        await gw.start()
        for task, text in ((early, "slept 300"), (late, "slept 2000")):
            got = (await tasks_op(http, gw.url, "tasks/get", task["taskId"], ALICE)
                   ).body["result"]
            assert got["status"] == "completed"
            assert got["result"]["content"][0]["text"] == text
        # Owners are kept: Bob's read of Alice's task is an unknown id's; his own is his.
        foreign = await tasks_op(http, gw.url, "tasks/get", late["taskId"], BOB)
        unknown = await tasks_op(http, gw.url, "tasks/get", "no-such-task", BOB)
        assert {**foreign.body["error"], "data": None} == {**unknown.body["error"], "data": None}
        mine = await tasks_op(http, gw.url, "tasks/get", bobs["taskId"], BOB)
        assert mine.body["result"]["status"] == "completed"
        assert "error" in (await tasks_op(http, gw.url, "tasks/get", bobs["taskId"], ALICE)
                           ).body
        read = next(e for e in gw.events() if e["event"] == "store.snapshot_read")
        assert read["tasks"] == 3
        # A corrupt snapshot: the gateway starts all the same, empty, and says why once.
        gw.term()
        assert await gw.exited(10) == 0
        data = bytearray(snap.read_bytes())
        data[-5] ^= 0xFF
        snap.write_bytes(bytes(data))
        await gw.start()
        gone = await tasks_op(http, gw.url, "tasks/get", early["taskId"], ALICE)
        assert "not found" in gone.body["error"]["message"].lower()
        unreadable = [e for e in gw.events() if e["event"] == "store.snapshot_unreadable"]
        assert len(unreadable) == 1 and unreadable[0]["why"] == "another key or corrupt"
        # Kept aside, not overwritten by the next stop: an operator may yet want it.
        assert Path(unreadable[0]["kept_as"]).read_bytes() == bytes(data)
    finally:
        gw.kill()


async def test_a_draining_replica_finishes_its_task_for_the_others(group, http) -> None:
    """Two replicas on Redis: SIGTERM to the one running a task; the other shows it
    completed with its result as soon as it ends, to its owner alone."""
    a, b = await group(2, shutdown={"drain_ms": 20_000})
    alice, bob = {"Authorization": "Bearer alice-token"}, {"Authorization": "Bearer bob-token"}
    task = (await call(http, a.url, "sleep", {"ms": 2000}, headers=alice)).body["result"]
    assert task["status"] == "working"
    assert a.proc is not None
    a.proc.send_signal(signal.SIGTERM)
    done = await wait_for(http, b.url, task["taskId"], "completed", alice)
    assert done["result"]["content"][0]["text"] == "slept 2000"
    foreign = await tasks_op(http, b.url, "tasks/get", task["taskId"], bob)
    unknown = await tasks_op(http, b.url, "tasks/get", "no-such-task", bob)
    assert {**foreign.body["error"], "data": None} == {**unknown.body["error"], "data": None}
    assert await asyncio.to_thread(a.proc.wait, 10) == 0
