"""Supervision: an upstream that crashes, hangs or never starts gets a clear error, never a
hang; it is restarted; shutdown leaves no process behind."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import aiohttp
import structlog
from conftest import free_port, wait_until_ready
from mcp_http import BASIC, McpHttp, text_of
from test_modern import call, modern


async def readyz(http: aiohttp.ClientSession, url: str) -> tuple[int, dict]:
    async with http.get(url.replace("/mcp", "/readyz?detail")) as resp:
        return resp.status, await resp.json()


async def test_crash_mid_call_fails_the_call_then_restarts(gateway, client, http) -> None:
    url = await gateway()
    mcp = client(url)
    await mcp.initialize()
    pid_before = text_of(await mcp.call("whoami"))
    slow = asyncio.create_task(mcp.call("sleep", {"ms": 10_000}))
    await asyncio.sleep(0.2)
    crashed = await asyncio.wait_for(mcp.call("crash"), 5)
    error = crashed.message["error"]
    assert "exited (code 3)" in error["message"]
    _, body = await readyz(http, url)
    assert body["counters"]["upstream.exits"] >= 1
    assert error["data"] == {"upstream": "main", "reason": "exited", "exitCode": 3}
    other = (await asyncio.wait_for(slow, 5)).message["error"]  # the bystander fails too
    assert other["data"]["reason"] == "exited"
    await wait_until_ready(url.removesuffix("/mcp"))
    _, body = await readyz(http, url)
    assert body["upstreams"]["main"]["restarts"] == 1
    assert text_of(await mcp.call("whoami")) != pid_before  # same session, new process


async def test_a_restarted_server_is_told_its_subscriptions_again(gateway, client,
                                                                    http) -> None:
    url = await gateway()
    mcp = client(url)
    await mcp.initialize()
    await mcp.send({"jsonrpc": "2.0", "id": 1, "method": "resources/subscribe",
                    "params": {"uri": "test://a"}})
    assert json.loads(text_of(await mcp.call("subscribed"))) == ["test://a"]
    await asyncio.wait_for(mcp.call("crash"), 5)
    await wait_until_ready(url.removesuffix("/mcp"))
    assert json.loads(text_of(await mcp.call("subscribed"))) == ["test://a"]


async def test_malformed_upstream_lines_are_dropped_alone(gateway, client) -> None:
    """Issue 11: a server's malformed lines, in the same read as a real answer, are logged
    and dropped; the answer still reaches its call, and the link keeps serving."""
    url = await gateway()
    mcp = client(url)
    await mcp.initialize({"roots": {}})
    reply = await asyncio.wait_for(mcp.call("garble"), 5)
    assert text_of(reply) == "answered after garbage"
    assert text_of(await mcp.call("echo", {"text": "still here"})) == "still here"


async def test_hanging_call_times_out_and_is_cancelled_upstream(gateway, client, http) -> None:
    url = await gateway(upstream={"request_timeout_ms": 300})
    mcp = client(url)
    await mcp.initialize()
    reply = await asyncio.wait_for(mcp.call("hang"), 5)
    assert reply.message["error"]["data"]["reason"] == "timeout"
    assert "0.3 s" in reply.message["error"]["message"]
    cancelled = await mcp.call("cancelled")
    assert len(json.loads(text_of(cancelled))) == 1  # the upstream was told to stop
    modern_reply = await asyncio.wait_for(modern(http, url, "tools/call", {
        "name": "hang", "arguments": {}}), 5)  # the same limit for modern clients
    assert modern_reply.body["error"]["data"]["reason"] == "timeout"
    assert len(json.loads(text_of(await mcp.call("cancelled")))) == 2


async def test_upstream_that_never_initializes(gateway, client, http) -> None:
    command = ["env", "BASIC_SILENT_INIT=1", *BASIC]
    url = await gateway(command, wait_ready=False, upstream={"startup_timeout_ms": 300})
    status, body = await readyz(http, url)
    assert status == 503 and body["ready"] is False
    mcp = client(url)
    reply = await mcp.send({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"}}})
    assert reply.status == 503
    assert "not ready" in reply.body["error"]["message"]


async def test_misspelt_command_is_named_at_once_and_retried_with_backoff(gateway, client,
                                                                         http) -> None:
    """The client's error and the log say which command was not found, without waiting for
    the startup timeout (30 s by default); each attempt is one log line, spaced out more and
    more."""
    with structlog.testing.capture_logs() as events:
        url = await gateway(["mcp-servr-misspelt"], wait_ready=False)
        await asyncio.sleep(0.5)
        status, body = await readyz(http, url)
        began = time.monotonic()
        reply = await client(url).send({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                                        "params": {"protocolVersion": "2025-06-18",
                                                   "capabilities": {}, "clientInfo": {}}})
        waited = time.monotonic() - began
    assert status == 503 and body["upstreams"]["main"]["state"] in ("backoff", "starting")
    assert reply.status == 503 and waited < 5
    text = reply.body["error"]["message"]
    assert "command 'mcp-servr-misspelt' was not found" in text and "None" not in text
    failed = [e for e in events if e["event"] == "upstream.start_failed"]
    assert 2 <= len(failed) <= 6
    assert all("'mcp-servr-misspelt' was not found" in e["error"] for e in failed)
    delays = [e["retry_in_s"] for e in failed]
    assert delays == sorted(delays) and delays[-1] >= 2 * delays[0]
    assert not [e for e in events if e["event"] == "upstream.restarting"]  # one line each


async def test_wrong_upstream_url_is_one_line_an_attempt_with_backoff(gateway, client) -> None:
    with structlog.testing.capture_logs() as events:
        url = await gateway(url="http://user:pw@127.0.0.1:9/mcp", wait_ready=False)
        await asyncio.sleep(2.5)
        reply = await client(url).send({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                                        "params": {"protocolVersion": "2025-06-18",
                                                   "capabilities": {}, "clientInfo": {}}})
    assert reply.status == 503
    assert reply.body["error"]["message"] == "upstream 'main' cannot be reached: Connection refused"
    failed = [e for e in events if e["event"] == "upstream.start_failed"]
    assert not [e for e in failed if "ssl:default" in e["error"]]  # issue 21: http:// has none
    assert 2 <= len(failed) <= 5, failed
    assert {e["url"] for e in failed} == {"http://127.0.0.1:9/mcp"}  # never the password
    assert [e["attempt"] for e in failed] == list(range(1, len(failed) + 1))
    delays = [e["retry_in_s"] for e in failed]
    assert delays == [min(10.0, 0.1 * 2 ** n) for n in range(len(failed))]
    # No line per handshake request on top of the one per attempt.
    assert not [e for e in events if e["event"] == "upstream.request_failed"]
    assert "pw" not in repr(events)


async def test_crash_looping_upstream_backs_off(gateway, http) -> None:
    url = await gateway(["env", "BASIC_EXIT_AT_START=1", *BASIC], wait_ready=False,
                        upstream={"restart_backoff_max_ms": 200})
    await asyncio.sleep(1.5)
    status, body = await readyz(http, url)
    state = body["upstreams"]["main"]
    assert status == 503
    assert 2 <= state["restarts"] <= 15  # restarted, but not in a hot loop


async def test_an_upstream_that_exits_at_start_says_why(gateway, client, http) -> None:
    """Issue 21: its exit code reaches waiting clients (both eras: 503, as nothing was
    sent); its last lines on stderr reach the log only (issue 30)."""
    with structlog.testing.capture_logs() as events:
        url = await gateway(["env", "BASIC_EXIT_AT_START=3", *BASIC], wait_ready=False,
                            upstream={"restart_backoff_max_ms": 200})
        legacy = client(url)
        init = await legacy.send({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"}}})
        modern = await call(http, url, "echo", {"text": "hi"}, caps={})
    for reply in (init, modern):
        assert reply.status == 503, reply.body
        error = reply.body["error"]
        assert "exited during initialize (code 3); see the gateway's log" in error["message"]
        # What it printed may be a secret: the operator's log has it, no client does.
        assert "API key" not in json.dumps(reply.body)
        assert error["data"] == {"upstream": "main", "reason": "initialize", "exitCode": 3}
    logged = [e for e in events if e["event"] == "upstream.start_failed"]
    assert logged and "no API key given" in logged[0]["said"]


async def test_an_upstream_lost_and_unable_to_start_again_is_a_503(gateway, client, http,
                                                                   tmp_path) -> None:
    """Ready once, then lost for good: a legacy initialize and a modern call answer 503 with
    the JSON-RPC error of an upstream that cannot start, never a 500; the failed initialize
    holds none of its principal's share of sessions (one here), so once the server starts
    again the next one is a session."""
    down, pids = tmp_path / "down", tmp_path / "pids"
    # Unable to start: it exits with code 3 before it reads anything (tests/servers/basic.py).
    script = (f'[ -e "{down}" ] && export BASIC_EXIT_AT_START=3 || echo $$ >> "{pids}"; '
              f'exec "{BASIC[0]}" "{BASIC[1]}"')
    url = await gateway(["sh", "-c", script], upstream={"restart_backoff_max_ms": 200,
                                                       "era": "legacy"},
                        limits={"max_sessions_per_principal": 1})
    down.touch()
    os.kill(int(pids.read_text()), signal.SIGKILL)
    for _ in range(200):  # until the gateway has seen it go
        if (await readyz(http, url))[0] == 503:
            break
        await asyncio.sleep(0.05)
    for _ in range(3):  # while it restarts, and while it backs off after failing to
        init = await client(url).send({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                                       "params": {"protocolVersion": "2025-06-18",
                                                  "capabilities": {}, "clientInfo": {}}})
        bridged = await call(http, url, "echo", {"text": "hi"}, caps={})
        for reply in (init, bridged):
            assert reply.status == 503, reply.body
            assert reply.body["error"]["data"] == {"upstream": "main", "reason": "initialize",
                                                   "exitCode": 3}
    down.unlink()
    await wait_until_ready(url.removesuffix("/mcp"))
    legacy = client(url)
    await legacy.initialize()
    assert text_of(await legacy.call("echo", {"text": "back"})) == "back"


async def test_hundred_concurrent_slow_calls_overlap(gateway, client) -> None:
    mcp = client(await gateway())
    await mcp.initialize()
    began = time.monotonic()
    replies = await asyncio.gather(*(mcp.call("sleep", {"ms": 1000}) for _ in range(100)))
    assert [text_of(r) for r in replies] == ["slept 1000"] * 100
    assert time.monotonic() - began < 10  # one after another would take 100 s


async def test_sigterm_stops_cleanly_with_no_orphans(http) -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gateway", "--port", str(port), "--",
                             *BASIC], stderr=subprocess.PIPE)
    try:
        await wait_until_ready(f"http://127.0.0.1:{port}")
        status, _ = await readyz(http, f"http://127.0.0.1:{port}/mcp")
        assert status == 200
        upstream_pids = _descendants(proc.pid)
        assert upstream_pids, "the upstream process should be running"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
        stderr = proc.stderr.read().decode()
        assert "gateway.stopped" in stderr
        for pid in upstream_pids:
            assert not _alive(pid), f"upstream {pid} outlived the gateway"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()


async def test_sigterm_answers_calls_in_flight_then_stops_in_stages(http) -> None:
    """Issue 11, with issue 48's drain: on SIGTERM, calls in flight run on for
    `shutdown.drain_ms`, then get a JSON-RPC error saying the gateway is stopping (not a
    dropped connection), a running task ends failed, the upstream process ends, all within
    docker stop's 10 seconds; each stage is logged."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gateway", "--port", str(port),
                             "--drain-ms", "1000", "--", *BASIC], stderr=subprocess.PIPE)
    try:
        await wait_until_ready(f"http://127.0.0.1:{port}")
        mcp = McpHttp(http, f"http://127.0.0.1:{port}/mcp")
        await mcp.initialize(version="2025-11-25")
        slow = asyncio.create_task(mcp.call("sleep", {"ms": 30_000}))
        task = await mcp.send({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {
            "name": "sleep", "arguments": {"ms": 30_000}, "task": {}}})
        assert task.body["result"]["task"]["status"] == "working"
        await asyncio.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        answer = (await asyncio.wait_for(slow, 10)).message["error"]
        assert answer["message"] == "the gateway is stopping"
        assert answer["data"] == {"upstream": "main", "reason": "shutdown"}
        assert proc.wait(10) == 0
        events = [json.loads(line)["event"] for line in proc.stderr.read().splitlines()
                  if line.startswith(b"{")]
        stages = [e for e in events if e.startswith("shutdown.") or e == "gateway.stopped"]
        assert stages == ["shutdown.draining", "shutdown.drained",
                          "shutdown.accepting_stopped", "shutdown.calls_answered",
                          "shutdown.tasks_ended", "shutdown.streams_closed",
                          "shutdown.upstreams_stopped", "gateway.stopped"]
        assert "task.failed" in events
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()


def _descendants(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    kids = [int(p) for p in out.split()]
    return kids + [g for k in kids for g in _descendants(k)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split()[2] != "Z"


async def test_roots_asked_before_any_client_are_answered_quietly(gateway, client) -> None:
    """A server that asks for roots as soon as it is initialized (server-everything does, at
    every start) gets an empty list, and nothing alarming is logged."""
    with structlog.testing.capture_logs() as events:
        url = await gateway(["env", "BASIC_ROOTS_AT_START=1", *BASIC])
        mcp = client(url)
        await mcp.initialize()
        reply = await mcp.call("startup")
    assert json.loads(text_of(reply)) == [{"roots": []}]
    assert not [e for e in events if e["log_level"] in ("warning", "error", "info")
                and "unroutable" in e["event"]]


def test_a_port_in_use_is_one_line_and_no_false_listening(tmp_path) -> None:
    """Issue 51: a port another process holds ended in a Python traceback, after a
    `gateway.listening` line that was not true. Now: one line on stderr, exit 1, and the
    log says it failed to listen, never that it listens."""
    import socket
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        done = subprocess.run(
            [sys.executable, "-m", "gateway", "--port", str(port), "--", *BASIC],
            capture_output=True, text=True, timeout=60,
            env={**os.environ, "PYTHONPATH": os.getcwd()})
    finally:
        holder.close()
    assert done.returncode == 1
    said = [line for line in done.stderr.splitlines() if line.startswith("mcp-task-gateway:")]
    assert said == [f"mcp-task-gateway: cannot listen on 127.0.0.1:{port}: address already "
                    "in use (--port, or listen.port in the config, picks another)"]
    assert "Traceback" not in done.stderr + done.stdout
    events = [json.loads(line)["event"] for line in (done.stdout + done.stderr).splitlines()
              if line.startswith("{")]
    assert "gateway.listen_failed" in events and "gateway.listening" not in events
