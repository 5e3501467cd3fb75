"""Every command the README and the docs/ pages show is run: here, from a fresh production
install (`pip install .` into a new virtual environment, as the set-up line does), against
server-everything through npx as a user runs it; the test command by CI itself; the
container lines by tests/e2e/test_image.py (with podman); the worked examples by
tests/e2e/test_docs.py. A line that no test knows fails
`test_every_readme_command_is_known`."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from conftest import free_port, node_env, wait_until_ready
from test_modern import modern
from test_tasks import TASKS

ROOT = Path(__file__).parents[2]
EVERYTHING = "@modelcontextprotocol/server-everything@2026.8.31"  # as pinned in README
# README's text moved to docs/ pages (issue 42): its commands are held wherever they went.
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
README = "\n".join(page.read_text() for page in PAGES)
# Lines with placeholders (FILE, COMMAND, my_server) show a form, not a command to run.
SYNOPSIS = re.compile(r"\b(FILE|COMMAND|URL|my_server)\b|\[--")
RUN_HERE = {  # README command -> what this module runs for it
    "python3 -m venv .venv && .venv/bin/pip install . && .venv/bin/mcp-task-gateway "
    "--config config/gateway.yaml": "test_the_set_up_command_serves_server_everything",
    "mcp-task-gateway -- npx -y @modelcontextprotocol/server-everything@2026.8.31":
        "test_the_set_up_command_serves_server_everything",
    "mcp-task-gateway --store-url redis://127.0.0.1:6379/0 -- npx -y "
    "@modelcontextprotocol/server-everything@2026.8.31":
        "test_the_set_up_command_serves_server_everything",
}
REPLICAS = ("mcp-task-gateway --port 808$i --replica-id gw-$i --store-url "
            "redis://127.0.0.1:6379/0 \\")
ELSEWHERE = {
    REPLICAS: "test_the_hand_run_replica_set_shares_its_tasks",
    "mcp-task-gateway --config config/oauth.yaml":
        "tests/e2e/test_oauth.py::test_the_readme_oauth_walkthrough",
    "./scripts/test.sh": "CI: .ci/run (tests/test_packaging.py checks it calls this)",
    "./scripts/image.sh": "tests/e2e/test_image.py (the image fixture)",
    'docker run -p 127.0.0.1:8080:8080 -v "$PWD/my.yaml:/etc/mcp-task-gateway/gateway.yaml:ro" '
    "mcp-task-gateway": "tests/e2e/test_image.py (podman run, the same arguments)",
    'docker run -p 127.0.0.1:8080:8080 -e GATEWAY_TOKEN="$(openssl rand -hex 32)" '
    "mcp-task-gateway": "tests/e2e/test_image.py::test_the_default_image_fronts_server_everything"
                        "_via_npx (podman run, a token given)",
    "GATEWAY_URL=http://127.0.0.1:8080/mcp sh docs/examples/tasks-extension.sh":
        "tests/e2e/test_docs.py::test_tasks_extension_with_curl",
    "GATEWAY_URL=http://127.0.0.1:8080/mcp sh docs/examples/core-tasks.sh":
        "tests/e2e/test_docs.py::test_core_tasks_with_curl",
}


def readme_commands() -> list[str]:
    blocks = re.findall(r"(?:^    \S.*\n)+", README, re.M)
    lines = [ln.strip() for b in blocks for ln in b.splitlines()]
    return [ln.split("  #")[0].strip() for ln in lines
            if re.match(r"(python3 |mcp-task-gateway|\./scripts|docker |\S+=\S+ sh )", ln)]


def test_every_readme_command_is_known() -> None:
    commands = readme_commands()
    assert len(commands) >= 8
    for command in commands:
        known = command in RUN_HERE or command in ELSEWHERE or SYNOPSIS.search(command)
        assert known, f"README command no test runs: {command}"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The set-up line's install: `pip install .` into a new virtual environment."""
    venv = tmp_path_factory.mktemp("install") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet",
                    "--disable-pip-version-check", str(ROOT)], check=True, cwd=ROOT,
                   timeout=600)
    return venv / "bin" / "mcp-task-gateway"


@contextlib.asynccontextmanager
async def served(argv: list[str], port: int) -> AsyncIterator[str]:
    # PATH finds the Node tools scripts/test.sh installed, as a user's PATH finds theirs;
    # replicas sharing a store take their secret from GATEWAY_SECRET, as README says.
    env = {**node_env(), "GATEWAY_SECRET": "s" * 64}
    proc = await asyncio.create_subprocess_exec(
        argv[0], "--port", str(port), *argv[1:], cwd=ROOT, env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    try:
        await wait_until_ready(f"http://127.0.0.1:{port}", timeout_s=120)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        await proc.wait()


async def tool_names(http: aiohttp.ClientSession, base: str) -> set[str]:
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {}}
    async with http.post(base + "/mcp", json={
            "jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": meta}},
            headers={"Accept": "application/json, text/event-stream",
                     "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/list"}) as r:
        return {t["name"] for t in (await r.json())["result"]["tools"]}


@pytest.mark.node
@pytest.mark.slow
@pytest.mark.timeout(600)  # the install comes first: some 30 s, more on a cold cache
async def test_the_set_up_command_serves_server_everything(installed, redis_server) -> None:
    forms = [[str(installed), "--config", "config/gateway.yaml"],
             [str(installed), "--", "npx", "-y", EVERYTHING],
             [str(installed), "--store-url", redis_server.url, "--", "npx", "-y",
              EVERYTHING]]
    async with aiohttp.ClientSession() as http:
        for argv in forms:
            async with served(argv, free_port()) as base:
                assert "trigger-long-running-operation" in await tool_names(http, base)
                async with http.get(base + "/readyz?detail") as resp:
                    store = (await resp.json())["store"]
                assert store["backend"] == ("redis" if "--store-url" in argv else "memory")
                assert store["up"] is True


def replica_block() -> str:
    """The hand-run replica set (docs/replicas.md, once README's), as a shell script (its
    redis-server line left to the test's own server)."""
    block = README.split("By hand, three replicas", 1)[1].split("\n\n", 2)[1]
    assert REPLICAS in [ln.strip() for ln in block.splitlines()]
    return "\n".join(ln for ln in block.splitlines() if "redis-server" not in ln)


@pytest.mark.node
@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_the_hand_run_replica_set_shares_its_tasks(redis_server) -> None:
    """The README's loop, ports moved to free ones and the store to the tests' server: three
    replicas whose tasks are one: made on the first, cancelled on the second, read
    cancelled on the third."""
    ports = [free_port() for _ in range(3)]
    script = replica_block().replace("808$i", "${PORTS[$i]}").replace(
        "redis://127.0.0.1:6379/0", redis_server.url)
    script = f"PORTS=(0 {' '.join(map(str, ports))})\n{script}\nwait\n"
    # PATH: the installed command, and the Node tools scripts/test.sh installed.
    env = node_env()
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    proc = await asyncio.create_subprocess_exec(
        "bash", "-c", script, cwd=ROOT, env=env, start_new_session=True,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    try:
        for url in urls:
            await wait_until_ready(url, timeout_s=120)
        assert proc.returncode is None  # every replica started
        async with aiohttp.ClientSession() as http:
            made = (await modern(http, urls[0] + "/mcp", "tools/call", {
                "name": "trigger-long-running-operation",
                "arguments": {"duration": 30, "steps": 3}}, TASKS)).body["result"]
            assert made["resultType"] == "task"
            ack = await modern(http, urls[1] + "/mcp", "tasks/cancel",
                               {"taskId": made["taskId"]}, TASKS)
            assert ack.body["result"] == {"resultType": "complete"}
            read = await modern(http, urls[2] + "/mcp", "tasks/get",
                                {"taskId": made["taskId"]}, TASKS)
            assert read.body["result"]["status"] == "cancelled"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        await proc.wait()
