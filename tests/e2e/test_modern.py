"""The modern era (2026-07-28) over raw HTTP: envelope and header rules, discover, caching
hints, the MRTR bridge's sealed requestState, request-scoped logs, and subscriptions/listen."""

from __future__ import annotations

import asyncio
import base64
import gc
import itertools
import json
from typing import Any

import aiohttp
import pytest
from mcp_http import ACCEPT_BOTH, McpHttp, Reply, parse_sse, read

VERSION = "2026-07-28"
_ids = itertools.count(1)


def envelope(caps: dict[str, Any] | None = None, **meta: Any) -> dict[str, Any]:
    return {"io.modelcontextprotocol/protocolVersion": VERSION,
            "io.modelcontextprotocol/clientCapabilities": caps or {}, **meta}


def headers_for(method: str, params: dict[str, Any], **extra: str) -> dict[str, str]:
    h = {"Content-Type": "application/json", "Accept": ACCEPT_BOTH,
         "MCP-Protocol-Version": VERSION, "Mcp-Method": method}
    name = params.get("name", params.get("uri", params.get("taskId")))
    if name is not None:
        h["Mcp-Name"] = name
    h.update(extra)
    return h


async def modern(http: aiohttp.ClientSession, url: str, method: str,
                 params: dict[str, Any] | None = None, caps: dict[str, Any] | None = None,
                 meta: dict[str, Any] | None = None, headers: dict[str, str] | None = None
                 ) -> Reply:
    params = {**(params or {}), "_meta": envelope(caps, **(meta or {}))}
    body = {"jsonrpc": "2.0", "id": next(_ids), "method": method, "params": params}
    async with http.post(url, json=body,
                         headers=headers_for(method, params, **(headers or {}))) as r:
        return await read(r)


async def call(http, url, name, arguments=None, caps=None, headers=None,
               **params: Any) -> Reply:
    return await modern(http, url, "tools/call",
                        {"name": name, "arguments": arguments or {}, **params}, caps,
                        headers=headers)


@pytest.fixture
async def url(gateway) -> str:
    return await gateway(caching={"ttl_ms": 5000, "scope": "public"})


async def test_discover_answers_from_the_upstream(url, http) -> None:
    reply = await modern(http, url, "server/discover")
    result = reply.body["result"]
    assert reply.status == 200 and result["resultType"] == "complete"
    assert result["supportedVersions"][0] == VERSION and "2025-11-25" in result["supportedVersions"]
    assert result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "basic-test-server"
    assert result["capabilities"]["tools"] == {"listChanged": True}
    assert result["instructions"] == "A server for tests."
    assert (result["ttlMs"], result["cacheScope"]) == (5000, "public")


async def test_results_are_made_modern(url, http) -> None:
    listed = (await modern(http, url, "tools/list")).body["result"]
    assert listed["resultType"] == "complete" and listed["ttlMs"] == 5000
    assert listed["cacheScope"] == "public"
    called = (await call(http, url, "echo", {"text": "hi"})).body["result"]
    assert called["resultType"] == "complete" and "ttlMs" not in called
    assert called["content"][0]["text"] == "hi"


@pytest.mark.parametrize(("mutate", "status", "code"), [
    (lambda p, h: p.pop("_meta"), 400, -32602),
    (lambda p, h: p["_meta"].pop("io.modelcontextprotocol/clientCapabilities"), 400, -32602),
    (lambda p, h: h.pop("MCP-Protocol-Version"), 400, -32020),
    (lambda p, h: h.update({"MCP-Protocol-Version": "2025-11-25"}), 400, -32020),
    (lambda p, h: h.update({"Mcp-Method": "tools/list"}), 400, -32020),
    (lambda p, h: h.update({"Mcp-Method": "Tools/Call"}), 400, -32020),
    (lambda p, h: h.update({"Mcp-Name": "other"}), 400, -32020),
    (lambda p, h: h.pop("Mcp-Name"), 400, -32020),
])
async def test_envelope_and_header_rules(url, http, mutate, status, code) -> None:
    params = {"name": "echo", "arguments": {"text": "x"}, "_meta": envelope()}
    headers = headers_for("tools/call", params)
    mutate(params, headers)
    body = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params}
    async with http.post(url, json=body, headers=headers) as resp:
        reply = await read(resp)
    assert (reply.status, reply.body["error"]["code"]) == (status, code)
    assert reply.body["id"] == 7
    assert "None" not in reply.body["error"]["message"]  # says what is missing, in words


async def test_header_values_may_be_padded_or_base64(url, http) -> None:
    params = {"name": "echo", "arguments": {"text": "x"}, "_meta": envelope()}
    encoded = "=?base64?" + base64.b64encode(b"echo").decode() + "?="
    for name in ("  echo ", encoded):
        headers = headers_for("tools/call", params, **{"Mcp-Name": name})
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}
        async with http.post(url, json=body, headers=headers) as resp:
            assert resp.status == 200, await resp.text()


async def test_unsupported_version_lists_what_is_supported(url, http) -> None:
    params = {"_meta": {**envelope(), "io.modelcontextprotocol/protocolVersion": "2099-01-01"}}
    headers = {**headers_for("tools/list", params), "MCP-Protocol-Version": "2099-01-01"}
    body = {"jsonrpc": "2.0", "id": 3, "method": "tools/list", "params": params}
    async with http.post(url, json=body, headers=headers) as resp:
        reply = await read(resp)
    assert reply.status == 400 and reply.body["error"]["code"] == -32022
    assert reply.body["error"]["data"]["requested"] == "2099-01-01"
    assert VERSION in reply.body["error"]["data"]["supported"]


async def test_legacy_only_methods_and_verbs_are_refused(url, http) -> None:
    for method in ("ping", "logging/setLevel", "resources/subscribe", "no/such"):
        reply = await modern(http, url, method)
        assert (reply.status, reply.body["error"]["code"]) == (404, -32601), method
    for verb in (http.get, http.delete):
        async with verb(url, headers={"MCP-Protocol-Version": VERSION}) as resp:
            assert resp.status == 405


async def test_session_header_is_ignored_and_legacy_works_beside(url, http, client) -> None:
    legacy: McpHttp = client(url)
    await legacy.initialize()
    reply = await modern(http, url, "tools/list", headers={"Mcp-Session-Id": "whatever"})
    assert reply.status == 200 and "Mcp-Session-Id" not in reply.headers
    assert (await legacy.call("echo", {"text": "still legacy"})).status == 200


async def ask_round(http, url, caps=None, headers=None, **args: Any
                    ) -> tuple[Reply, dict[str, Any]]:
    reply = await call(http, url, "ask", {"message": "Name?", **args},
                       caps if caps is not None else {"elicitation": {}}, headers)
    return reply, reply.body["result"] if reply.body and "result" in reply.body else {}


async def retry(http, url, state: str, answers: dict[str, Any], headers=None):
    return await call(http, url, "ask", {"message": "Name?"}, {"elicitation": {}}, headers,
                      inputResponses=answers, requestState=state)


async def test_input_required_round_trip(url, http) -> None:
    _, first = await ask_round(http, url)
    assert first["resultType"] == "input_required"
    (key, request), = first["inputRequests"].items()
    assert request["method"] == "elicitation/create"
    assert request["params"]["message"] == "Name?"
    done = await retry(http, url, first["requestState"], {key: {"action": "accept",
                                                               "content": {"name": "Ada"}}})
    assert json.loads(done.body["result"]["content"][0]["text"])["content"] == {"name": "Ada"}


async def test_missing_answers_ask_again_and_lose_nothing(url, http) -> None:
    _, first = await ask_round(http, url)
    (key, _), = first["inputRequests"].items()
    again = (await retry(http, url, first["requestState"], {"wrong": {}})).body["result"]
    assert again["resultType"] == "input_required" and list(again["inputRequests"]) == [key]
    done = await retry(http, url, again["requestState"], {key: {"action": "decline"}})
    assert json.loads(done.body["result"]["content"][0]["text"]) == {"action": "decline"}


async def test_tampered_replayed_and_foreign_states_are_refused(gateway, http) -> None:
    url = await gateway(auth={"bearer_tokens": ["alice-token", "bob-token"]})
    alice = {"Authorization": "Bearer alice-token"}
    _, first = await ask_round(http, url, headers=alice)
    state = first["requestState"]
    (key, _), = first["inputRequests"].items()
    answer = {key: {"action": "accept", "content": {"name": "Ada"}}}
    tampered = state[:-3] + ("AAA" if not state.endswith("AAA") else "BBB")
    forged = None
    for bad, who in ((tampered, alice), ("junk", alice),
                     # Bob holding Alice's genuine state: exactly what a forged one gets.
                     (state, {"Authorization": "Bearer bob-token"})):
        refused = await retry(http, url, bad, answer, who)
        assert refused.status == 400 and refused.body["error"]["code"] == -32602
        assert "not a state this gateway issued" in refused.body["error"]["message"]
        assert refused.body["error"] == (forged or refused.body["error"])
        forged = refused.body["error"]
    done = await retry(http, url, state, answer, alice)  # the parked call was not disturbed
    assert done.body["result"]["resultType"] == "complete"
    replayed = await retry(http, url, state, answer, alice)
    assert replayed.status == 400 and "no longer waiting" in replayed.body["error"]["message"]


async def test_state_bound_to_the_request(url, http) -> None:
    _, first = await ask_round(http, url)
    other = await call(http, url, "ask", {"message": "Different?"}, {"elicitation": {}},
                       inputResponses={}, requestState=first["requestState"])
    assert other.status == 400 and "different request" in other.body["error"]["message"]


async def test_undeclared_input_is_a_missing_capability(url, http) -> None:
    reply, _ = await ask_round(http, url, caps={}, strict=True)  # the tool needs the answer
    assert reply.status == 400 and reply.body["error"]["code"] == -32021
    assert reply.body["error"]["data"] == {"requiredCapabilities": {"elicitation": {}}}
    coped, result = await ask_round(http, url, caps={})  # this tool carries on without it
    assert coped.status == 200 and result["resultType"] == "complete"
    assert "elicitation" in json.loads(result["content"][0]["text"])["message"]


async def test_logs_only_when_asked_and_at_level(url, http) -> None:
    quiet = await call(http, url, "log", {"text": "hello"})
    assert quiet.body is not None  # plain JSON: no log event came before the result
    for level, wanted in (("debug", True), ("error", False)):
        loud = await modern(http, url, "tools/call", {"name": "log", "arguments": {}},
                            meta={"io.modelcontextprotocol/logLevel": level})
        logs = [e for e in loud.events if e.get("method") == "notifications/message"]
        assert bool(logs) is wanted, level


async def test_listen_streams_carry_what_was_asked(gateway, http) -> None:
    url = await gateway(limits={"max_listeners_per_owner": 1})
    params = {"notifications": {"toolsListChanged": True, "promptsListChanged": True,
                                "resourceSubscriptions": ["test://a"]},
              "_meta": envelope()}
    body = {"jsonrpc": "2.0", "id": "sub-1", "method": "subscriptions/listen", "params": params}
    async with http.post(url, json=body, headers=headers_for("subscriptions/listen", params)
                         ) as stream:
        assert stream.headers["Content-Type"].startswith("text/event-stream")
        events = []

        async def next_event() -> dict[str, Any]:
            data = b""
            while not data.endswith(b"\n\n"):
                data += await asyncio.wait_for(stream.content.readline(), 5)
            return parse_sse(data)[0][0]

        ack = await next_event()
        assert ack["method"] == "notifications/subscriptions/acknowledged"
        assert ack["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == "sub-1"
        # prompts do not declare listChanged upstream: that part is not honoured
        assert ack["params"]["notifications"] == {"toolsListChanged": True,
                                                  "resourceSubscriptions": ["test://a"]}
        second = await modern(http, url, "subscriptions/listen", {"notifications": {}})
        assert second.status == 429  # bounded per owner
        await call(http, url, "touch", {"uri": "test://other"})  # not asked for
        await call(http, url, "touch", {"uri": "test://a"})
        await call(http, url, "changed")
        events = [await next_event(), await next_event()]
    assert [e["method"] for e in events] == ["notifications/resources/updated",
                                             "notifications/tools/list_changed"]
    assert all(e["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == "sub-1"
               for e in events)


async def test_a_parked_call_never_resumed_is_cancelled_upstream(gateway, http) -> None:
    url = await gateway(limits={"park_timeout_ms": 200})
    _, first = await ask_round(http, url)
    assert first["resultType"] == "input_required"
    await asyncio.sleep(0.6)
    seen = json.loads((await call(http, url, "cancelled")).body["result"]["content"][0]["text"])
    assert len(seen) == 1  # the upstream was told to stop waiting
    late = await retry(http, url, first["requestState"], {"elicitation-1": {"action": "cancel"}})
    assert late.status == 400 and late.body["error"]["code"] == -32602


async def test_an_abandoned_round_does_not_capture_the_next_call(url, http) -> None:
    _, abandoned = await ask_round(http, url)  # parked, never answered
    assert abandoned["resultType"] == "input_required"
    # Routed into the abandoned round instead, this call would never answer: bound the wait.
    _, second = await asyncio.wait_for(ask_round(http, url, message="Again?"), 10)
    (key, request), = second["inputRequests"].items()
    assert request["params"]["message"] == "Again?"  # the running call's question, not lost
    done = await call(http, url, "ask", {"message": "Again?"}, {"elicitation": {}},
                      inputResponses={key: {"action": "decline"}},
                      requestState=second["requestState"])
    assert json.loads(done.body["result"]["content"][0]["text"]) == {"action": "decline"}


async def test_modern_calls_in_flight_are_bounded_per_client(gateway, http) -> None:
    url = await gateway(limits={"max_calls_per_owner": 1})
    slow = asyncio.create_task(modern(http, url, "tools/call",
                                      {"name": "sleep", "arguments": {"ms": 800}}))
    await asyncio.sleep(0.2)
    refused = await modern(http, url, "tools/call", {"name": "echo", "arguments": {"text": "x"}})
    assert refused.status == 429 and refused.body["error"]["data"] == {"maxInFlight": 1}
    assert (await slow).body["result"]["content"][0]["text"] == "slept 800"
    again = await modern(http, url, "tools/call", {"name": "echo", "arguments": {"text": "y"}})
    assert again.body["result"]["content"][0]["text"] == "y"  # the slot came back


async def test_an_answered_request_frees_its_answer_at_once(url, http, client) -> None:
    """Issue 11 (memory returns once readers are gone): nothing of a finished request, in
    either era, waits for the garbage collector, which a quiet gateway may not run for a long
    while, holding every big answer meanwhile."""
    legacy = client(url)
    await legacy.initialize()
    gc.collect()
    gc.disable()
    try:
        for size in (1 << 20, 2 << 20):
            reply = await call(http, url, "blob", {"bytes": size})
            assert len(reply.body["result"]["content"][0]["text"]) == size
            reply = await legacy.call("blob", {"bytes": size})
            assert len(reply.body["result"]["content"][0]["text"]) == size
        await asyncio.sleep(0.1)
        held = [type(o).__name__ for o in gc.get_objects() if type(o).__name__.endswith(
            "Exchange")]
    finally:
        gc.enable()
    assert held == []


async def test_a_parked_call_holds_its_digest_not_its_clients_params(gateway, http) -> None:
    """A call parked for input keeps its request's digest, not the client's params: ten
    parked calls with a 3 MiB argument each hold none of it for their park's timeout
    (found in review: the params were kept whole, uncounted, for up to 5 minutes)."""
    import io
    import uuid
    url = await gateway(auth={"bearer_tokens": ["alice-token"]},
                        limits={"max_body_bytes": 8 << 20})
    alice = {"Authorization": "Bearer alice-token"}
    marker = f"marker-{uuid.uuid4()}"
    for _ in range(10):
        params = {"name": "ask", "arguments": {"message": "Name?", marker: [1],
                                               "blob": "x" * (3 << 20)},
                  "_meta": envelope({"elicitation": {}})}
        body = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params}
        async with http.post(url, data=io.BytesIO(json.dumps(body).encode()),
                             headers=headers_for("tools/call", params, **alice)) as resp:
            reply = await read(resp)
        assert reply.body["result"]["resultType"] == "input_required"
        del reply, params, body
    gc.collect()
    held = [o for o in gc.get_objects() if type(o) is dict and marker in o]
    assert not held, f"{len(held)} parked calls' arguments held"
