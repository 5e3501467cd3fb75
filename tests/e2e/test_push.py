"""Webhooks (gateway/push, docs/push.md): each task status an operator's webhook names is
POSTed to it signed as Standard Webhooks says, verified here with that library; at least
once, with the same webhook-id on every attempt; 410 disables the endpoint, redirects are
never followed, and a receiver that is down costs the callers nothing."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp import web
from standardwebhooks import Webhook as Verifier
from test_modern import modern
from test_tasks import TASKS, tasks_op, wait_for

SECRET = "whsec_" + base64.b64encode(b"a receiver's secret, 32 bytes!!!").decode()
POLICY = {"defaults": {"mode": "always", "ttl_ms": 60_000, "poll_interval_ms": 200},
          "tools": {"hang": {"mode": "always", "timeout_ms": 300}}}


class Receiver:
    """A webhook receiver on loopback: what it got (verified), answering as `answer` says."""

    def __init__(self, answer: Callable[[int], web.Response] | None = None) -> None:
        self.got: list[tuple[dict[str, str], dict[str, Any]]] = []
        self.hits: dict[str, int] = {}
        self.answer = answer or (lambda _n: web.Response(status=204))
        self.arrived = asyncio.Event()

    async def hook(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.hits[request.path] = self.hits.get(request.path, 0) + 1
        headers = dict(request.headers)
        payload = Verifier(SECRET).verify(body, headers)  # raises unless signed right
        self.got.append((headers, payload))
        self.arrived.set()
        return self.answer(len(self.got))

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/{tail:.*}", self.hook)
        return app

    async def wait(self, count: int, timeout_s: float = 10) -> None:
        async with asyncio.timeout(timeout_s):
            while len(self.got) < count:
                self.arrived.clear()
                await self.arrived.wait()


async def served(aiohttp_server, receiver: Receiver) -> str:
    server = await aiohttp_server(receiver.app())
    return str(server.make_url("/hooks/tasks"))


def hooked(url: str, **extra: Any) -> dict[str, Any]:
    return {"tasks": POLICY, "webhooks": [{"url": url, "secret": SECRET, **extra}]}


async def task_of(http, url: str, tool: str, args: dict[str, Any]) -> str:
    reply = await modern(http, url, "tools/call", {"name": tool, "arguments": args}, TASKS)
    return reply.body["result"]["taskId"]


async def test_each_end_is_pushed_once_signed_and_thin(gateway, http, aiohttp_server) -> None:
    receiver = Receiver()
    url = await gateway(**hooked(await served(aiohttp_server, receiver)))
    done = await task_of(http, url, "echo", {"text": "the secret argument"})
    failed = await task_of(http, url, "hang", {})
    cancelled = await task_of(http, url, "sleep", {"ms": 5000})
    await tasks_op(http, url, "tasks/cancel", cancelled)
    await wait_for(http, url, failed, "failed")
    await receiver.wait(3)
    await asyncio.sleep(0.3)  # and no more
    by_task = {p["data"]["taskId"]: (h, p) for h, p in receiver.got}
    assert len(receiver.got) == 3 and set(by_task) == {done, failed, cancelled}
    assert {t: p["data"]["status"] for t, (_, p) in by_task.items()} == {
        done: "completed", failed: "failed", cancelled: "cancelled"}
    headers, payload = by_task[done]
    assert payload["type"] == "task.completed" and payload["data"]["tool"] == "echo"
    assert headers["webhook-id"].startswith("msg_")
    assert len({h["webhook-id"] for h, _ in receiver.got}) == 3
    raw = json.dumps([p for _, p in receiver.got])
    assert "the secret argument" not in raw and "result" not in raw  # push is a hint
    assert "timed out" in by_task[failed][1]["data"]["statusMessage"]  # the gateway's words


async def test_a_503_is_tried_again_with_the_same_id(gateway, http, aiohttp_server) -> None:
    receiver = Receiver(lambda n: web.Response(status=503, headers={"Retry-After": "1"})
                        if n == 1 else web.Response(status=204))
    url = await gateway(**hooked(await served(aiohttp_server, receiver)))
    await task_of(http, url, "echo", {"text": "x"})
    await receiver.wait(2)
    (first, one), (second, two) = receiver.got
    assert first["webhook-id"] == second["webhook-id"] and one == two
    assert int(second["webhook-timestamp"]) >= int(first["webhook-timestamp"])
    status = await detail(http, url)
    assert status[0]["delivered"] == 1 and status[0]["failures"] == 1
    async with http.get(url.replace("/mcp", "/status")) as resp:  # the status page says so
        page = await resp.text()
    assert "<h2>Webhooks</h2>" in page and "127.0.0.1" in page
    assert SECRET not in page and "/hooks/tasks" not in page  # a path may be a secret


async def test_410_disables_the_endpoint(gateway, http, aiohttp_server) -> None:
    receiver = Receiver(lambda _n: web.Response(status=410))
    url = await gateway(**hooked(await served(aiohttp_server, receiver)))
    await task_of(http, url, "echo", {"text": "x"})
    await receiver.wait(1)
    task = await task_of(http, url, "echo", {"text": "y"})
    await wait_for(http, url, task, "completed")
    await asyncio.sleep(0.5)
    assert len(receiver.got) == 1
    lane = (await detail(http, url))[0]
    assert lane["disabled"] is True and lane["pending"] == 0  # nothing held for it


async def test_a_redirect_is_not_followed(gateway, http, aiohttp_server) -> None:
    receiver = Receiver(lambda _n: web.Response(status=307,
                                                headers={"Location": "/elsewhere"}))
    url = await gateway(**hooked(await served(aiohttp_server, receiver)))
    await task_of(http, url, "echo", {"text": "x"})
    await receiver.wait(2, timeout_s=15)  # tried again (1 s), never at /elsewhere
    assert set(receiver.hits) == {"/hooks/tasks"}


async def test_a_receiver_that_is_down_costs_callers_nothing(gateway, http) -> None:
    from conftest import free_port

    url = await gateway(**hooked(f"http://127.0.0.1:{free_port()}/hooks"))
    tasks = await asyncio.gather(*(task_of(http, url, "echo", {"text": str(i)})
                                   for i in range(20)))
    for task in tasks:
        assert (await wait_for(http, url, task, "completed"))["status"] == "completed"
    status = (await detail(http, url))[0]
    assert status["delivered"] == 0 and status["pending"] == 20


async def test_filters_and_events_choose_what_fires(gateway, http, aiohttp_server) -> None:
    receiver = Receiver()
    url = await gateway(**hooked(await served(aiohttp_server, receiver), events=["failed"],
                                 tools=["ha*"]))
    await task_of(http, url, "echo", {"text": "not this"})
    failed = await task_of(http, url, "hang", {})
    await receiver.wait(1)
    await asyncio.sleep(0.3)
    assert [p["data"]["taskId"] for _, p in receiver.got] == [failed]


@pytest.mark.parametrize(("hook", "said"), [
    ({"url": "ftp://h.example/x", "secret": SECRET}, "not an http(s) URL"),
    ({"url": "https://h.example/x", "secret": "whsec_c2hvcnQ="}, "24-64 bytes"),
    ({"url": "https://h.example/x", "secret": "plain"}, "whsec_"),
    ({"url": "https://h.example/x", "secret": SECRET, "events": ["working"]}, "events"),
])
def test_check_config_names_a_bad_webhook(hook, said, tmp_path) -> None:
    import subprocess
    import sys

    import yaml
    from conftest import ROOT, settings_for

    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump({**settings_for(), "webhooks": [hook]}))
    out = subprocess.run([sys.executable, "-m", "gateway", "--check-config", str(path)],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode != 0 and said in out.stdout + out.stderr
    assert "c2hvcnQ" not in out.stdout + out.stderr  # never the secret


async def detail(http, url: str) -> list[dict[str, Any]]:
    async with http.get(url.replace("/mcp", "/readyz?detail"),
                        headers={"Authorization": f"Bearer {ADMIN}"}) as resp:
        return (await resp.json())["webhooks"]


# -- clients' own webhooks (push/client.py) ------------------------------------------------
CLIENT_SECRET = "whsec_" + base64.b64encode(b"the client's own secret, 32 byte").decode()
TOKENS = {"alice": "alice-token-0123456789abcdef0123456789",
          "bob": "bob-token-0123456789abcdef0123456789ab"}
ADMIN = "operator-token-0123456789abcdef0123456"


def asks(url: str, secret: str = CLIENT_SECRET) -> dict[str, Any]:
    return {"mcp-task-gateway/webhook": {"url": url, "secret": secret}}


async def own_task(http, url: str, who: str, tool: str, args: dict[str, Any],
                   meta: dict[str, Any] | None = None) -> Any:
    return await modern(http, url, "tools/call", {"name": tool, "arguments": args},
                        TASKS, meta=meta, headers={"Authorization": f"Bearer {TOKENS[who]}"})


def clients_gateway(allowed: list[str]) -> dict[str, Any]:
    return {"tasks": POLICY, "webhooks_allowed": allowed,
            "auth": {"bearer_tokens": list(TOKENS.values()), "admin_tokens": [ADMIN]}}


class ClientReceiver(Receiver):
    async def hook(self, request: web.Request) -> web.Response:
        body = await request.read()
        payload = Verifier(CLIENT_SECRET).verify(body, dict(request.headers))
        self.got.append((dict(request.headers), payload))
        self.arrived.set()
        return web.Response(status=204)


async def test_a_clients_webhook_hears_its_own_task_only(gateway, http, aiohttp_server
                                                         ) -> None:
    receiver = ClientReceiver()
    hook = await served(aiohttp_server, receiver)
    prefix = hook.rsplit("/", 2)[0] + "/"  # http://127.0.0.1:port/ : names its host
    url = await gateway(**clients_gateway([prefix]))
    alices = (await own_task(http, url, "alice", "meta", {}, asks(hook))).body["result"]
    bobs = (await own_task(http, url, "bob", "echo", {"text": "b"})).body["result"]
    await receiver.wait(1)
    await asyncio.sleep(0.3)
    assert [p["data"]["taskId"] for _, p in receiver.got] == [alices["taskId"]]
    assert bobs["taskId"] not in json.dumps([p for _, p in receiver.got])
    done = await wait_for(http, url, alices["taskId"], "completed",
                          {"Authorization": f"Bearer {TOKENS['alice']}"})
    seen = json.loads(done["result"]["content"][0]["text"])  # the _meta the server got
    assert "mcp-task-gateway/webhook" not in seen and CLIENT_SECRET not in json.dumps(seen)


@pytest.mark.parametrize("allowed", [[], ["https://hooks.example.com/"],
                                     ["http://127.0.0.1:1/"]])
async def test_a_webhook_outside_the_allow_list_is_refused_and_nothing_runs(
        gateway, http, allowed) -> None:
    url = await gateway(**clients_gateway(allowed))
    refused = await own_task(http, url, "alice", "echo", {"text": "x"},
                             asks("http://127.0.0.1:9/hooks"))
    assert refused.status == 400 and refused.body["error"]["code"] == -32602
    assert "webhooks_allowed" in refused.body["error"]["message"]
    assert CLIENT_SECRET not in json.dumps(refused.body)
    bad = await own_task(http, url, "alice", "echo", {"text": "x"},
                         asks("https://hooks.example.com/x", "whsec_c2hvcnQ="))
    assert bad.status == 400


async def test_a_name_that_resolves_to_loopback_is_refused_unless_its_prefix_names_it(
        gateway, http, aiohttp_server) -> None:
    receiver = ClientReceiver()
    hook = (await served(aiohttp_server, receiver)).replace("127.0.0.1", "localhost")
    url = await gateway(**clients_gateway(["http://"]))  # any http URL, naming no host
    task = (await own_task(http, url, "alice", "echo", {"text": "x"}, asks(hook))
            ).body["result"]["taskId"]
    await wait_for(http, url, task, "completed", {"Authorization": f"Bearer {TOKENS['alice']}"})
    for _ in range(50):
        clients = (await detail(http, url))[-1]
        if clients["last"] is not None:
            break
        await asyncio.sleep(0.05)
    assert clients["endpoint"] == "clients" and clients["last"]["outcome"] == "refused"
    assert receiver.got == []  # never sent


async def test_a_legacy_core_task_pushes_its_end_to_its_clients_webhook(
        gateway, client, aiohttp_server) -> None:
    receiver = ClientReceiver()
    hook = await served(aiohttp_server, receiver)
    url = await gateway(**clients_gateway([hook.rsplit("/", 2)[0] + "/"]))
    mcp = client(url)
    await mcp.initialize({"tasks": {}}, version="2025-11-25",
                         headers={"Authorization": f"Bearer {TOKENS['alice']}"})
    made = await mcp.send({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {
        "name": "echo", "arguments": {"text": "x"}, "task": {},
        "_meta": asks(hook)}}, Authorization=f"Bearer {TOKENS['alice']}")
    task_id = made.body["result"]["task"]["taskId"]
    await receiver.wait(1)
    assert receiver.got[0][1]["data"]["taskId"] == task_id


# -- with replicas: pending deliveries in the shared store ---------------------------------
async def test_a_delivery_left_by_a_replica_killed_mid_retry_is_finished_by_another(
        group, http, aiohttp_server, redis_server, key_prefix) -> None:
    """Replica a's end fails its first delivery (503, try again in 2 s); a is killed before
    the second; replica b, with the same store, delivers it: the same webhook-id, once.
    What the store holds of a client's webhook is encrypted (its secret never in clear)."""
    import signal

    from conftest import OPERATOR

    receiver = Receiver(lambda n: web.Response(status=503, headers={"Retry-After": "2"})
                        if n == 1 else web.Response(status=204))
    hook = await served(aiohttp_server, receiver)
    a, b = await group(2, webhooks=[{"url": hook, "secret": SECRET}],
                       webhooks_allowed=["http://127.0.0.1:9/"],  # a closed port
                       tasks={"defaults": {"mode": "always", "ttl_ms": 60_000}})
    made = await modern(http, a.url, "tools/call", {"name": "echo", "arguments": {"text": "x"}},
                        TASKS, meta=asks("http://127.0.0.1:9/never"),
                        headers={"Authorization": "Bearer alice-token"})
    assert made.status == 200, made.body
    await receiver.wait(1)
    await asyncio.sleep(0.5)  # a has its 503: the delivery waits in the store for its retry
    assert a.proc is not None
    a.stop(signal.SIGKILL)
    await receiver.wait(2, timeout_s=15)
    await asyncio.sleep(0.5)
    (first, one), (second, two) = receiver.got
    assert len(receiver.got) == 2 and first["webhook-id"] == second["webhook-id"]
    assert one["data"]["taskId"] == two["data"]["taskId"] == made.body["result"]["taskId"]
    from redis.asyncio import Redis

    store = Redis.from_url(redis_server.url)
    try:
        held = [await store.get(k) async for k in store.scan_iter(f"{key_prefix}wh:r:*")]
    finally:
        await store.aclose()
    assert held and not any(CLIENT_SECRET.encode() in (v or b"") for v in held)
    async with http.get(b.url.replace("/mcp", "/readyz?detail"), headers=OPERATOR) as resp:
        lanes = (await resp.json())["webhooks"]
    assert lanes[0]["delivered"] == 1


async def test_one_principals_slow_receivers_hold_two_of_the_clients_lane(
        gateway, http, aiohttp_server) -> None:
    """Bob's receiver never answers and he ends ten tasks: his deliveries take two of the
    clients' lane's workers at most, so Alice's push goes out at once beside them."""
    hanging, release = 0, asyncio.Event()

    async def never(request: web.Request) -> web.Response:
        nonlocal hanging
        hanging += 1
        await release.wait()
        return web.Response(status=204)
    slow = web.Application()
    slow.router.add_post("/{tail:.*}", never)
    bobs_hook = str((await aiohttp_server(slow)).make_url("/bob"))
    alices = ClientReceiver()
    alice_hook = await served(aiohttp_server, alices)
    allowed = [bobs_hook.rsplit("/", 1)[0] + "/", alice_hook.rsplit("/", 2)[0] + "/"]
    url = await gateway(**clients_gateway(allowed))
    try:
        for i in range(10):
            await own_task(http, url, "bob", "echo", {"text": str(i)}, asks(bobs_hook))
        for _ in range(100):
            if hanging >= 2:
                break
            await asyncio.sleep(0.02)
        await own_task(http, url, "alice", "echo", {"text": "a"}, asks(alice_hook))
        await alices.wait(1, timeout_s=4)  # before any of Bob's attempts times out (5 s)
        assert hanging == 2  # his share of the lane, no more
    finally:
        release.set()
