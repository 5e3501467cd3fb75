"""Issue 41, item 5: the operator's pages behind the shipped HAProxy on the same host (every
client a loopback peer of the replicas), and the failed-auth limit behind it. Real replicas,
a real haproxy (deploy/haproxy.cfg) and a real Redis server; the operator listener of its own
and the audit log's client address, in process."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import aiohttp
import pytest
import structlog
from conftest import GROUP_ADMIN, OPERATOR, free_port
from test_load_balancer import POLICY, balancing
from test_tasks import call

ALICE = {"Authorization": "Bearer alice-token"}
BOB = {"Authorization": "Bearer bob-token"}
WRONG = {"Authorization": "Bearer not-a-token"}
PAGES = ("/status", "/metrics", "/readyz?detail")
BEHIND_HAPROXY = {"trusted_proxies": ["127.0.0.1"]}


async def get(http: aiohttp.ClientSession, base: str, path: str,
              headers: dict[str, str] | None = None) -> tuple[int, str]:
    async with http.get(base + path, headers=headers) as resp:
        return resp.status, await resp.text()


@pytest.fixture
async def stranger() -> AsyncIterator[aiohttp.ClientSession]:
    """A client on another loopback address than the test's own (Alice's)."""
    connector = aiohttp.TCPConnector(local_addr=("127.0.0.2", 0))
    async with aiohttp.ClientSession(connector=connector) as session:
        yield session


async def alices_task(http: aiohttp.ClientSession, url: str) -> str:
    task = (await call(http, url, "sleep", {"ms": 30_000}, headers=ALICE)).body["result"]
    assert task["resultType"] == "task", task
    return str(task["taskId"])


async def test_behind_haproxy_only_the_operator_reads_the_pages(group, http) -> None:
    """No token, a wrong one, Alice's and Bob's: 401 or 403 on every replica, and never
    Alice's task id; the admin token: 200, Alice's task on the replica that runs it."""
    replicas = await group(3, tasks=POLICY, security=BEHIND_HAPROXY)
    async with balancing(replicas) as url:
        base = url.removesuffix("/mcp")
        task_id = await alices_task(http, url)
        for path in PAGES:
            for _ in replicas:  # round robin: each replica in turn
                for who, expected in ((None, 401), (WRONG, 401), (ALICE, 403), (BOB, 403)):
                    status, body = await get(http, base, path, who)
                    assert status == expected, (path, who, body)
                    assert task_id not in body
        statuses = [await get(http, base, "/status", OPERATOR) for _ in replicas]
        assert all(status == 200 for status, _ in statuses)
        assert any(task_id in page for _, page in statuses)
        for path in ("/metrics", "/readyz?detail"):
            assert (await get(http, base, path, OPERATOR))[0] == 200
        status, body = await get(http, base, "/readyz")  # the balancer's check stays open
        assert status == 200 and json.loads(body) == {"ready": True}


async def guess(session: aiohttp.ClientSession, url: str, times: int) -> list[int]:
    """`times` wrong tokens, each with a made-up X-Forwarded-For of its own (which a
    trusted proxy's appended address outranks)."""
    statuses = []
    for i in range(times):
        reply = await call(session, url, "echo", {"text": "x"}, headers={
            "Authorization": f"Bearer guess-{i}", "X-Forwarded-For": f"198.51.100.{i}"})
        statuses.append(reply.status)
    return statuses


async def test_a_strangers_guesses_through_haproxy_do_not_refuse_alice(group, http,
                                                                       stranger) -> None:
    """65 bad guesses through HAProxy: with its address trusted, the stranger is limited
    (60 a minute) and Alice's valid token goes on; without, the header is not believed and
    the balancer's one address is refused for everyone."""
    one, = await group(1, tasks=POLICY, security=BEHIND_HAPROXY)
    async with balancing([one, one, one]) as url:
        statuses = await guess(stranger, url, 65)
        assert statuses[:60] == [401] * 60 and statuses[-1] == 429, statuses
        assert (await call(stranger, url, "echo", {"text": "x"}, headers=ALICE)).status == 429
        for i in range(3):
            echoed = await call(http, url, "echo", {"text": f"alice {i}"}, headers=ALICE)
            assert echoed.status == 200, echoed.body
        status, _ = await get(http, url.removesuffix("/mcp"), "/status", OPERATOR)
        assert status == 200
    untrusting, = await group(1, tasks=POLICY)
    async with balancing([untrusting] * 3) as url:
        assert (await guess(stranger, url, 65))[-1] == 429
        assert (await call(http, url, "echo", {"text": "x"}, headers=ALICE)).status == 429


async def test_a_stranger_in_the_trusted_ranges_cannot_name_alices_address(
        group, http, stranger) -> None:
    """The shipped trust covers the private ranges clients often live in. HAProxy drops the
    X-Forwarded-For a client sent, so a stranger whose own address is trusted (here every
    loopback one) can neither dodge the limit with made-up addresses nor pin it on Alice's
    by naming hers: its guesses are counted against its own address."""
    one, = await group(1, tasks=POLICY, security={"trusted_proxies": ["127.0.0.0/8"]})
    async with balancing([one] * 3) as url:
        statuses = []
        for i in range(65):
            reply = await call(stranger, url, "echo", {"text": "x"}, headers={
                "Authorization": f"Bearer guess-{i}", "X-Forwarded-For": "127.0.0.1"})
            statuses.append(reply.status)
        assert statuses[:60] == [401] * 60 and statuses[-1] == 429, statuses
        echoed = await call(http, url, "echo", {"text": "alice"}, headers=ALICE)
        assert echoed.status == 200, echoed.body


async def test_without_auth_a_proxied_stranger_is_no_loopback_peer(group, http) -> None:
    """No auth configured: loopback-only stays, and HAProxy's clients are not loopback
    (its X-Forwarded-For says it speaks for someone else)."""
    one, = await group(1, tasks=POLICY, auth={"bearer_tokens": []})
    async with balancing([one] * 3) as url:
        for path in PAGES:
            status, _ = await get(http, url.removesuffix("/mcp"), path)
            assert status == 403, path
            status, _ = await get(http, one.url.removesuffix("/mcp"), path)
            assert status == 200, path


async def test_the_audit_log_names_the_client_behind_a_trusted_proxy(gateway, http) -> None:
    url = await gateway(tasks=POLICY, auth={"bearer_tokens": ["alice-token"]},
                        security=BEHIND_HAPROXY)
    with structlog.testing.capture_logs() as events:
        await call(http, url, "echo", {"text": "x"},
                   headers={**WRONG, "X-Forwarded-For": "198.51.100.1, 203.0.113.9"})
    audits = [e for e in events if e["event"] == "auth.failed"]
    assert [(e["reason"], e["remote"]) for e in audits] == [("wrong", "203.0.113.9")]


async def test_the_operator_listener_serves_the_pages_alone(gateway, http) -> None:
    """listen.operator_port: the operator's routes only; its loopback peers are operators
    while none is named, the gateway's port's are not."""
    port = free_port()
    url = await gateway(tasks=POLICY, auth={"bearer_tokens": ["alice-token"]},
                        listen={"operator_port": port})
    task_id = await alices_task(http, url)
    own = f"http://127.0.0.1:{port}"
    for path in PAGES:
        status, _ = await get(http, own, path)
        assert status == 200, path
        assert (await get(http, url.removesuffix("/mcp"), path))[0] == 401
    assert task_id in (await get(http, own, "/status"))[1]
    for path in ("/healthz", "/readyz"):
        assert (await get(http, own, path))[0] == 200
    async with http.post(own + "/mcp", json={}, headers=ALICE) as resp:
        assert resp.status == 404  # no MCP endpoint there
    status, _ = await get(http, own, "/status", {"X-Forwarded-For": "203.0.113.9"})
    assert status == 403  # a proxy's client, not this machine
    named = free_port()
    url = await gateway(tasks=POLICY, listen={"operator_port": named},
                        auth={"bearer_tokens": ["alice-token"], "admin_tokens": [GROUP_ADMIN]})
    status, _ = await get(http, f"http://127.0.0.1:{named}", "/status")
    assert status == 401  # operators named: their credential, here too
    assert (await get(http, f"http://127.0.0.1:{named}", "/status", OPERATOR))[0] == 200
