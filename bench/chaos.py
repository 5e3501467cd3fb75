#!/usr/bin/env python3
"""A seeded, bounded chaos run of the replica set, everything on loopback: three gateway
replicas (each in front of tests/servers/basic.py over stdio) behind a real haproxy with the
shipped deploy/haproxy.cfg, sharing a Redis primary and replica that three Sentinels watch
(`store.min_replicas_acked: 1`). Steady load from both eras goes through haproxy: modern
extension tasks, core tasks in legacy sessions, plain calls and MRTR rounds, and a poller
reading acknowledged tasks as it goes. Meanwhile, at seeded moments, it kills a replica
(kill -9) and starts it again, SIGSTOPs the store's primary, kills the primary (the
Sentinels fail over; the old one comes back as a replica), restarts the store empty, and
kills another replica: one incident at a time (each waits for the last to heal).

At the end every acknowledged task is checked: a terminal state with its right result, or
an honest failure naming why (its replica died); legacy sessions outlive their replica
(issue 35), so a core task read in a session that answers 404 is lost like any other;
it counts lost (a returned handle "not found" at the end, before its ttl), stuck (not
terminal long after its call's end) and wrong results, and pass-through errors, each
against the incidents around it. Exit 1 unless lost, stuck and wrong are all 0.

    .venv/bin/python bench/chaos.py [--seed 7] [--load-seconds 60] [--json FILE]

`--load-seconds` is how long the load runs at least, across which the incidents are
placed; each incident waits for the last to heal, so the load goes on until the last has
healed, and the run takes longer still: starting the processes, the last calls' end and
the verdict (some 30 s more). The report gives both lengths (`load_s`, `run_s`).

Needs redis-server, redis-sentinel and haproxy on PATH (scripts/test.sh installs them).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
SERVER = [sys.executable, str(ROOT / "tests" / "servers" / "basic.py")]
MODERN = "2026-07-28"
CORE = "2025-11-25"
TASKS = {"extensions": {"io.modelcontextprotocol/tasks": {}}}
ACCEPT = "application/json, text/event-stream"
STRANDED = "the gateway replica running this task stopped"
TTL_MS = 600_000
LEASE_MS = 2000
LOGS = os.environ.get("CHAOS_LOGS")
_ids = itertools.count(1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def listening(port: int, timeout_s: float = 30) -> None:
    for _ in range(int(timeout_s * 20)):
        with contextlib.suppress(OSError):
            socket.create_connection(("127.0.0.1", port), 0.1).close()
            return
        await asyncio.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


# -- processes --------------------------------------------------------------------------------
class Node:
    """One redis-server on loopback, keeping nothing on disk."""

    def __init__(self, folder: Path) -> None:
        self.port = free_port()
        self.folder = folder
        self.proc: subprocess.Popen[bytes] | None = None

    async def start(self, primary: int | None = None) -> None:
        follow = [] if primary is None else ["--replicaof", "127.0.0.1", str(primary)]
        self.proc = subprocess.Popen(
            [_which("redis-server"), "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", str(self.folder),
             # a replica that lost its primary's data resyncs at once, not after 5 s
             "--repl-diskless-sync-delay", "0", *follow],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        await listening(self.port)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None

    def signal(self, sig: int) -> None:
        if self.proc is not None:
            self.proc.send_signal(sig)


class Store:
    """A primary and a replica, and three Sentinels that name the primary."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.nodes = [Node(folder), Node(folder)]
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.sentinels: list[subprocess.Popen[bytes]] = []

    async def start(self) -> None:
        first, second = self.nodes
        await first.start()
        await second.start(first.port)
        for port in self.sentinel_ports:
            conf = self.folder / f"sentinel-{port}.conf"
            conf.write_text(f"port {port}\nbind 127.0.0.1\n"
                            f"sentinel monitor main 127.0.0.1 {first.port} 2\n"
                            "sentinel down-after-milliseconds main 1000\n"
                            "sentinel failover-timeout main 5000\n")
            self.sentinels.append(subprocess.Popen(
                [_which("redis-sentinel"), str(conf)], stdout=_log(f"sentinel-{port}"),
                stderr=subprocess.STDOUT))
        for port in self.sentinel_ports:
            await listening(port)

    @property
    def addresses(self) -> list[str]:
        return [f"127.0.0.1:{p}" for p in self.sentinel_ports]

    async def primary(self) -> Node:
        """The node most Sentinels name now, once it says itself that it is the primary."""
        for _ in range(100):
            named: Counter[int] = Counter()
            for port in self.sentinel_ports:
                words = (await _cli(port, "sentinel", "get-master-addr-by-name", "main")).split()
                if len(words) == 2:
                    named[int(words[1])] += 1
            if named:
                port, votes = named.most_common(1)[0]
                role = (await _cli(port, "role")).split()
                if votes >= 2 and role[:1] == ["master"]:
                    return next(n for n in self.nodes if n.port == port)
            await asyncio.sleep(0.1)
        raise RuntimeError("the sentinels name no primary")

    async def failed_over_from(self, old: Node, timeout_s: float = 30) -> Node:
        for _ in range(int(timeout_s * 10)):
            now = await self.primary()
            if now is not old:
                return now
            await asyncio.sleep(0.1)
        raise RuntimeError("the sentinels never promoted the replica")

    def stop(self) -> None:
        for proc in self.sentinels:
            proc.kill()
            proc.wait(10)
        for node in self.nodes:
            node.kill()


class Gateway:
    """One replica: a gateway process with its own stdio server."""

    def __init__(self, name: str, store: Store, folder: Path) -> None:
        self.name = name
        self.port = free_port()
        self.config = folder / f"{name}.json"
        self.config.write_text(json.dumps({
            "listen": {"port": self.port},
            # ask's elicitation must reach its own caller among many: a process per call.
            "upstreams": {"main": {"command": SERVER[0], "args": SERVER[1:]},
                          "asker": {"command": SERVER[0], "args": SERVER[1:],
                                    "path": "/ask/mcp", "isolation": "call"}},
            "tasks": {"defaults": {"mode": "auto", "sync_budget_ms": 100, "ttl_ms": TTL_MS,
                                   "poll_interval_ms": 200},
                      "tools": {"echo": {"mode": "never"}}},
            "limits": {"max_tasks": 100_000, "max_tasks_per_owner": 100_000,
                       "max_finished_tasks_per_owner": 100_000,
                       "task_creations_per_s": 10_000,
                       "task_creations_burst": 10_000, "task_requests_per_s": 10_000,
                       "task_requests_burst": 10_000},
            "store": {"backend": "redis", "sentinels": store.addresses,
                      "sentinel_master": "main", "min_replicas_acked": 1,
                      "ack_timeout_ms": 500, "lease_ms": LEASE_MS, "key_prefix": "chaos:"},
            "replica": {"id": name, "secret": "the chaos run's shared secret",
                        "url": f"http://127.0.0.1:{self.port}"},
            "logging": {"level": "info" if LOGS else "error"}}))
        self.proc: subprocess.Popen[bytes] | None = None

    async def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "--config", str(self.config)], cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=_log(self.name),
            stderr=subprocess.STDOUT)
        await ready(f"http://127.0.0.1:{self.port}")

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None


async def ready(base: str, timeout_s: float = 60) -> None:
    async with aiohttp.ClientSession() as http:
        for _ in range(int(timeout_s * 10)):
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(base + "/readyz") as resp:
                    if resp.status == 200:
                        return
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{base} never became ready")


@contextlib.asynccontextmanager
async def balancer(gateways: list[Gateway]) -> AsyncIterator[str]:
    port = free_port()
    env = {**os.environ, "FRONT": f"127.0.0.1:{port}",
           **{f"GATEWAY_{i + 1}": f"127.0.0.1:{g.port}" for i, g in enumerate(gateways)}}
    proc = subprocess.Popen([_which("haproxy"), "-db", "-f",
                             str(ROOT / "deploy" / "haproxy.cfg")], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        await ready(f"http://127.0.0.1:{port}")
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.kill()
        proc.wait(10)


async def _cli(port: int, *args: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        _which("redis-cli"), "-p", str(port), *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL)
    out, _ = await proc.communicate()
    return out.decode()


def _log(name: str) -> Any:
    """Where a process's output goes: CHAOS_LOGS=DIR keeps it (appended), for a post-mortem."""
    if not LOGS:
        return subprocess.DEVNULL
    return (Path(LOGS) / f"{name}.log").open("ab")


def _which(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise SystemExit(f"needs {name} on PATH (scripts/test.sh installs it)")
    return found


# -- the wire -----------------------------------------------------------------------------------
@dataclass
class Reply:
    status: int
    body: dict[str, Any]
    session: str | None = None


async def post(http: aiohttp.ClientSession, url: str, body: dict[str, Any],
               headers: dict[str, str]) -> Reply:
    """One POST; the JSON-RPC answer, from a JSON body or the SSE stream's event with its id."""
    async with http.post(url, json=body, headers={"Content-Type": "application/json",
                                                   "Accept": ACCEPT, **headers}) as resp:
        raw = await resp.read()
        session = resp.headers.get("Mcp-Session-Id")
        if resp.content_type == "text/event-stream":
            for line in raw.decode().splitlines():
                if line.startswith("data:"):
                    msg = json.loads(line[5:])
                    if msg.get("id") == body.get("id") and "method" not in msg:
                        return Reply(resp.status, msg, session)
            return Reply(resp.status, {"error": {"message": "the stream ended unanswered"}})
        try:
            return Reply(resp.status, json.loads(raw) if raw else {}, session)
        except ValueError:
            return Reply(resp.status, {"error": {"message": raw[:80].decode(errors="replace")}})


async def modern(http: aiohttp.ClientSession, url: str, method: str, params: dict[str, Any],
                 caps: dict[str, Any]) -> Reply:
    params = {**params, "_meta": {"io.modelcontextprotocol/protocolVersion": MODERN,
                                  "io.modelcontextprotocol/clientCapabilities": caps}}
    headers = {"MCP-Protocol-Version": MODERN, "Mcp-Method": method}
    name = params.get("name", params.get("taskId"))
    if name is not None:
        headers["Mcp-Name"] = str(name)
    return await post(http, url, {"jsonrpc": "2.0", "id": next(_ids), "method": method,
                                  "params": params}, headers)


def text_of(result: dict[str, Any]) -> str | None:
    content = result.get("content") or [{}]
    return content[0].get("text") if isinstance(content[0], dict) else None


# -- the ledger ---------------------------------------------------------------------------------
@dataclass
class Acked:
    task_id: str
    era: str  # modern (the extension) or core
    expected: str
    created: float
    ends_by: float  # when its call should have ended
    session: str | None = None


@dataclass
class Ledger:
    began: float = field(default_factory=time.monotonic)
    tasks: list[Acked] = field(default_factory=list)
    events: list[tuple[float, str]] = field(default_factory=list)
    calls: Counter[str] = field(default_factory=Counter)
    errors: list[tuple[float, str, str]] = field(default_factory=list)  # (t, kind, message)
    blips: list[tuple[float, str]] = field(default_factory=list)  # transient not-found

    def now(self) -> float:
        return time.monotonic() - self.began

    def event(self, what: str) -> None:
        self.events.append((self.now(), what))
        print(f"{self.now():6.1f} s  {what}", file=sys.stderr)

    def error(self, kind: str, reply: Reply | Exception) -> None:
        text = repr(reply) if isinstance(reply, Exception) else \
            f"HTTP {reply.status} {json.dumps(reply.body)[:160]}"
        self.errors.append((self.now(), kind, text))

    def killed_after(self, replica: str | None, start: float) -> bool:
        """Whether `replica` (any, when None) was killed after `start`."""
        return any(t >= start - 1 and w.startswith(f"kill replica {replica or ''}")
                   for t, w in self.events)

    def explained(self, t: float) -> bool:
        """An error within a few seconds of a replica's death or a store incident."""
        return any(t0 - 0.5 <= t <= t0 + 6 for t0, _ in self.events)


Stop = asyncio.Event


async def modern_tasks(http: aiohttp.ClientSession, url: str, ledger: Ledger,
                       rng: random.Random, stop: Stop) -> None:
    while not stop.is_set():
        ms = rng.randrange(200, 3000, 100)
        t0 = ledger.now()
        try:
            reply = await modern(http, url, "tools/call",
                                 {"name": "sleep", "arguments": {"ms": ms}}, TASKS)
        except aiohttp.ClientError as exc:
            ledger.error("modern task call", exc)
            await asyncio.sleep(0.1)
            continue
        result = reply.body.get("result") or {}
        ledger.calls["modern task calls"] += 1
        if result.get("resultType") == "task":
            ledger.tasks.append(Acked(result["taskId"], "modern", f"slept {ms}", t0,
                                      t0 + ms / 1000))
            await asyncio.sleep(0.05)
        elif text_of(result) != f"slept {ms}":  # inline (store away, not durable): fine
            ledger.error("modern task call", reply)


async def core_tasks(http: aiohttp.ClientSession, url: str, ledger: Ledger,
                     rng: random.Random, stop: Stop) -> None:
    session: str | None = None
    while not stop.is_set():
        try:
            if session is None:
                session = await initialize(http, url)
                if session is None:
                    ledger.error("core initialize", Reply(0, {}))
                    await asyncio.sleep(0.2)
                    continue
            ms = rng.randrange(200, 3000, 100)
            t0 = ledger.now()
            reply = await legacy(http, url, session, "tools/call", {
                "name": "sleep", "arguments": {"ms": ms}, "task": {"ttl": TTL_MS}})
        except aiohttp.ClientError as exc:
            ledger.error("core task call", exc)
            await asyncio.sleep(0.1)
            continue
        ledger.calls["core task calls"] += 1
        if reply.status == 404:  # sessions outlive their replica: this is an error now
            ledger.error("core task call", reply)
            session = None
            continue
        task = (reply.body.get("result") or {}).get("task")
        if task is not None:
            ledger.tasks.append(Acked(task["taskId"], "core", f"slept {ms}", t0,
                                      t0 + ms / 1000, session))
            await asyncio.sleep(0.05)
        elif "unavailable" not in str(reply.body.get("error")):  # refused while the store
            ledger.error("core task call", reply)                # is away: honest
            await asyncio.sleep(0.1)


async def initialize(http: aiohttp.ClientSession, url: str) -> str | None:
    reply = await post(http, url, {"jsonrpc": "2.0", "id": next(_ids), "method": "initialize",
                                   "params": {"protocolVersion": CORE, "capabilities": {},
                                              "clientInfo": {"name": "chaos", "version": "1"}}},
                       {})
    if reply.session is None:
        return None
    await legacy(http, url, reply.session, "notifications/initialized", None)
    return reply.session


async def legacy(http: aiohttp.ClientSession, url: str, session: str, method: str,
                 params: dict[str, Any] | None) -> Reply:
    body: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        body |= {"id": next(_ids), "params": params}
    return await post(http, url, body, {"Mcp-Session-Id": session,
                                        "MCP-Protocol-Version": CORE})


async def plain_calls(http: aiohttp.ClientSession, url: str, ledger: Ledger,
                      rng: random.Random, stop: Stop) -> None:
    while not stop.is_set():
        word = f"w{rng.randrange(10**6)}"
        try:
            reply = await modern(http, url, "tools/call",
                                 {"name": "echo", "arguments": {"text": word}}, {})
        except aiohttp.ClientError as exc:
            ledger.error("plain call", exc)
            continue
        ledger.calls["plain calls"] += 1
        if text_of(reply.body.get("result") or {}) != word:
            ledger.error("plain call", reply)
        await asyncio.sleep(0.02)


async def mrtr_rounds(http: aiohttp.ClientSession, url: str, ledger: Ledger,
                      rng: random.Random, stop: Stop) -> None:
    caps = {"elicitation": {}}
    url = url.replace("/mcp", "/ask/mcp")
    while not stop.is_set():
        name = f"n{rng.randrange(10**6)}"
        try:
            first = await modern(http, url, "tools/call",
                                 {"name": "ask", "arguments": {"message": "Name?"}}, caps)
            asked = first.body.get("result") or {}
            if asked.get("resultType") != "input_required":
                ledger.error("mrtr round", first)
                await asyncio.sleep(0.1)
                continue
            (key, _), = asked["inputRequests"].items()
            answer = {"action": "accept", "content": {"name": name}}
            done = await modern(http, url, "tools/call", {
                "name": "ask", "arguments": {"message": "Name?"},
                "inputResponses": {key: answer}, "requestState": asked["requestState"]}, caps)
        except aiohttp.ClientError as exc:
            ledger.error("mrtr round", exc)
            await asyncio.sleep(0.1)
            continue
        ledger.calls["mrtr rounds"] += 1
        got = text_of(done.body.get("result") or {})
        if got is None or json.loads(got).get("content") != {"name": name}:
            ledger.error("mrtr round", done)
        await asyncio.sleep(0.05)


async def poller(http: aiohttp.ClientSession, url: str, ledger: Ledger, rng: random.Random,
                 stop: Stop) -> None:
    """Reads acknowledged modern tasks as a client would; a "not found" is a blip."""
    while not stop.is_set():
        await asyncio.sleep(0.05)
        modern_ones = [t for t in ledger.tasks[-200:] if t.era == "modern"]
        if not modern_ones:
            continue
        task = rng.choice(modern_ones)
        with contextlib.suppress(aiohttp.ClientError):
            reply = await modern(http, url, "tasks/get", {"taskId": task.task_id}, TASKS)
            if "not found" in str(reply.body.get("error")).lower():
                ledger.blips.append((ledger.now(), task.task_id))


# -- the incidents ------------------------------------------------------------------------------
Action = Callable[[], Awaitable[None]]


def schedule(seconds: float, rng: random.Random, gateways: list[Gateway], store: Store,
             ledger: Ledger) -> list[tuple[float, Action]]:
    """At seeded moments of the run: what happens."""
    first, second = rng.sample(gateways, 2)

    def kill_replica(g: Gateway) -> Action:
        async def act() -> None:
            ledger.event(f"kill replica {g.name} (kill -9)")
            g.kill()
            await asyncio.sleep(seconds * 0.08)
            await g.start()
            ledger.event(f"replica {g.name} started again")
        return act

    async def stop_primary() -> None:
        node = await store.primary()
        ledger.event(f"SIGSTOP the store's primary :{node.port} for 3 s")
        node.signal(signal.SIGSTOP)
        await asyncio.sleep(3)
        node.signal(signal.SIGCONT)
        ledger.event("SIGCONT the old primary")

    async def kill_primary() -> None:
        old = await store.primary()
        ledger.event(f"kill the store's primary :{old.port} (kill -9)")
        old.kill()
        new = await store.failed_over_from(old)
        ledger.event(f"the sentinels promoted :{new.port}")
        await old.start(new.port)
        ledger.event(f"the old primary is back as a replica of :{new.port}")

    async def restart_empty() -> None:
        node = await store.primary()
        ledger.event(f"restart the store's primary :{node.port} empty")
        node.kill()
        await node.start()  # at once: the sentinels see no outage; its replica resyncs

    return sorted([
        (seconds * (0.10 + rng.random() * 0.04), kill_replica(first)),
        (seconds * (0.26 + rng.random() * 0.04), stop_primary),
        (seconds * (0.42 + rng.random() * 0.04), kill_primary),
        (seconds * (0.60 + rng.random() * 0.04), restart_empty),
        (seconds * (0.76 + rng.random() * 0.04), kill_replica(second)),
    ], key=lambda item: item[0])


async def incidents(plan: list[tuple[float, Action]], ledger: Ledger,
                    gateways: list[Gateway], store: Store) -> None:
    """One incident at a time: each waits until the last one has healed (the store's
    primary has its replica online again, every gateway replica sees the store and its
    outbox is empty), as the promise is made for single faults: a replica that dies while
    the store is away takes its outbox with it, and a primary killed before its new
    replica has synced takes what only it held (docs/replicas.md)."""
    after = 0.0  # the last incident's end, plus time for every replica to notice it
    for at, act in plan:
        await asyncio.sleep(max(0.0, at - ledger.now(), after - ledger.now()))
        waited = await settled(gateways, store)
        if waited >= 0.5:
            ledger.event(f"waited {waited:.1f} s for the last incident to heal")
        await act()
        after = ledger.now() + 2 * LEASE_MS / 1000


async def settled(gateways: list[Gateway], store: Store, timeout_s: float = 40,
                  steady_s: float = 3.0) -> float:
    """Seconds waited until all is healed and has stayed so for `steady_s`."""
    began = time.monotonic()
    healthy_since: float | None = None
    async with aiohttp.ClientSession() as http:
        while time.monotonic() - began < timeout_s:
            primary = await store.primary()
            states = ["state=online" in await _cli(primary.port, "info", "replication")]
            for g in gateways:
                with contextlib.suppress(aiohttp.ClientError, ValueError):
                    async with http.get(f"http://127.0.0.1:{g.port}/readyz?detail") as resp:
                        seen = (await resp.json())["store"]
                        states.append(seen["up"] and not seen["outbox"]["changes"])
            if len(states) == len(gateways) + 1 and all(states):
                healthy_since = healthy_since or time.monotonic()
                if time.monotonic() - healthy_since >= steady_s:
                    break
            else:
                healthy_since = None
            await asyncio.sleep(0.1)
    return time.monotonic() - began


# -- the verdict --------------------------------------------------------------------------------
async def verdict(http: aiohttp.ClientSession, url: str, ledger: Ledger, store: Store
                  ) -> dict[str, Any]:
    outcome: Counter[str] = Counter()
    wrong: list[str] = []
    primary = await store.primary()
    for task in ledger.tasks:
        kind, detail = await check(http, url, task, ledger, primary)
        outcome[kind] += 1
        if kind in ("lost", "stuck", "wrong"):
            wrong.append(f"{kind}: {task.era} {task.task_id} made at {task.created:.1f} s, "
                         f"its call ending at {task.ends_by:.1f} s: {detail}")
    unexplained = [e for e in ledger.errors if not ledger.explained(e[0])]
    return {"acknowledged": len(ledger.tasks),
            "by_era": dict(Counter(t.era for t in ledger.tasks)),
            "outcome": dict(outcome), "problems": wrong[:20],
            "lost": outcome["lost"], "stuck": outcome["stuck"], "wrong": outcome["wrong"],
            "calls": dict(ledger.calls), "errors": len(ledger.errors),
            "errors_by_kind": dict(Counter(k for _, k, _ in ledger.errors)),
            "errors_unexplained": [f"{t:.1f} s {k}: {m}" for t, k, m in unexplained][:20],
            "errors_sample": [f"{t:.1f} s {k}: {m}" for t, k, m in ledger.errors[::max(
                1, len(ledger.errors) // 20)]][:20],
            "not_found_blips": len(ledger.blips),
            "events": [f"{t:.1f} s {w}" for t, w in ledger.events]}


async def check(http: aiohttp.ClientSession, url: str, task: Acked, ledger: Ledger,
                primary: Node) -> tuple[str, str]:
    """ok, honest (failed naming why), lost, stuck or wrong."""
    deadline = time.monotonic() + 15
    while True:
        got = await (read_modern(http, url, task) if task.era == "modern"
                     else read_core(http, url, task))
        if got is None:  # not found, or its legacy session is gone (it outlives its replica)
            return "lost", "not found"
        status, text, message = got
        if status == "completed":
            return ("ok", "") if text == task.expected else ("wrong", f"{text!r}")
        ran_on = (await _cli(primary.port, "hget", f"chaos:t:{task.task_id}", "replica")
                  ).strip()
        if status == "failed" and message == STRANDED and ledger.killed_after(ran_on,
                                                                              task.created):
            return "honest: its replica died", ""
        if status in ("failed", "cancelled"):
            return "wrong", f"{status}: {message}"
        if time.monotonic() > deadline:
            return "stuck", status
        await asyncio.sleep(0.2)


async def read_modern(http: aiohttp.ClientSession, url: str, task: Acked
                      ) -> tuple[str, str | None, str | None] | None:
    reply = await modern(http, url, "tasks/get", {"taskId": task.task_id}, TASKS)
    got = reply.body.get("result")
    if got is None:
        return None if "not found" in str(reply.body.get("error")).lower() else \
            ("unreadable", None, str(reply.body))
    return got["status"], text_of(got.get("result") or {}), got.get("statusMessage")


async def read_core(http: aiohttp.ClientSession, url: str, task: Acked
                    ) -> tuple[str, str | None, str | None] | None:
    assert task.session is not None
    reply = await legacy(http, url, task.session, "tasks/get", {"taskId": task.task_id})
    got = reply.body.get("result")
    if reply.status == 404 or got is None:
        return None
    if got["status"] != "completed":
        return got["status"], None, got.get("statusMessage")
    result = await legacy(http, url, task.session, "tasks/result", {"taskId": task.task_id})
    return "completed", text_of(result.body.get("result") or {}), None


# -- the run ------------------------------------------------------------------------------------
async def run(seed: int, seconds: float) -> dict[str, Any]:
    """The whole run; `seconds`: the load's length at least (the incidents' span)."""
    began = time.monotonic()
    rng = random.Random(seed)
    ledger = Ledger()
    with tempfile.TemporaryDirectory(prefix="chaos-") as folder:
        store = Store(Path(folder))
        await store.start()
        gateways = [Gateway(f"g{i + 1}", store, Path(folder)) for i in range(3)]
        try:
            await asyncio.gather(*(g.start() for g in gateways))
            async with balancer(gateways) as url, aiohttp.ClientSession(
                    timeout=aiohttp.ClientTimeout(total=30)) as http:
                await warm(http, url)
                ledger.began = time.monotonic()
                stop = asyncio.Event()
                workers = [*(modern_tasks(http, url, ledger, random.Random(rng.random()), stop)
                             for _ in range(4)),
                           *(core_tasks(http, url, ledger, random.Random(rng.random()), stop)
                             for _ in range(2)),
                           plain_calls(http, url, ledger, random.Random(rng.random()), stop),
                           mrtr_rounds(http, url, ledger, random.Random(rng.random()), stop),
                           poller(http, url, ledger, random.Random(rng.random()), stop)]
                load = asyncio.gather(*workers)
                await incidents(schedule(seconds, rng, gateways, store, ledger), ledger,
                                gateways, store)
                await asyncio.sleep(max(0.0, seconds - ledger.now()))
                stop.set()
                load_s = ledger.now()
                await load
                await asyncio.sleep(3 + LEASE_MS / 1000)  # the last calls end
                report = await verdict(http, url, ledger, store)
        finally:
            for g in gateways:
                g.kill()
            store.stop()
    return {"seed": seed, "load_seconds": seconds, "load_s": round(load_s, 1),
            "run_s": round(time.monotonic() - began, 1),
            "load": "4 modern task clients, 2 core task sessions, 1 plain caller, 1 MRTR "
                    "caller, 1 poller, through haproxy", **report}


async def warm(http: aiohttp.ClientSession, url: str) -> None:
    """Until the store's replica has synced, creations are answered inline."""
    for _ in range(300):
        reply = await modern(http, url, "tools/call",
                             {"name": "sleep", "arguments": {"ms": 150}}, TASKS)
        if (reply.body.get("result") or {}).get("resultType") == "task":
            return
        await asyncio.sleep(0.1)
    raise RuntimeError("creations were never acknowledged by the store's replica")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=7)
    # --seconds: its old name, kept for scripts that use it.
    parser.add_argument("--load-seconds", "--seconds", dest="seconds", type=float, default=60,
                        help=("how long the load runs at least, the incidents placed across "
                              "it; the run takes longer (start, heal waits, verdict)"))
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    # SIGTERM (a test's timeout, say) unwinds like an error: every process started is ended.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(2))
    report = asyncio.run(run(args.seed, args.seconds))
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    sys.exit(1 if report["lost"] or report["stuck"] or report["wrong"] else 0)


if __name__ == "__main__":
    main()
