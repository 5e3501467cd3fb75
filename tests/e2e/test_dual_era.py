"""A server that speaks both eras (tests/servers/conformance_server.py, the Python SDK `mcp`
2.x), behind the gateway over stdio and over Streamable HTTP: modern clients reach it on its
own modern wire (its input_required rounds, served at 2026-07-28), legacy clients on a legacy
session of the same upstream, and `era: legacy` pins the old way (the gateway's own rounds
over a legacy session). Its rounds' requestState is the caller's alone."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator

import pytest
import structlog
from conftest import FIXTURE, free_port, served
from mcp_http import BASIC
from test_modern import call, modern

DUAL = [sys.executable, FIXTURE]
ASKS = {"elicitation": {}}
TOKENS = {"alice": "alice-token", "bob": "bob-token"}
AUTH = {"bearer_tokens": list(TOKENS.values())}


@pytest.fixture(params=["stdio", "http"])
async def upstream(request) -> AsyncIterator[dict]:
    """How the gateway reaches the server: its command, or the URL it serves itself at."""
    if request.param == "stdio":
        yield {"command": DUAL}
        return
    port = free_port()
    async with served([*DUAL, "http", str(port)], port) as base:
        yield {"url": base + "/mcp"}


def bearer(who: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[who]}"}


def text(reply) -> str:
    return reply.message["result"]["content"][0]["text"]


async def era_probe(http, url: str, *states: str) -> str:
    """The upstream's era probe state (/readyz?detail) once it is one of `states`."""
    for _ in range(200):
        async with http.get(url.replace("/mcp", "/readyz?detail")) as resp:
            state = (await resp.json())["upstreams"]["main"].get("era_probe")
        if state in states:
            return str(state)
        await asyncio.sleep(0.05)
    raise AssertionError(f"the era probe never became one of {states}: {state}")


async def test_modern_clients_meet_the_server_itself_legacy_ones_a_session(
        upstream, gateway, http, client) -> None:
    url = await gateway(**upstream)
    if "command" in upstream:  # a stdio server is probed at the start, before any modern
        # request: the first one does not wait for its second process to start
        assert await era_probe(http, url, "modern") == "modern"
    # Served by its modern handler: it says so, and asks with its own round.
    assert text(await call(http, url, "protocol_of")) == "2026-07-28"
    asked = (await call(http, url, "test_input_required_result_elicitation", caps=ASKS)
             ).message["result"]
    assert asked["resultType"] == "input_required"
    assert asked["inputRequests"]["user_name"]["method"] == "elicitation/create"
    done = await call(http, url, "test_input_required_result_elicitation", caps=ASKS,
                      inputResponses={"user_name": {"action": "accept",
                                                    "content": {"name": "Ada"}}},
                      requestState=asked["requestState"])
    assert text(done) == "Hello, Ada!"
    # A legacy client of the same upstream: a session, and the server's request on its stream.
    legacy = client(url)
    await legacy.initialize(ASKS, version="2025-11-25")
    assert text(await legacy.call("protocol_of")).startswith("2025-")
    request, final = await legacy.call_answering("test_input_required_result_elicitation",
                                                 {}, {"name": "Grace"})
    assert request["method"] == "elicitation/create"
    assert final["result"]["content"][0]["text"] == "Hello, Grace!"
    async with http.get(url.replace("/mcp", "/readyz?detail")) as resp:
        main = (await resp.json())["upstreams"]["main"]
    assert (main["era"], main["modern_link"]["era"]) == ("legacy", "modern")


async def test_era_legacy_keeps_modern_clients_on_the_legacy_session(gateway, http) -> None:
    url = await gateway(DUAL, upstream={"era": "legacy"})
    assert text(await call(http, url, "protocol_of")).startswith("2025-")
    # The gateway's own round, made of the server's legacy elicitation request.
    asked = (await call(http, url, "test_input_required_result_elicitation", caps=ASKS)
             ).message["result"]
    assert asked["resultType"] == "input_required"
    async with http.get(url.replace("/mcp", "/readyz?detail")) as resp:
        assert "modern_link" not in (await resp.json())["upstreams"]["main"]


async def test_era_modern_serves_legacy_clients_through_the_modern_wire(gateway, client
                                                                       ) -> None:
    url = await gateway(DUAL, upstream={"era": "modern"})
    legacy = client(url)
    await legacy.initialize({}, version="2025-11-25")
    assert text(await legacy.call("protocol_of")) == "2026-07-28"


async def test_bob_cannot_finish_alices_round(upstream, gateway, http) -> None:
    url = await gateway(**upstream, auth=AUTH)
    first = (await call(http, url, "test_input_required_result_multi_round", caps=ASKS,
                        headers=bearer("alice"))).message["result"]
    answer = {"step1": {"action": "accept", "content": {"name": "Alice-secret"}}}
    second = (await call(http, url, "test_input_required_result_multi_round", caps=ASKS,
                         headers=bearer("alice"), inputResponses=answer,
                         requestState=first["requestState"])).message["result"]
    assert list(second["inputRequests"]) == ["step2"]  # her name rides the state now
    color = {"step2": {"action": "accept", "content": {"color": "red"}}}
    stolen = await call(http, url, "test_input_required_result_multi_round", caps=ASKS,
                        headers=bearer("bob"), inputResponses=color,
                        requestState=second["requestState"])
    made_up = await call(http, url, "test_input_required_result_multi_round", caps=ASKS,
                         headers=bearer("bob"), inputResponses=color,
                         requestState="bm90IGEgc3RhdGUgb2YgYW55b25lJ3MgYXQgYWxsLCBqdXN0IGJ5dGVz")
    assert stolen.status == made_up.status == 400
    assert stolen.message["error"]["code"] == made_up.message["error"]["code"] == -32602
    assert "Alice-secret" not in str(stolen.message)
    # Her round is still hers to finish.
    done = await call(http, url, "test_input_required_result_multi_round", caps=ASKS,
                      headers=bearer("alice"), inputResponses=color,
                      requestState=second["requestState"])
    assert text(done) == "Alice-secret likes red"


async def test_a_legacy_only_server_keeps_modern_clients_bridged(gateway, http) -> None:
    url = await gateway()  # tests/servers/basic.py: initialize only
    assert await era_probe(http, url, "legacy") == "legacy"  # at the start: its process ended
    assert text(await call(http, url, "echo", {"text": "hi"})) == "hi"
    async with http.get(url.replace("/mcp", "/readyz?detail")) as resp:
        main = (await resp.json())["upstreams"]["main"]
    assert main["era"] == "legacy" and "modern_link" not in main


async def test_a_probe_that_got_no_answer_is_asked_again(gateway, http, tmp_path) -> None:
    """A server that could not be reached when it was probed is not taken for a legacy one
    for good: the next modern request asks again, and the one after if that got none."""
    count = tmp_path / "count"
    # The first process (the legacy session's) starts; the next two (the probe at the
    # start, the first modern request's) exit at once; any after that starts.
    script = (f'n=$(cat "{count}" 2>/dev/null || echo 0); echo $((n + 1)) > "{count}"; '
              f'[ "$n" = 1 ] || [ "$n" = 2 ] && exit 1; exec "{DUAL[0]}" "{DUAL[1]}"')
    url = await gateway(["sh", "-c", script], upstream={"startup_timeout_ms": 3000})
    assert await era_probe(http, url, "unknown", "modern") == "unknown"
    assert text(await call(http, url, "protocol_of")).startswith("2025-")  # bridged
    assert text(await call(http, url, "protocol_of")) == "2026-07-28"  # asked again


async def modern_link_ready(http, url: str, ready: bool) -> None:
    """Until the readiness detail shows the modern link of the upstream `ready` (or not)."""
    for _ in range(200):
        async with http.get(url.replace("/mcp", "/readyz?detail")) as resp:
            link = (await resp.json())["upstreams"]["main"].get("modern_link") or {}
        if link.get("ready") is ready:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the modern link never became ready={ready}")


async def test_discover_while_the_modern_link_is_down_is_a_503_never_a_500(
        gateway, http, tmp_path) -> None:
    """The modern link's process lost after it was ready, and unable to start again:
    server/discover answers 503 with the JSON-RPC error of an upstream that cannot start
    (it read a result the lost link no longer held: a 500), then the server once it is back."""
    down, pids = tmp_path / "down", tmp_path / "pids"
    # Unable to start: it exits with code 3 before it reads anything (tests/servers/basic.py).
    script = (f'[ -e "{down}" ] && BASIC_EXIT_AT_START=3 exec "{DUAL[0]}" "{BASIC[1]}"; '
              f'echo $$ >> "{pids}"; exec "{DUAL[0]}" "{DUAL[1]}"')
    url = await gateway(["sh", "-c", script], upstream={"restart_backoff_max_ms": 200})
    assert (await modern(http, url, "server/discover")).status == 200  # probed: the link
    primary, link = map(int, pids.read_text().split())
    down.touch()
    os.kill(link, signal.SIGKILL)
    await modern_link_ready(http, url, False)
    for _ in range(3):  # while it restarts, and while it backs off after failing to
        reply = await modern(http, url, "server/discover")
        assert reply.status == 503, reply.body
        assert reply.body["error"]["data"] == {"upstream": "main", "reason": "initialize",
                                               "exitCode": 3}
    down.unlink()
    await modern_link_ready(http, url, True)
    reply = await modern(http, url, "server/discover")
    assert reply.status == 200 and "2026-07-28" in reply.body["result"]["supportedVersions"]
    os.kill(primary, 0)  # the legacy sessions' process ran on


async def test_an_accepted_notification_is_no_broken_message(gateway, client) -> None:
    """mcp 2.x answers a notification with 202 labelled application/json and no body: that
    is an acceptance (spec 2025-11-25, Sending Messages), not a message the server broke."""
    port = free_port()
    async with served([*DUAL, "http", str(port)], port) as base:
        with structlog.testing.capture_logs() as events:
            url = await gateway(url=base + "/mcp")
            legacy = client(url)
            await legacy.initialize({}, version="2025-11-25")
            assert text(await legacy.call("protocol_of")).startswith("2025-")
    assert [e for e in events if e["event"] == "upstream.bad_message"] == []
    assert [e for e in events if e["event"] == "upstream.ready"] != []


async def test_isolation_call_finishes_a_modern_clients_round(gateway, http) -> None:
    """Each tools/call goes to a fresh legacy process of the pool, whose request for input
    becomes the gateway's own round: the modern client's retry finishes it (it was refused
    as a state the gateway never issued), and Bob's retry with Alice's state does not."""
    url = await gateway(DUAL, upstream={"isolation": "call", "pool_size": 1}, auth=AUTH)
    tool = "test_input_required_result_elicitation"
    asked = (await call(http, url, tool, caps=ASKS, headers=bearer("alice"))
             ).message["result"]
    assert asked["resultType"] == "input_required"
    answer = {"user_name": {"action": "accept", "content": {"name": "Ada"}}}
    stolen = await call(http, url, tool, caps=ASKS, headers=bearer("bob"),
                        inputResponses=answer, requestState=asked["requestState"])
    made_up = await call(http, url, tool, caps=ASKS, headers=bearer("bob"),
                         inputResponses=answer, requestState="bm90IGEgc3RhdGUgYXQgYWxs")
    assert stolen.status == made_up.status == 400
    assert stolen.message["error"]["code"] == made_up.message["error"]["code"] == -32602
    done = await call(http, url, tool, caps=ASKS, headers=bearer("alice"),
                      inputResponses=answer, requestState=asked["requestState"])
    assert text(done) == "Hello, Ada!"
