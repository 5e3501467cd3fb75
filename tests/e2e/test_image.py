"""The container image, built by scripts/image.sh and run with podman as docs/container.md tells:
in front of a mounted stdio server and of server-everything via npx, tasks from both eras,
its HEALTHCHECK, a non-root user, a SIGTERM stop, its config and `${VAR}`s from a mounted
file and the environment, layers that carry neither the build's CA nor a secret; and
deploy/'s compose files under podman-compose: the replica set behind HAProxy, and its
Sentinel variant through a failover of the store.

Skipped only where podman cannot be installed (scripts/test.sh installs it from Debian's
packages). On machines like this one podman needs runc, cgroupfs and explicit ulimits: `engine_env`
writes that containers.conf (docs/container.md)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import resource
import secrets
import shutil
import subprocess
import sys
import tarfile
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from conftest import free_port, wait_until_ready
from mcp_http import McpHttp
from test_core_tasks import as_task, request
from test_core_tasks import wait_for as wait_for_legacy
from test_modern import call
from test_tasks import TASKS, tasks_op, wait_for

ROOT = Path(__file__).parents[2]
TAG = "mcp-task-gateway:test"
TOKEN = "a-test-token-of-at-least-32-characters"  # beyond loopback, shorter ones are refused
ADMIN_TOKEN = "an-operator-token-of-32-characters-or-more"
OPERATOR = {"Authorization": f"Bearer {ADMIN_TOKEN}"}  # GATEWAY_ADMIN_TOKEN of the replicas
HOST_CA = Path(os.environ.get("SSL_CERT_FILE", "/etc/ssl/certs/ca-certificates.crt"))

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(900),  # the first test builds the image
    pytest.mark.skipif(not all(map(shutil.which, ("podman", "runc", "mmdebstrap"))),
                       reason="podman, runc or mmdebstrap is missing (scripts/test.sh "
                              "installs them from Debian's packages where it can)"),
]


@pytest.fixture(scope="session")
def engine_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """podman's settings for a host without systemd and with hybrid cgroups (crun refuses
    them), ulimits it can grant without a capability (nofile up to the host's hard limit)."""
    if "CONTAINERS_CONF" in os.environ:
        return dict(os.environ)
    conf = tmp_path_factory.mktemp("podman") / "containers.conf"
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    conf.write_text(f'[containers]\ndefault_ulimits = ["nofile={nofile}:{nofile}", '
                    '"nproc=32768:32768"]\n[engine]\nruntime = "runc"\n'
                    'cgroup_manager = "cgroupfs"\nevents_logger = "file"\n')
    return {**os.environ, "CONTAINERS_CONF": str(conf)}


@pytest.fixture(scope="session")
def podman(engine_env: dict[str, str]) -> Any:
    def run(*args: str, check: bool = True, timeout: float = 120
            ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(["podman", *args], capture_output=True, text=True,
                              env=engine_env, timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"podman {' '.join(args)}: {done.stderr[-2000:]}")
        return done
    return run


@pytest.fixture(scope="session")
def image(engine_env: dict[str, str]) -> str:
    """Built as docs/container.md says, base images made here (no registry is reachable)."""
    subprocess.run([str(ROOT / "scripts" / "image.sh"), TAG], check=True, timeout=840,
                   env={**engine_env, "CONTAINER_ENGINE": "podman", "BASE_IMAGES": "local"})
    return TAG


class Container:
    def __init__(self, podman: Any, name: str, port: int) -> None:
        self.podman, self.name, self.port = podman, name, port
        self.base = f"http://127.0.0.1:{port}"
        self.url = self.base + "/mcp"

    def exec(self, *argv: str) -> str:
        return str(self.podman("exec", self.name, *argv).stdout)

    def state(self) -> dict[str, Any]:
        state: dict[str, Any] = json.loads(self.podman("inspect", self.name).stdout)[0]["State"]
        return state


@pytest.fixture
def run_image(podman: Any, image: str) -> Iterator[Any]:
    """Starts the image with `args` before it, port `inner` published on loopback."""
    names: list[str] = []

    async def start(*args: str, inner: int = 8080, ready_s: float = 60) -> Container:
        name, port = f"gw-test-{uuid.uuid4().hex[:8]}", free_port()
        names.append(name)
        podman("run", "--detach", "--name", name, "--publish", f"127.0.0.1:{port}:{inner}",
               *args, image)
        box = Container(podman, name, port)
        try:
            await wait_until_ready(box.base, ready_s)
        except AssertionError:
            raise AssertionError(podman("logs", name).stdout[-3000:]) from None
        return box

    yield start
    for name in names:
        podman("rm", "--force", "--time", "0", name, check=False)


@pytest.fixture
async def bearer() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as s:
        yield s


MOUNTED = """\
listen: {host: 0.0.0.0, port: "${GATEWAY_PORT}"}
upstreams:
  main: {command: python, args: ["${SERVER:-/srv/basic.py}"]}
auth: {bearer_tokens: ["${GATEWAY_TOKEN}"]}
tasks:
  defaults: {mode: auto, sync_budget_ms: "${SYNC_BUDGET_MS:-1000}"}
"""


@pytest.fixture
async def mounted(run_image: Any, tmp_path: Path) -> Container:
    """The image in front of tests/servers/basic.py, mounted in, with a mounted config whose
    `${VAR}`s come from the environment (docs/container.md)."""
    (tmp_path / "gateway.yaml").write_text(MOUNTED)
    return await run_image(
        "--volume", f"{ROOT / 'tests/servers/basic.py'}:/srv/basic.py:ro",
        "--volume", f"{tmp_path / 'gateway.yaml'}:/etc/mcp-task-gateway/gateway.yaml:ro",
        "--env", "GATEWAY_PORT=9090", "--env", f"GATEWAY_TOKEN={TOKEN}",
        "--env", "SYNC_BUDGET_MS=200", inner=9090)


async def test_a_mounted_server_answers_tasks_of_both_eras(mounted: Container,
                                                           bearer: aiohttp.ClientSession
                                                           ) -> None:
    async with aiohttp.ClientSession() as anonymous, \
            anonymous.post(mounted.url, json={}) as refused:  # GATEWAY_TOKEN, from -e
        assert refused.status == 401
    # Legacy: core tasks in a session; 200 ms (SYNC_BUDGET_MS) makes a 600 ms call a task.
    legacy = McpHttp(bearer, mounted.url)
    await legacy.initialize({}, version="2025-11-25")
    created = (await as_task(legacy, "sleep", {"ms": 600}))["result"]["task"]
    assert created["status"] == "working"
    await wait_for_legacy(legacy, created["taskId"], "completed")
    result = (await request(legacy, "tasks/result", {"taskId": created["taskId"]}))["result"]
    assert result["content"][0]["text"] == "slept 600"
    # Modern: stateless, the tasks extension.
    handle = (await call(bearer, mounted.url, "sleep", {"ms": 600}, TASKS)).body["result"]
    assert handle["resultType"] == "task"
    done = await wait_for(bearer, mounted.url, handle["taskId"], "completed")
    assert done["result"]["content"][0]["text"] == "slept 600"


async def test_a_replaced_container_keeps_its_finished_tasks_on_its_volume(
        run_image: Any, podman: Any, tmp_path: Path, bearer: aiohttp.ClientSession) -> None:
    """Issue 48: the image's task snapshot on a named volume (docs/container.md): a task
    finished in one container reads completed, with its result, in the next one on that
    volume (owners across a restart: tests/e2e/test_drain.py)."""
    (tmp_path / "gateway.yaml").write_text(
        MOUNTED + 'store: {snapshot_path: "/var/lib/mcp-task-gateway/tasks.snapshot"}\n')
    volume = f"gw-test-data-{uuid.uuid4().hex[:8]}"
    args = ("--volume", f"{volume}:/var/lib/mcp-task-gateway",
            "--volume", f"{ROOT / 'tests/servers/basic.py'}:/srv/basic.py:ro",
            "--volume", f"{tmp_path / 'gateway.yaml'}:/etc/mcp-task-gateway/gateway.yaml:ro",
            "--env", "GATEWAY_PORT=9090", "--env", f"GATEWAY_TOKEN={TOKEN}",
            "--env", "SYNC_BUDGET_MS=200")
    try:
        first = await run_image(*args, inner=9090)
        handle = (await call(bearer, first.url, "sleep", {"ms": 300}, TASKS)).body["result"]
        await wait_for(bearer, first.url, handle["taskId"], "completed")
        podman("stop", "--time", "10", first.name, timeout=30)
        second = await run_image(*args, inner=9090)
        got = (await tasks_op(bearer, second.url, "tasks/get", handle["taskId"])).body
        assert got["result"]["status"] == "completed"
        assert got["result"]["result"]["content"][0]["text"] == "slept 300"
    finally:  # --force: the containers on it go first
        podman("volume", "rm", "--force", volume, check=False)


async def test_the_image_checks_its_health_runs_unprivileged_and_stops_on_sigterm(
        mounted: Container, bearer: aiohttp.ClientSession, podman: Any) -> None:
    # The HEALTHCHECK, as the image declares it (podman runs it on a timer only under
    # systemd): on GATEWAY_PORT, 9090 here.
    check = json.loads(podman("image", "inspect", TAG).stdout)[0]["Healthcheck"]
    assert check["Interval"] > 0 and "healthz" in " ".join(check["Test"])
    assert podman("healthcheck", "run", mounted.name, check=False).returncode == 0
    # Non-root: the gateway and the server it started run as uid 10001.
    assert mounted.exec("id", "-u").strip() == "10001"
    users = podman("top", mounted.name, "user", "args").stdout.splitlines()[1:]
    assert len(users) >= 2 and all(line.split()[0] == "gateway" for line in users), users
    # A call in flight when SIGTERM comes: the gateway still exits by itself within
    # `podman stop`'s 10 s (exit 0, where a kill after the grace period would be 137).
    handle = (await call(bearer, mounted.url, "sleep", {"ms": 60_000}, TASKS)).body["result"]
    assert handle["status"] == "working"
    podman("stop", "--time", "10", mounted.name, timeout=30)
    state = mounted.state()
    assert state["Status"] == "exited" and state["ExitCode"] == 0, state
    left = subprocess.run(["pgrep", "-f", "/srv/basic.py"], capture_output=True, text=True)
    assert left.stdout == ""  # the server went with it


async def test_the_default_image_fronts_server_everything_via_npx(run_image: Any) -> None:
    # npx fetches the server at start; where egress goes through an intercepting proxy, its
    # CA is mounted at run time (never built in): NODE_EXTRA_CA_CERTS.
    ca = ["--volume", f"{HOST_CA}:/run/host-ca.crt:ro",
          "--env", "NODE_EXTRA_CA_CERTS=/run/host-ca.crt"] if HOST_CA.exists() else []
    box = await run_image(*ca, "--env", f"GATEWAY_TOKEN={TOKEN}", ready_s=120)
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        legacy = McpHttp(http, box.url)
        await legacy.initialize({}, version="2025-11-25")
        tools = (await request(legacy, "tools/list", {}))["result"]["tools"]
        assert {"echo", "trigger-long-running-operation"} <= {t["name"] for t in tools}
        # Longer than the default sync budget (1 s): a task.
        slow = await call(http, box.url, "trigger-long-running-operation",
                          {"duration": 2, "steps": 2}, TASKS)
        assert slow.body["result"]["resultType"] == "task", slow.body
        done = await wait_for(http, box.url, slow.body["result"]["taskId"], "completed")
        assert "Long running operation completed" in done["result"]["content"][0]["text"]


def test_the_default_image_will_not_serve_without_a_token(podman: Any, image: str) -> None:
    """Its port is published beyond loopback as often as not: no token, no start, and the
    message says which variable to set (before: it served anyone)."""
    refused = podman("run", "--rm", image, check=False, timeout=60)
    assert refused.returncode != 0
    assert "environment variable GATEWAY_TOKEN is not set" in refused.stderr, refused.stderr
    short = podman("run", "--rm", "--env", "GATEWAY_TOKEN=short", image, check=False,
                   timeout=60)
    assert short.returncode != 0 and "shorter than 32 characters" in short.stderr


def pem_bodies(text: str) -> set[str]:
    return {re.sub(r"\s", "", body) for body in re.findall(
        r"-----BEGIN CERTIFICATE-----(.*?)-----END CERTIFICATE-----", text, re.S)}


def host_only_certificates() -> set[str]:
    """Certificates this host trusts beyond Debian's (an intercepting proxy's): what the
    build was handed as a secret, and must have left nowhere."""
    if not HOST_CA.exists():
        return set()
    debian = set().union(*(pem_bodies(p.read_text()) for p in
                           Path("/usr/share/ca-certificates").rglob("*.crt")))
    return pem_bodies(HOST_CA.read_text()) - debian


def test_the_layers_carry_no_ca_no_secret_and_no_build_tools(podman: Any, image: str,
                                                            tmp_path: Path) -> None:
    archive = tmp_path / "image.tar"
    podman("save", "--format", "docker-archive", "--output", str(archive), image)
    extra = host_only_certificates()
    paths: set[str] = set()
    with tarfile.open(archive) as outer:
        layers = [m for m in outer.getmembers() if m.name.endswith(".tar")]
        assert layers
        for member in layers:
            with tarfile.open(fileobj=outer.extractfile(member)) as layer:
                for entry in layer:
                    paths.add(entry.name)
                    if entry.isfile() and entry.size < 4 << 20 and extra:
                        data = layer.extractfile(entry).read()  # type: ignore[union-attr]
                        if b"BEGIN CERTIFICATE" in data:
                            found = pem_bodies(data.decode("latin-1")) & extra
                            assert not found, f"{entry.name} holds the build's CA"
    assert not any(p.startswith(("run/secrets", "src/")) for p in paths)
    assert "opt/gateway/bin/mcp-task-gateway" in paths
    assert "opt/gateway/bin/pip" not in paths  # the build's tools stayed in its stage
    config = json.loads(podman("image", "inspect", image).stdout)[0]["Config"]
    assert config["User"] == "10001"
    names = {v.split("=", 1)[0] for v in config["Env"]}
    assert not {n for n in names if re.search("TOKEN|SECRET|PASSWORD|CERT|CA_", n)}, names
    history = podman("history", "--no-trunc", "--format", "{{.CreatedBy}}", image).stdout
    assert HOST_CA.name not in history
    assert TOKEN not in history and ADMIN_TOKEN not in history


# The podman-compose of the test dependencies (pyproject.toml), and Debian 12's (1.0, which
# scripts/test.sh installs): the compose files serve both.
COMPOSE = str(Path(sys.executable).parent / "podman-compose")
DEBIAN_COMPOSE = "/usr/bin/podman-compose"


@pytest.fixture
def compose_up(engine_env: dict[str, str], image: str) -> Iterator[Any]:
    """A compose file of deploy/ under podman-compose (`compose`: which), with the image built
    here and what runs beside it (Valkey, HAProxy) made from Debian's packages where no
    registry answers. Gives HAProxy's address and the container name of each service; what
    `up` printed goes to `printed`, where given."""
    subprocess.run([str(ROOT / "scripts" / "image.sh"), "--stand-ins"], check=True,
                   timeout=600, env={**engine_env, "CONTAINER_ENGINE": "podman"})
    downs: list[tuple[list[str], dict[str, str], str]] = []

    def up(name: str, compose: str = COMPOSE, build: bool = False,
           printed: list[str] | None = None) -> tuple[str, Callable[[str], str]]:
        port, project = free_port(), f"gwtest{uuid.uuid4().hex[:6]}"
        env = {**engine_env, "GATEWAY_SECRET": secrets.token_hex(32),
               "STORE_PASSWORD": secrets.token_hex(24), "GATEWAY_TOKEN": TOKEN,
               "GATEWAY_ADMIN_TOKEN": ADMIN_TOKEN,
               "PORT": str(port), "GATEWAY_IMAGE": image, "HOST_CA": str(HOST_CA)}
        command = [compose, "--project-name", project, "--file", str(ROOT / "deploy" / name),
                   "--file", str(Path(__file__).parent / "compose.image.yaml")]
        downs.append((command, env, project))
        done = subprocess.run([*command, "up", "--detach", *([] if build else ["--no-build"])],
                              env=env, check=True, capture_output=True, text=True,
                              timeout=300)
        if printed is not None:
            printed.append(done.stdout + done.stderr)
        return f"http://127.0.0.1:{port}", lambda service: f"{project}_{service}_1"

    yield up
    for command, env, project in downs:
        # Debian's podman-compose (1.0) knows no `down --timeout`, and leaves the network.
        subprocess.run([*command, "down", "--volumes"], env=env, capture_output=True,
                       timeout=300)
        subprocess.run(["podman", "network", "rm", "--force", f"{project}_default"],
                       env=env, capture_output=True, timeout=60)


async def replicas_behind(base: str, http: aiohttp.ClientSession) -> set[str]:
    """The replica ids HAProxy's round robin reaches, once all three are ready."""
    seen: set[str] = set()
    for _ in range(600):
        with contextlib.suppress(aiohttp.ClientError):
            async with http.get(base + "/readyz?detail", headers=OPERATOR) as resp:
                if resp.status == 200:
                    seen.add((await resp.json())["store"]["replica"])
        if len(seen) == 3:
            return seen
        await asyncio.sleep(0.2)
    raise AssertionError(f"only {seen} became ready behind HAProxy")


async def test_the_replica_set_in_containers_shares_tasks(compose_up: Any,
                                                          bearer: aiohttp.ClientSession
                                                          ) -> None:
    base, _ = compose_up("compose.yaml")
    assert await replicas_behind(base, bearer) == {"gateway-1", "gateway-2", "gateway-3"}
    url = base + "/mcp"
    handle = (await call(bearer, url, "trigger-long-running-operation",
                         {"duration": 2, "steps": 2}, TASKS)).body["result"]
    assert handle["resultType"] == "task", handle
    # Round robin: consecutive reads land on each replica in turn, the creator among them.
    statuses = [(await tasks_op(bearer, url, "tasks/get", handle["taskId"])).body["result"][
        "status"] for _ in range(3)]
    assert set(statuses) <= {"working", "completed"}, statuses
    done = await wait_for(bearer, url, handle["taskId"], "completed")
    for _ in range(3):  # its result, on every replica
        again = (await tasks_op(bearer, url, "tasks/get", handle["taskId"])).body["result"]
        assert again["result"] == done["result"]
    assert "Long running operation completed" in done["result"]["content"][0]["text"]


@pytest.mark.skipif(not Path(DEBIAN_COMPOSE).exists(),
                    reason="Debian's podman-compose is missing (scripts/test.sh installs it)")
async def test_the_replica_set_comes_up_under_debians_podman_compose(
        compose_up: Any, bearer: aiohttp.ClientSession) -> None:
    """deploy/compose.yaml under Debian 12's podman-compose (1.0): `up` uses the image
    scripts/image.sh made rather than building one without the proxy's CA (that build failed,
    and `up` still said 0), and every replica starts with the operator token (a
    `${GATEWAY_ADMIN_TOKEN:-}` stayed literal there, and the replicas refused it)."""
    printed: list[str] = []
    base, _ = compose_up("compose.yaml", DEBIAN_COMPOSE, build=True, printed=printed)
    assert "podman build" not in printed[0], printed[0][-2000:]
    assert await replicas_behind(base, bearer) == {"gateway-1", "gateway-2", "gateway-3"}


async def test_the_sentinel_replica_set_keeps_a_task_through_a_failover(
        compose_up: Any, bearer: aiohttp.ClientSession, podman: Any) -> None:
    """deploy/compose.sentinel.yaml: the store's primary stops answering (frozen: a killed
    container's host name stops resolving, which Redis 7.0's Sentinel does not always fail
    over from), the Sentinels promote its replica, and the task whose handle was returned is
    still there, with its result, on every gateway replica; new calls are answered."""
    base, container = compose_up("compose.sentinel.yaml")
    await replicas_behind(base, bearer)
    await watching(podman, container)
    url = base + "/mcp"
    handle = await first_task(bearer, url)
    done = await wait_for(bearer, url, handle["taskId"], "completed")
    podman("pause", container("valkey-1"))
    try:
        await promoted(podman, container)
        # The new primary holds the task's record (acknowledged by it before the handle
        # went out: min_replicas_acked), not only the gateways' memory of it.
        kept = podman("exec", container("valkey-2"), "redis-cli", "--scan", "--pattern",
                      f"*t:{handle['taskId']}").stdout.split()
        assert kept, "the promoted store lost the task"
        for _ in range(3):  # round robin: on each replica
            after = await until_answered(bearer, url, handle["taskId"])
            assert after["status"] == "completed" and after["result"] == done["result"]
        # With no store replica left to acknowledge a new task, a slow call is answered
        # inline (compose.sentinel.yaml says so): answered, not lost.
        inline = (await call(bearer, url, "trigger-long-running-operation",
                             {"duration": 1.5, "steps": 1}, TASKS)).body["result"]
        assert inline["resultType"] == "complete", inline
        assert "Long running operation completed" in inline["content"][0]["text"]
    finally:
        podman("unpause", container("valkey-1"), check=False)


async def first_task(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    """A task handle, once the store's replica acknowledges writes (until its first sync,
    slow calls are answered inline: compose.sentinel.yaml)."""
    for _ in range(60):
        made = (await call(http, url, "trigger-long-running-operation",
                           {"duration": 2, "steps": 2}, TASKS)).body["result"]
        if made["resultType"] == "task":
            return dict(made)
        assert "Long running operation completed" in made["content"][0]["text"]
    raise AssertionError("no task handle: the store's replica never acknowledged")


async def watching(podman: Any, container: Callable[[str], str]) -> None:
    """Waits until every Sentinel knows the store's replica and the other two Sentinels
    (learned from the primary's INFO and hello messages, within about ten seconds of a
    start): before that, no failover can happen."""
    def known(sentinel: str, what: str) -> int:
        out = podman("exec", container(sentinel), "redis-cli", "-p", "26379", "sentinel",
                     what, "main", check=False).stdout.split()
        return out.count("name")
    for _ in range(120):
        if all(known(s, "replicas") >= 1 and known(s, "sentinels") >= 2
               for s in ("sentinel-1", "sentinel-2", "sentinel-3")):
            return
        await asyncio.sleep(0.5)
    raise AssertionError("the Sentinels never came to watch the store's replica")


async def promoted(podman: Any, container: Callable[[str], str]) -> None:
    """Waits for the Sentinels to make valkey-2 the store's primary."""
    for _ in range(120):
        role = podman("exec", container("valkey-2"), "redis-cli", "role",
                      check=False).stdout.split()
        if role[:1] == ["master"]:
            return
        await asyncio.sleep(0.5)
    said = [podman("logs", container(s), check=False).stdout[-1500:]
            for s in ("sentinel-1", "sentinel-2", "sentinel-3")]
    raise AssertionError("the Sentinels never promoted valkey-2: " + " | ".join(said))


async def until_answered(http: aiohttp.ClientSession, url: str, task_id: str
                         ) -> dict[str, Any]:
    """The task, once the store answers again: during the failover a read may fail."""
    for _ in range(120):
        with contextlib.suppress(aiohttp.ClientError):
            reply = await tasks_op(http, url, "tasks/get", task_id)
            if reply.status == 200 and "result" in reply.body:
                result: dict[str, Any] = reply.body["result"]
                return result
        await asyncio.sleep(0.5)
    raise AssertionError("the store never answered again after the failover")
