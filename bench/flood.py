#!/usr/bin/env python3
"""Floods of issue 41: what one valid token (Bob's) can make the gateway hold, on its defaults.

Each attack runs against a gateway process of its own (two static tokens, Alice's and Bob's;
only the settings the attack needs besides the defaults) while Alice calls the same upstream,
and reports, beside the documented budget (the checkout's `Limits` defaults):
  - the gateway's peak resident memory growth: VmHWM at the end minus VmRSS when idle (warm,
    before the flood), from /proc/PID/status;
  - the server processes it runs (its descendants in /proc), idle and at the peak, and their
    resident memory together at the peak;
  - what Bob got (answers, or the errors he read, counted), and what Alice got: her calls
    during the flood answered or not, p50 and max seconds.

Attacks (issue 41's items):
  1a  twelve concurrent 50 MiB answers (stdio `blob`) to Bob, who reads none for 25 s
      (slow_reader_ms less 5 s), then reads them
  1b  an HTTP upstream (tests/servers/unruly_http.py) answering Bob three 200 MiB bodies
  2a  `isolation: client`: Bob opens 40 sessions at once (Alice opens, calls, closes hers)
  2b  `isolation: call`: Bob's 40 calls of 3 s in flight at once
  3   60 legacy sessions of Bob's, each initialize with a 3 MiB clientInfo
  4   a Redis store (redis-server started here): Bob's task results, unread, 36 of 8 MiB
      then 20 of 512 KiB; Alice's tasks of 1 MiB meanwhile and after (what Redis holds is
      read with INFO memory)
  6   Bob's call naming Alice's running task (related-task _meta) on a server that labels
      what it asks with that task: is Alice asked Bob's question, and who gets her answer
The servers are this checkout's (tests/servers); the gateway is `--gateway-dir`'s (default:
this checkout, or $PROJECT_DIR), run with its own .venv/bin/python when it has one. Every
process started here is stopped at the end (the gateway's leftover children too).

    .venv/bin/python bench/flood.py [--gateway-dir DIR] [--attacks 1a,1b,2a,2b,3,4,6]
                                    [--quick] [--json FILE]

`--quick`: attack 1a alone, three 8 MiB answers held 1 s (a smoke run for the tests).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import itertools
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import redis.asyncio as aioredis
from tasks import rss_mib

from bench import free_port

ROOT = Path(__file__).resolve().parents[1]
BASIC = [sys.executable, str(ROOT / "tests" / "servers" / "basic.py")]
UNRULY = [sys.executable, str(ROOT / "tests" / "servers" / "unruly_http.py")]
MIB = 1 << 20
TOKENS = {"alice": "alice-token", "bob": "bob-token"}
ACCEPT = "application/json, text/event-stream"
RELATED = "io.modelcontextprotocol/related-task"
PAGE = os.sysconf("SC_PAGE_SIZE")


# -- what the gateway holds, from /proc -----------------------------------------------------

def descendants(pid: int) -> dict[int, tuple[float, bytes]]:
    """The process's descendants now: pid -> (resident MiB, command line)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if fields[0] != "Z":
            parents[int(stat.parent.name)] = int(fields[1])
    found: dict[int, tuple[float, bytes]] = {}
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier}
        for child in frontier:
            with contextlib.suppress(OSError, IndexError):
                pages = int(Path(f"/proc/{child}/statm").read_text().split()[1])
                found[child] = (pages * PAGE / MIB,
                                Path(f"/proc/{child}/cmdline").read_bytes())
    return found


class Probe:
    """Samples the gateway every 0.1 s: its server processes, and its resident memory (the
    peak is VmHWM; where that is still the start's, the highest VmRSS sampled)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.seen: dict[int, bytes] = {}  # every server process it ran: pid -> command line
        self.idle_rss = self.idle_hwm = self.peak_rss = 0.0
        self.idle_children = self.peak_children = 0
        self.peak_children_rss = 0.0

    def sample(self) -> int:
        now = descendants(self.pid)
        self.seen.update({pid: cmd for pid, (_, cmd) in now.items()})
        self.peak_children = max(self.peak_children, len(now))
        self.peak_children_rss = max(self.peak_children_rss, sum(r for r, _ in now.values()))
        self.peak_rss = max(self.peak_rss, rss_mib(self.pid)[0])
        return len(now)

    def idle(self) -> None:
        """Now is the baseline: the gateway warm, before the flood."""
        self.idle_rss, self.idle_hwm = rss_mib(self.pid)
        self.idle_children = self.peak_children = self.sample()
        self.peak_children_rss, self.peak_rss = 0.0, self.idle_rss

    async def watch(self) -> None:
        while True:
            with contextlib.suppress(OSError):  # the gateway stopping
                self.sample()
            await asyncio.sleep(0.1)

    def growth(self) -> float:
        """The peak resident memory since the baseline, over the baseline."""
        hwm = rss_mib(self.pid)[1]
        return (hwm if hwm > self.idle_hwm else self.peak_rss) - self.idle_rss


# -- the processes this bench starts --------------------------------------------------------

def gateway_python(tree: Path) -> str:
    own = tree / ".venv" / "bin" / "python"
    return str(own) if own.exists() else sys.executable


def limits_of(tree: Path) -> dict[str, int]:
    """The checkout's documented budgets: `Limits` defaults, and what a legacy session keeps
    of its initialize (resume.MAX_RECORD_BYTES) where the checkout has it."""
    script = (
        "import dataclasses, json\n"
        "try:\n    from gateway.settings.schema import Limits\n"  # the package (issue 42)
        "except ImportError:\n    from gateway.settings import Limits\n"
        "out = {f.name: f.default for f in dataclasses.fields(Limits)"
        " if isinstance(f.default, (int, float))}\n"
        "try:\n    from gateway.downstream.resume import MAX_RECORD_BYTES\n"
        "    out['session_record_bytes'] = MAX_RECORD_BYTES\nexcept ImportError:\n    pass\n"
        "print(json.dumps(out))")
    done = subprocess.run([gateway_python(tree), "-c", script], cwd=tree, check=True,
                          capture_output=True, text=True, env={**os.environ,
                                                               "PYTHONPATH": str(tree)})
    return dict(json.loads(done.stdout))


@contextlib.asynccontextmanager
async def gateway(tree: Path, conf: dict[str, Any], log: Path | None
                  ) -> AsyncIterator[tuple[str, Probe]]:
    """A gateway of `tree` as a process of its own with `conf` (and the two tokens), ready:
    its origin and a probe of it. At the end it is stopped, and any server process it left
    is killed."""
    port = free_port()
    conf = {"listen": {"host": "127.0.0.1", "port": port}, "logging": {"level": "warning"},
            "auth": {"bearer_tokens": list(TOKENS.values())}, **conf}
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        json.dump(conf, f)  # JSON is YAML
    out = log.open("ab") if log else subprocess.DEVNULL
    proc = subprocess.Popen([gateway_python(tree), "-m", "gateway", "--config", f.name],
                            cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)},
                            stdout=out, stderr=out)
    probe = Probe(proc.pid)
    watching = asyncio.create_task(probe.watch())
    try:
        origin = f"http://127.0.0.1:{port}"
        await ready(origin + "/readyz", proc)
        yield origin, probe
    finally:
        watching.cancel()
        stop(proc)
        kill_left(probe.seen)
        os.unlink(f.name)
        if log:
            out.close()  # type: ignore[union-attr]


async def ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 30) -> None:
    async with aiohttp.ClientSession() as http:
        for _ in range(int(timeout_s / 0.05)):
            if proc.poll() is not None:
                raise SystemExit(f"the gateway exited with {proc.returncode} (see --log)")
            with contextlib.suppress(aiohttp.ClientConnectionError):
                async with http.get(url) as resp:
                    if resp.status == 200:
                        return
            await asyncio.sleep(0.05)
    raise SystemExit(f"{url} never answered 200")


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL 15 s later."""
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def kill_left(seen: dict[int, bytes]) -> None:
    """Kills the server processes a stopped gateway left behind (the same pid running the same
    command line: never a stranger that took a freed pid)."""
    for pid, cmdline in seen.items():
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/cmdline").read_bytes() == cmdline:
                os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def side_server(command: list[str], port: int, scratch: str | None = None
                ) -> Any:
    """A server this bench runs beside the gateway (an HTTP upstream, redis-server), listening
    on `port` within 10 s; stopped at the end."""
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", port), 0.1).close()
                break
            if proc.poll() is not None:
                raise SystemExit(f"{command[0]} exited with {proc.returncode}")
            time.sleep(0.05)
        else:
            raise SystemExit(f"{command[0]} is not listening on port {port}")
        yield proc
    finally:
        stop(proc)
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)


def redis_server(port: int) -> Any:
    binary = shutil.which("valkey-server") or shutil.which("redis-server")
    if binary is None:
        raise SystemExit("attack 4 needs redis-server (apt-get install redis-server)")
    scratch = tempfile.mkdtemp(prefix="flood-redis-")
    return side_server([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                        "--appendonly", "no", "--dir", scratch], port, scratch)


# -- Alice and Bob: legacy sessions over HTTP, one static token each ------------------------

class Principal:
    """One legacy session of a principal (its bearer token sent with every request)."""

    def __init__(self, http: aiohttp.ClientSession, url: str, who: str) -> None:
        self.http, self.url, self.who = http, url, who
        self.session_id: str | None = None
        self.version = "2025-11-25"
        self.ids = itertools.count(1)

    def headers(self, **extra: str) -> dict[str, str]:
        h = {"Content-Type": "application/json", "Accept": ACCEPT,
             "Authorization": f"Bearer {TOKENS[self.who]}"}
        if self.session_id:
            h |= {"Mcp-Session-Id": self.session_id, "MCP-Protocol-Version": self.version}
        return h | extra

    async def open(self, capabilities: dict[str, Any] | None = None,
                   info: dict[str, Any] | None = None) -> str:
        """initialize and initialized: "ok", or what the gateway said instead."""
        body = json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": self.version, "capabilities": capabilities or {},
            "clientInfo": info or {"name": f"flood-{self.who}", "version": "1"}}}).encode()
        async with self.http.post(self.url, data=body, headers=self.headers()) as resp:
            said = describe(await message_of(resp))
            self.session_id = resp.headers.get("Mcp-Session-Id")
        if said == "ok":
            await self.notify("notifications/initialized")
        return said

    async def notify(self, method: str) -> None:
        async with self.http.post(self.url, json={"jsonrpc": "2.0", "method": method},
                                  headers=self.headers()):
            pass

    def post(self, method: str, params: dict[str, Any]) -> Any:
        """The request's response, unread (an async context manager)."""
        return self.http.post(self.url, headers=self.headers(), json={
            "jsonrpc": "2.0", "id": next(self.ids), "method": method, "params": params})

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        async with self.post(method, params) as resp:
            return await message_of(resp)

    async def call(self, name: str, arguments: dict[str, Any],
                   meta: dict[str, Any] | None = None) -> dict[str, Any]:
        params = {"name": name, "arguments": arguments, **({"_meta": meta} if meta else {})}
        return await self.request("tools/call", params)

    async def close(self) -> None:
        async with self.http.delete(self.url, headers=self.headers()):
            pass


async def message_of(resp: aiohttp.ClientResponse) -> dict[str, Any]:
    """The JSON-RPC response of an answer read whole."""
    return parse_answer(await resp.read(), resp)


def parse_answer(raw: bytes, resp: aiohttp.ClientResponse) -> dict[str, Any]:
    """The JSON-RPC response in a JSON or SSE answer; an HTTP error as an error message."""
    if resp.headers.get("Content-Type", "").startswith("text/event-stream"):
        for block in raw.decode(errors="replace").split("\n\n"):
            data = "\n".join(line[5:].lstrip() for line in block.split("\n")
                             if line.startswith("data:"))
            with contextlib.suppress(ValueError):
                event = json.loads(data) if data else {}
                if "id" in event and ("result" in event or "error" in event):
                    return dict(event)
        return {"error": {"message": f"HTTP {resp.status}: an SSE answer without a response"}}
    try:
        message = json.loads(raw)
    except ValueError:
        message = {}
    if resp.status >= 400 and "error" not in message:
        return {"error": {"message": f"HTTP {resp.status}: {raw[:80].decode(errors='replace')}"}}
    return dict(message)


def describe(message: dict[str, Any]) -> str:
    """"ok", or the error's message (a tool's isError result: its text)."""
    if "error" in message:
        return " ".join(str(message["error"].get("message")).split())[:110]
    result = message.get("result") or {}
    if result.get("isError"):
        return "isError: " + result["content"][0]["text"][:100]
    return "ok"


async def outcome(resp: aiohttp.ClientResponse) -> str:
    """What a big answer was, read as it streams and thrown away: "ok (N MiB)", or its error."""
    head, total = bytearray(), 0
    try:
        async for chunk in resp.content.iter_chunked(MIB):
            total += len(chunk)
            if len(head) < MIB:
                head += chunk
    except aiohttp.ClientError as exc:
        return f"cut off after {total / MIB:.0f} MiB ({type(exc).__name__})"
    if total > MIB and b'"result"' in head[:4096]:
        return f"ok ({total / MIB:.0f} MiB)"
    if resp.status >= 400 or b'"error"' in head:
        return describe(parse_answer(bytes(head), resp))
    return f"ok ({total / MIB:.1f} MiB)"


def counted(outcomes: list[str]) -> str:
    """Outcomes as "N x what", the most frequent first."""
    return ", ".join(f"{n} × {what}" for what, n in Counter(outcomes).most_common())


# -- the attacks ------------------------------------------------------------------------------

@dataclasses.dataclass
class Run:
    """One attack's run: the gateway's address, Alice's warm session, notes for the table."""

    url: str
    http: dict[str, aiohttp.ClientSession]
    quick: bool
    ports: dict[str, int]
    limits: dict[str, int]
    alice: Principal | None = None
    notes: dict[str, str] = dataclasses.field(default_factory=dict)

    async def session(self, who: str, capabilities: dict[str, Any] | None = None,
                      info: dict[str, Any] | None = None) -> Principal:
        made = Principal(self.http[who], self.url, who)
        said = await made.open(capabilities, info)
        if said != "ok":
            raise SystemExit(f"{who}'s session was refused: {said}")
        return made


async def until(deadline: float) -> None:
    await asyncio.sleep(max(0.0, deadline - time.monotonic()))


async def slow_readers(run: Run) -> str:
    """Item 1: Bob asks for twelve 50 MiB answers at once and reads none for 25 s (his
    client's buffers full: a slow reader), then reads them all. 25 s is `slow_reader_ms`
    less 5 s: the gateway holds what it took of them, and cuts none of them off yet."""
    n, size, hold_s = (3, 8, 1.0) if run.quick else (12, 50, run.limits["slow_reader_ms"]
                                                     / 1000 - 5)
    bob = await run.session("bob")
    deadline = time.monotonic() + hold_s

    async def one() -> str:
        async with bob.post("tools/call", {"name": "blob",
                                           "arguments": {"bytes": size * MIB}}) as resp:
            await asyncio.sleep(deadline - time.monotonic())
            return await outcome(resp)

    return counted(list(await asyncio.gather(*(one() for _ in range(n)))))


async def http_answers(run: Run) -> str:
    """Item 1: an HTTP upstream answers Bob three 200 MiB bodies at once; he reads them."""
    bob = await run.session("bob")

    async def one() -> str:
        async with bob.post("tools/call", {"name": "big", "arguments": {"mib": 200}}) as resp:
            return await outcome(resp)

    return counted(list(await asyncio.gather(*(one() for _ in range(3)))))


async def new_session(run: Run, who: str) -> tuple[str, Principal]:
    """A fresh session of `who`'s that asks its server process for its pid (isolation:
    client starts one a session)."""
    made = Principal(run.http[who], run.url, who)
    said = await made.open()
    return (describe(await made.call("whoami", {})) if said == "ok" else said), made


async def isolated_sessions(run: Run) -> str:
    """Item 2, isolation: client: Bob opens 40 sessions at once, each calls its server."""
    opened = await asyncio.gather(*(new_session(run, "bob") for _ in range(40)))
    await asyncio.sleep(2)  # held: the probe sees them all
    return counted([said for said, _ in opened])


async def isolated_calls(run: Run) -> str:
    """Item 2, isolation: call: Bob's 40 calls of 3 s in flight at once on one session."""
    bob = await run.session("bob")
    replies = await asyncio.gather(*(bob.call("sleep", {"ms": 3000}) for _ in range(40)))
    return counted([describe(r) for r in replies])


async def huge_initializes(run: Run) -> str:
    """Item 3: 60 legacy sessions of Bob's, each initialize carrying a 3 MiB clientInfo
    (a description: what the gateway does not read), one after the other, all kept open."""
    info = {"name": "bob", "version": "1", "description": "x" * (3 * MIB)}
    said = [await Principal(run.http["bob"], run.url, "bob").open(info=info)
            for _ in range(60)]
    return counted(said)


TERMINAL = ("completed", "failed", "cancelled")


async def task_of(who: Principal, name: str, arguments: dict[str, Any]) -> str:
    """A core task (2025-11-25) of the tool, polled to its end and not read: "ok" when it
    completed, else why not."""
    created = await who.request("tools/call", {"name": name, "arguments": arguments,
                                               "task": {}})
    if "result" not in created:
        return describe(created)
    task = created["result"]["task"]
    for _ in range(600):
        if task["status"] in TERMINAL:
            break
        await asyncio.sleep(0.2)
        got = await who.request("tasks/get", {"taskId": task["taskId"]})
        if "result" not in got:
            return describe(got)
        task = got["result"]
    if task["status"] == "completed":
        return "ok"
    return f"{task['status']}: {' '.join(str(task.get('statusMessage')).split())[:100]}"


async def stored_results(run: Run) -> str:
    """Item 4: on a Redis store Bob keeps results he never reads (four tasks at a time): 36
    of 8 MiB, then 20 of 512 KiB to fill what room is left, as an attacker filling the
    store would; what Redis holds grows by what the store let him keep."""
    store = aioredis.Redis(port=run.ports["redis"])
    before = (await store.info("memory"))["used_memory"]
    bob = await run.session("bob")
    four = asyncio.Semaphore(4)

    async def one(size: int) -> str:
        async with four:
            said = await task_of(bob, "blob", {"bytes": size})
            return f"ok ({mib(size)})" if said == "ok" else said

    said = [*await asyncio.gather(*(one(8 * MIB) for _ in range(36))),
            *await asyncio.gather(*(one(MIB // 2) for _ in range(20)))]
    grown = ((await store.info("memory"))["used_memory"] - before) / MIB
    await store.aclose()
    run.notes["memory"] = f"; Redis +{grown:.0f} MiB"
    return counted(said)


async def borrowed_task(run: Run) -> str:
    """Item 6: Alice runs a task of the server's own (BASIC_TASKS); Bob's plain `ask` names
    it in its related-task _meta. The server labels its elicitation with that task: does
    the gateway ask Alice Bob's question, and does her answer become Bob's result?"""
    if run.alice is None:
        raise SystemExit("Alice has no session")
    created = await run.alice.request("tools/call", {
        "name": "sleep", "arguments": {"ms": 60_000}, "task": {}})
    hers = created["result"]["task"]["taskId"]
    bob = await run.session("bob", {"elicitation": {}})
    async with run.alice.http.get(run.url, headers=run.alice.headers(
            Accept="text/event-stream")) as stream:
        heard = asyncio.create_task(answer_questions(run.alice, stream))
        reply = await asyncio.wait_for(bob.call(
            "ask", {"message": "Bob asks: your card number?"}, {RELATED: {"taskId": hers}}), 30)
        await asyncio.sleep(0.5)
        heard.cancel()
        questions = await asyncio.gather(heard, return_exceptions=True)
    await run.alice.request("tasks/cancel", {"taskId": hers})
    asked = questions[0] if isinstance(questions[0], list) else []
    run.notes["alice"] = ("; asked " + ", ".join(f'"{q}"' for q in asked) + " on her stream"
                          if asked else "; heard nothing of Bob's")
    return what_bob_heard(reply)


def what_bob_heard(reply: dict[str, Any]) -> str:
    """Bob's `ask` answers with what his question was answered (the tool's text: the
    elicitation's result, or the error the gateway answered the server)."""
    if "result" not in reply:
        return describe(reply)
    text = reply["result"]["content"][0]["text"]
    if "4111" in text:
        return f"Alice's answer as his result: {text}"
    with contextlib.suppress(ValueError, TypeError, KeyError):
        text = json.loads(text)["message"]
    return "his question was refused: " + " ".join(str(text).split())[:100]


async def answer_questions(alice: Principal, stream: aiohttp.ClientResponse) -> list[str]:
    """Alice's GET stream: every elicitation it brings is answered with her card number."""
    asked: list[str] = []
    data: list[str] = []
    try:
        while line := (await stream.content.readline()).decode():
            if line.startswith("data:"):
                data.append(line[5:].strip())
                continue
            if line != "\n" or not any(data):
                continue
            event, data = json.loads("\n".join(data)), []
            if event.get("method") == "elicitation/create":
                asked.append(event["params"]["message"])
                async with alice.http.post(alice.url, headers=alice.headers(), json={
                        "jsonrpc": "2.0", "id": event["id"], "result": {
                            "action": "accept", "content": {"name": "Alice's card 4111"}}}):
                    pass
    except asyncio.CancelledError:
        pass
    return asked


# -- Alice, during each flood ---------------------------------------------------------------

async def alice_calls(run: Run, name: str, arguments: dict[str, Any]) -> str:
    if run.alice is None:
        raise SystemExit("Alice has no session")
    return describe(await run.alice.call(name, arguments))


async def alice_sessions(run: Run) -> str:
    """A session of Alice's own (isolation: client, its own process), one call, closed."""
    said, made = await new_session(run, "alice")
    if made.session_id:
        await made.close()
    return said


async def alice_tasks(run: Run) -> str:
    if run.alice is None:
        raise SystemExit("Alice has no session")
    return await task_of(run.alice, "blob", {"bytes": MIB})


class AliceLoop:
    """Alice's calls, one after another (a quarter second apart) from the flood's start to
    her first call begun after it ended: what each said and how long it took."""

    def __init__(self, call: Callable[[], Awaitable[str]]) -> None:
        self.call = call
        self.seen: list[tuple[str, float]] = []
        self.stopping = asyncio.Event()
        self.task = asyncio.create_task(self.loop())

    async def loop(self) -> None:
        while True:
            last = self.stopping.is_set()
            began = time.monotonic()
            try:
                said = await asyncio.wait_for(self.call(), 60)
            except TimeoutError:
                said = "no answer within 60 s"
            except aiohttp.ClientError as exc:
                said = type(exc).__name__
            self.seen.append((said, time.monotonic() - began))
            if last:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), 0.25)

    async def finish(self) -> str:
        self.stopping.set()
        await self.task
        seconds = [s for _, s in self.seen]
        ok = sum(said == "ok" for said, _ in self.seen)
        failed = [said for said, _ in self.seen if said != "ok"]
        return (f"{ok}/{len(self.seen)} answered, p50 {statistics.median(seconds):.2f} s, "
                f"max {max(seconds):.2f} s" + (f"; {counted(failed)}" if failed else ""))


# -- the table ----------------------------------------------------------------------------------

def mib(n: float) -> str:
    return f"{n / MIB:.0f} MiB" if n >= MIB else f"{n / 1024:.0f} KiB"


def budget(limits: dict[str, int], share: str, overall: str, unit: Callable[[float], str]
           ) -> str:
    if share not in limits:
        return f"none ({share} is not a setting here)"
    return f"{share} {unit(limits[share])} (overall {unit(limits[overall])})"


def answers_budget(limits: dict[str, int]) -> str:
    return budget(limits, "max_inflight_bytes_per_principal", "max_inflight_bytes", mib)


def message_budget(limits: dict[str, int]) -> str:
    return f"max_message_bytes {mib(limits['max_message_bytes'])} an answer"


def process_budget(limits: dict[str, int]) -> str:
    return budget(limits, "max_processes_per_principal", "max_processes", lambda n: f"{n:.0f}")


def session_budget(limits: dict[str, int]) -> str:
    record = limits.get("session_record_bytes")
    kept = f"{mib(record)} kept a session (resume.MAX_RECORD_BYTES)" if record else "none"
    return f"{kept}; max_body_bytes {mib(limits['max_body_bytes'])} a request"


def stored_budget(limits: dict[str, int]) -> str:
    return budget(limits, "max_stored_bytes_per_principal", "max_stored_bytes", mib)


def no_budget(limits: dict[str, int]) -> str:
    return "-"


Budget = Callable[[dict[str, int]], str]


@dataclasses.dataclass(frozen=True)
class Attack:
    key: str
    title: str
    upstream: Callable[[dict[str, int]], dict[str, Any]]  # ports -> the upstream's settings
    flood: Callable[[Run], Awaitable[str]]  # Bob's: what he got
    alice: Callable[[Run], Awaitable[str]]  # one of Alice's calls meanwhile
    memory_budget: Budget
    process_budget: Budget = no_budget
    store: bool = False  # Redis (a redis-server of its own)
    unruly: bool = False  # the upstream is tests/servers/unruly_http.py, run here
    alice_capabilities: tuple[tuple[str, Any], ...] = ()


def stdio(**more: Any) -> Callable[[dict[str, int]], dict[str, Any]]:
    return lambda ports: {"command": BASIC[0], "args": BASIC[1:], **more}


def echo(run: Run) -> Awaitable[str]:
    return alice_calls(run, "echo", {"text": "alice"})


ATTACKS = [
    Attack("1a", "12 concurrent 50 MiB answers, unread 25 s", stdio(),
           slow_readers, echo, answers_budget),
    Attack("1b", "HTTP upstream: three 200 MiB answers",
           lambda ports: {"url": f"http://127.0.0.1:{ports['unruly']}/mcp"}, http_answers,
           lambda run: alice_calls(run, "pretty", {}), message_budget, unruly=True),
    Attack("2a", "isolation client: 40 sessions", stdio(isolation="client"),
           isolated_sessions, alice_sessions, no_budget, process_budget),
    Attack("2b", "isolation call: 40 calls of 3 s", stdio(isolation="call"), isolated_calls,
           echo, no_budget, process_budget),
    Attack("3", "60 sessions, 3 MiB initialize each", stdio(), huge_initializes, echo,
           session_budget),
    Attack("4", "Redis: 36 unread 8 MiB results, then 20 of 512 KiB", stdio(),
           stored_results, alice_tasks, stored_budget, store=True),
    Attack("6", "Bob names Alice's task (related-task)", stdio(env={"BASIC_TASKS": "1"}),
           borrowed_task, echo, no_budget,
           alice_capabilities=(("elicitation", {}), ("tasks", {}))),
]
HEADER = ("| attack | gateway peak RSS growth | its budget | server processes idle → peak "
          "(their RSS) | its budget | Bob got | Alice got |\n|---|---|---|---|---|---|---|")


def escaped(cell: str) -> str:
    return cell.replace("|", "\\|")


async def attack_row(attack: Attack, tree: Path, limits: dict[str, int], quick: bool,
                     log: Path | None) -> dict[str, Any]:
    """One attack on a gateway of its own: the table's row, and its figures."""
    ports = {"unruly": free_port(), "redis": free_port()}
    conf: dict[str, Any] = {"upstreams": {"main": attack.upstream(ports)}}
    with contextlib.ExitStack() as sides:
        if attack.unruly:
            sides.enter_context(side_server([*UNRULY, str(ports["unruly"]), "legacy"],
                                            ports["unruly"]))
        if attack.store:
            sides.enter_context(redis_server(ports["redis"]))
            conf |= {"store": {"backend": "redis",
                               "url": f"redis://127.0.0.1:{ports['redis']}/0"},
                     "replica": {"secret": "the flood bench's replica secret"}}
        async with gateway(tree, conf, log) as (origin, probe), clients() as http:
            run = Run(origin + "/mcp", http, quick, ports, limits)
            run.alice = await run.session("alice", dict(attack.alice_capabilities))
            await attack.alice(run)  # warm: what a first call costs is not the flood's
            await asyncio.sleep(0.5)
            probe.idle()
            alice = AliceLoop(lambda: attack.alice(run))
            try:
                bob = await attack.flood(run)
            finally:
                alices = await alice.finish()
            probe.sample()
            growth = probe.growth()
    figures = {"attack": attack.key, "title": attack.title, "growth_mib": round(growth, 1),
               "processes_idle": probe.idle_children, "processes_peak": probe.peak_children,
               "processes_rss_mib": round(probe.peak_children_rss), "bob": bob,
               "alice": alices + run.notes.get("alice", ""),
               "pids": [probe.pid, *probe.seen]}  # all stopped by now
    title = attack.title + (" (--quick: smaller)" if quick else "")
    cells = [f"{attack.key}: {title}",
             f"+{growth:.0f} MiB{run.notes.get('memory', '')}", attack.memory_budget(limits),
             f"{probe.idle_children} → {probe.peak_children} "
             f"({probe.peak_children_rss:.0f} MiB)", attack.process_budget(limits), bob,
             figures["alice"]]
    figures["row"] = "| " + " | ".join(escaped(c) for c in cells) + " |"
    return figures


@contextlib.asynccontextmanager
async def clients() -> AsyncIterator[dict[str, aiohttp.ClientSession]]:
    """Alice's and Bob's HTTP clients (no pool limit: a flood is many connections)."""
    timeout = aiohttp.ClientTimeout(total=180)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=timeout) as alice, \
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                  timeout=timeout) as bob:
        yield {"alice": alice, "bob": bob}


def host(tree: Path) -> str:
    """The machine and the checkout measured."""
    total = next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                 if line.startswith("MemTotal"))
    python = subprocess.run([gateway_python(tree), "--version"], capture_output=True,
                            text=True).stdout.strip()
    commit = subprocess.run(["git", "-C", str(tree), "log", "-1", "--format=%h %cs"],
                            capture_output=True, text=True).stdout.strip()
    return (f"host: {os.cpu_count()} cores, {int(total) / MIB:.1f} GiB, {platform.system()} "
            f"{platform.release()}; gateway {python} from {tree} at {commit or '?'}")


async def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--gateway-dir", type=Path,
                    default=Path(os.environ.get("PROJECT_DIR") or ROOT),
                    help="the checkout whose gateway is measured (default: $PROJECT_DIR or "
                         "this one)")
    ap.add_argument("--attacks", help="a comma-separated subset of "
                    + ",".join(a.key for a in ATTACKS))
    ap.add_argument("--quick", action="store_true", help="attack 1a alone, small")
    ap.add_argument("--json", type=Path, help="also write the figures to this file")
    ap.add_argument("--log", type=Path, help="append the gateways' output to this file")
    args = ap.parse_args()
    keys = args.attacks.split(",") if args.attacks else ["1a"] if args.quick else None
    chosen = [a for a in ATTACKS if keys is None or a.key in keys]
    tree = args.gateway_dir.resolve()
    limits, rows = limits_of(tree), []
    print(host(tree), flush=True)
    for attack in chosen:
        began = time.monotonic()
        rows.append(await attack_row(attack, tree, limits, args.quick, args.log))
        print(f"  {attack.key} done in {time.monotonic() - began:.0f} s", file=sys.stderr,
              flush=True)
    print(HEADER)
    for row in rows:
        print(row["row"])
    if args.json:
        args.json.write_text(json.dumps({"host": host(tree), "limits": limits, "rows": rows},
                                        indent=1))


if __name__ == "__main__":
    asyncio.run(main())
