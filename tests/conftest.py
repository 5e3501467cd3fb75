"""Shared fixtures: an in-process gateway on real loopback HTTP in front of real subprocess
servers, and the raw client of `mcp_http`."""

from __future__ import annotations

import asyncio
import contextlib
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
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from mcp_http import BASIC, McpHttp

from gateway.app import create_app
from gateway.settings.load import from_mapping

NODE_BIN = Path(__file__).parent / "node" / "node_modules" / ".bin"
MCP130 = Path(__file__).parents[1] / ".test-envs" / "mcp130" / "bin" / "python"

Factory = Callable[..., Awaitable[str]]


def node_env() -> dict[str, str]:
    """PATH with the Node 22 and tools that scripts/test.sh installs under tests/node first."""
    if not (NODE_BIN / "node").exists():
        pytest.fail("Node test tools are missing: run scripts/test.sh (it runs npm ci in "
                    "tests/node)")
    return {**os.environ, "PATH": f"{NODE_BIN}{os.pathsep}{os.environ['PATH']}"}


def settings_for(command: list[str] | None = None, url: str | None = None,
                 **overrides: Any) -> dict[str, Any]:
    command = command or BASIC
    target = {"url": url} if url else {"command": command[0], "args": command[1:]}
    upstream = {**target, **overrides.pop("upstream", {})}
    return {"upstreams": {"main": upstream}, "logging": {"level": "warning"}, **overrides}


@pytest.fixture
async def gateway(aiohttp_server: Any) -> Factory:
    """Start a gateway; returns its MCP URL once every upstream is ready."""

    async def start(command: list[str] | None = None, wait_ready: bool = True,
                    url: str | None = None, **overrides: Any) -> str:
        tracing = overrides.pop("tracing", None)
        raw = overrides.pop("raw", None) or settings_for(command, url, **overrides)
        app = create_app(from_mapping(raw), tracing)
        server = await aiohttp_server(app)  # aiohttp test servers cancel handlers too
        base = str(server.make_url(""))
        if wait_ready:
            await wait_until_ready(base)
        return base + "/mcp"

    return start


async def wait_until_ready(base: str, timeout_s: float = 30) -> None:
    async with aiohttp.ClientSession() as http:
        for _ in range(int(timeout_s * 20)):
            try:
                async with http.get(base.rstrip("/") + "/readyz") as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientConnectionError:
                pass  # not listening yet
            await asyncio.sleep(0.05)
    raise AssertionError("gateway never became ready")


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
def client(http: aiohttp.ClientSession) -> Callable[[str], McpHttp]:
    return lambda url: McpHttp(http, url)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under pytest-xdist (whole modules a worker: --dist loadfile, pyproject.toml), the
    modules with the most `slow` tests first, so that the longest (the image's, the
    conformance suite's, the chaos run) do not start last and keep one worker busy after the
    others are done. A serial run keeps the collection's order."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return
    slow: dict[str, int] = {}
    for item in items:
        module = item.nodeid.split("::")[0]
        slow[module] = slow.get(module, 0) + (item.get_closest_marker("slow") is not None)
    items.sort(key=lambda item: -slow[item.nodeid.split("::")[0]])  # stable: same order within


def loaded_by(code: str, modules: tuple[str, ...]) -> list[str]:
    """Which of `modules` a fresh interpreter has loaded once it ran `code`."""
    probe = (f"import json, sys\n{code}\n"
             f"print(json.dumps(sorted(m for m in {modules!r} if m in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True)
    return list(json.loads(out.stdout.splitlines()[-1]))


def have(tool: str) -> bool:
    return shutil.which(tool) is not None


FIXTURE = str(Path(__file__).parent / "servers" / "conformance_server.py")


# The operators' token of `group`'s replicas: with client auth, a loopback peer is no
# operator by being one (issue 41).
GROUP_ADMIN = "group-operator-token"
OPERATOR = {"Authorization": f"Bearer {GROUP_ADMIN}"}


def free_port() -> int:
    """A loopback port nothing listens on. Under pytest-xdist, one from the worker's own
    slice of 20000-32767 (below Linux's ephemeral range, which the kernel's own choices
    take), so that two workers never pick the same port before either binds it."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get(
        "PYTEST_XDIST_WORKER_COUNT")
    if worker is None or count is None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])
    size = (32768 - 20000) // int(count)
    first = 20000 + int(worker.removeprefix("gw")) * size
    for port in random.sample(range(first, first + size), size):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError(f"no free port in {first}-{first + size - 1}")


def serve_fixture(port: int) -> subprocess.Popen[bytes]:
    """The Python SDK fixture server over its own Streamable HTTP on `port`."""
    return subprocess.Popen([sys.executable, FIXTURE, "http", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@contextlib.asynccontextmanager
async def served(argv: list[str], port: int, env: dict[str, str] | None = None
                 ) -> AsyncIterator[str]:
    """A server process listening on `port` for the block; yields its base URL."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=env)
    try:
        await listening(port)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait(10)


async def listening(port: int) -> None:
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), 0.1).close()
            return
        except OSError:
            await asyncio.sleep(0.05)
    raise AssertionError(f"nothing listens on port {port}")


@pytest.fixture
async def direct_url() -> AsyncIterator[str]:
    """The fixture server reached directly: the baseline of parity tests."""
    port = free_port()
    proc = serve_fixture(port)
    try:
        await listening(port)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        stop(proc)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL for a server still draining streams 10 s later (a gateway
    that outlives the server may hold one open)."""
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


class RedisServer:
    """A real Redis-compatible server (Valkey's or Debian's redis-server, which
    scripts/test.sh installs) on a free loopback port, keeping nothing on disk; it can be
    stopped and started again on the same port."""

    def __init__(self, keep_in: str | None = None) -> None:
        self.port = free_port()
        self.keep_in = keep_in  # a folder: what it holds survives a restart (append-only file)
        self.scratch: str | None = None
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, extra: list[str] | None = None) -> None:
        binary = shutil.which("valkey-server") or shutil.which("redis-server")
        if binary is None:
            pytest.fail("no redis-server or valkey-server: run scripts/test.sh")
        if self.keep_in is None:
            # A folder of its own at each start, never the shared temp dir: a replica's sync
            # writes dump.rdb there, and a server loads any dump.rdb it finds at start (so
            # it started with another run's records, and did not restart empty).
            self.scratch = tempfile.mkdtemp(prefix="redis-test-")
        keep = ["--appendonly", "no", "--dir", self.scratch] if self.keep_in is None else [
            "--appendonly", "yes", "--appendfsync", "always", "--dir", self.keep_in]
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", *keep,
             *(extra or [])],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.1).close()
                return
            except OSError:
                self.proc.poll()
                if self.proc.returncode is not None:
                    break
                time.sleep(0.05)
        raise AssertionError(f"the Redis server on port {self.port} did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One server for the session; each test keeps to its own key prefix."""
    server = RedisServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def key_prefix() -> str:
    return f"test-{uuid.uuid4().hex[:12]}:"


ROOT = Path(__file__).parents[1]
# The task policy of replica groups (test_tasks.POLICY's, unless a test gives its own).
REPLICA_POLICY = {"defaults": {"mode": "auto", "sync_budget_ms": 200, "ttl_ms": 60_000,
                               "poll_interval_ms": 700},
                  "tools": {"echo": {"mode": "never"}, "ask": {"mode": "always"}}}


class Replica:
    """One gateway process of the group."""

    def __init__(self, name: str, conf: dict[str, Any], address: bool = True) -> None:
        self.name = name
        self.port = free_port()
        # Without `address`, replica.url is left to its default: the bind address.
        where = {"url": f"http://127.0.0.1:{self.port}"} if address else {}
        conf = {**conf, "listen": {"host": "127.0.0.1", "port": self.port}, "replica": {
            "id": name, "secret": "a secret every replica shares", **where}}
        fd, self.config = tempfile.mkstemp(suffix=".yaml")
        with os.fdopen(fd, "w") as f:
            json.dump(conf, f)  # JSON is YAML
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    async def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "--config", self.config], cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        await wait_until_ready(self.url.removesuffix("/mcp"))

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None:
            self.proc.send_signal(sig)
            self.proc.wait(15)
            self.proc = None


Group = Callable[..., Any]


@pytest.fixture
async def group(redis_server, key_prefix) -> AsyncIterator[Group]:
    """`await group(n, **overrides)`: n replicas sharing the store, started."""
    made: list[Replica] = []

    async def start(n: int = 3, redis: RedisServer | None = None, address: bool = True,
                    **overrides: Any) -> list[Replica]:
        conf = {"upstreams": {"main": {"command": BASIC[0], "args": BASIC[1:]}},
                "tasks": REPLICA_POLICY, "auth": {"bearer_tokens": ["alice-token", "bob-token"],
                                                  "admin_tokens": [GROUP_ADMIN]},
                "store": {"backend": "redis", "url": (redis or redis_server).url,
                          "key_prefix": key_prefix, "lease_ms": 1000},
                "logging": {"level": "warning"}, **overrides}
        replicas = [Replica(f"r{i}", conf, address) for i in range(n)]
        made.extend(replicas)
        await asyncio.gather(*(r.start() for r in replicas))
        return replicas

    yield start
    for replica in made:
        replica.stop(signal.SIGKILL)
        os.unlink(replica.config)
