"""The "Bad input" table of docs/clients.md (once README's) is what the gateway answers: every
row is sent (or, where it needs a stage of its own, named with the test that sends it) and
its HTTP status and JSON-RPC code compared with the row."""

from __future__ import annotations

import asyncio
import http.client
import importlib
import json
import re
import zlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from mcp_http import ACCEPT_BOTH, McpHttp
from test_modern import headers_for, modern

PAGE = Path(__file__).parents[2] / "docs" / "clients.md"  # README once held the table
TOKEN = "readme-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
LEGACY = {"Content-Type": "application/json", "Accept": ACCEPT_BOTH, **AUTH}
Outcome = tuple[int, Any]  # HTTP status, parsed body (or None)
Probe = Callable[["Stage"], Awaitable[Outcome]]


def table() -> list[tuple[str, str]]:
    text = PAGE.read_text()
    section = text.split("## Bad input", 1)[1].split("\n\n", 2)[1]
    rows = [line.strip("|").split(" | ", 1) for line in section.splitlines()
            if line.startswith("| ") and not line.startswith("| input")]
    return [(inp.strip(), out.strip(" |")) for inp, out in rows]


class Stage:
    def __init__(self, http: aiohttp.ClientSession, url: str, session: McpHttp) -> None:
        self.http, self.url, self.session = http, url, session
        self.headers: Any = {}  # of the last answer

    async def post(self, body: Any = None, *, data: bytes | None = None,
                   headers: dict[str, str] | None = None) -> Outcome:
        raw = data if data is not None else json.dumps(body).encode()
        async with self.http.post(self.url, data=raw, headers={**LEGACY, **(headers or {})}
                                  ) as resp:
            self.headers = resp.headers
            return resp.status, _json(await resp.text())

    async def in_session(self, body: Any, **headers: str) -> Outcome:
        return await self.post(body, headers={"Mcp-Session-Id": str(self.session.session_id),
                                              "MCP-Protocol-Version": "2025-06-18", **headers})

    async def modern(self, method: str, params: dict[str, Any], **headers: str) -> Outcome:
        reply = await modern(self.http, self.url, method, params, {},
                             headers={**AUTH, **headers})
        return reply.status, reply.body


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def call(method: str, params: Any = None, id_: Any = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "method": method, "params": params or {}}


def non_utf8_header(stage: Stage) -> Outcome:
    """aiohttp's client sends text headers only: http.client writes the byte itself."""
    host, port = stage.url.split("//")[1].split("/")[0].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("POST", "/mcp", body=json.dumps(call("ping")),
                     headers={**LEGACY, "X-Name": "caf\xe9"})
        resp = conn.getresponse()
        return resp.status, _json(resp.read().decode())
    finally:
        conn.close()


def nested(depth: int) -> bytes:
    return b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"a":' + b"[" * depth + \
        b"]" * depth + b"}}"


PROBES: dict[str, Probe] = {
    "body that is not JSON": lambda s: s.post(data=b"{not json"),
    "JSON array (batch)": lambda s: s.post([call("ping")]),
    "JSON nested deeper than 200": lambda s: s.post(data=nested(300)),
    "body over `limits.max_body_bytes`": lambda s: s.post(data=b" " * 5000),
    "Content-Type other than": lambda s: s.post(call("ping"), headers={
        "Content-Type": "text/plain"}),
    "Accept without JSON or SSE": lambda s: s.post(call("ping"), headers={
        "Accept": "text/html"}),
    "a body sent with a `Content-Encoding`": lambda s: s.post(
        data=zlib.compress(json.dumps(call("ping")).encode()),
        headers={"Content-Encoding": "deflate"}),
    "no `Mcp-Session-Id`": lambda s: s.post(call("tools/list"), headers={
        "MCP-Protocol-Version": "2025-06-18"}),
    "unknown or ended session": lambda s: s.post(call("tools/list"), headers={
        "Mcp-Session-Id": "no-such-session"}),
    "unsupported `MCP-Protocol-Version`": lambda s: s.in_session(
        call("tools/list"), **{"MCP-Protocol-Version": "1999-01-01"}),
    "Origin not in": lambda s: s.post(call("ping"), headers={"Origin": "http://evil.example"}),
    "a header whose bytes are not UTF-8": lambda s: asyncio.to_thread(non_utf8_header, s),
    "missing or wrong bearer token": lambda s: s.post(call("ping"), headers={
        "Authorization": "Bearer wrong"}),
    "answer to a server request nobody": lambda s: s.in_session(
        {"jsonrpc": "2.0", "id": "never-asked", "result": {}}),
    "`notifications/cancelled` naming no request": lambda s: s.in_session(
        {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 99}}),
    "unknown method": lambda s: s.in_session(call("made/up")),
    "modern request without `_meta`": lambda s: s.post(call("tools/list"), headers={
        "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/list"}),
    "`MCP-Protocol-Version` / `Mcp-Method`": lambda s: s.modern(
        "tools/list", {}, **{"Mcp-Method": "x/y"}),
    "modern request for a version": lambda s: _modern_version(s, "2099-01-01"),
    "modern request for a legacy-only": lambda s: s.modern("ping", {}, **{"Mcp-Method": "ping"}),
    "`params` that is not an object": lambda s: s.in_session(call("tools/call", "echo")),
    "a notification's method sent with an id": lambda s: s.in_session(
        call("notifications/cancelled", {"requestId": 1})),
    "`tasks/*` in a session that did not negotiate": lambda s: s.in_session(
        call("tasks/get", {"taskId": "someone-elses"})),
    "bad `requestState`": lambda s: s.modern("tools/call", {
        "name": "echo", "arguments": {}, "requestState": "forged"}),
}
# Rows that need a stage of their own: the tests that send them (module, function).
ELSEWHERE = {
    "upstream not ready at initialize": (
        "test_supervision", "test_misspelt_command_is_named_at_once_and_retried_with_backoff"),
    "a call beyond `limits.max_calls_per_owner`": (
        "test_modern", "test_modern_calls_in_flight_are_bounded_per_client"),
    "`tasks/*` while the shared task store": (
        "test_replicas", "test_a_store_that_hangs_gets_an_error_not_a_hang"),
    "too many `tasks/*` requests": (
        "test_tasks", "test_rate_limits_per_owner_on_task_requests_and_creation"),
    "body not whole `limits.body_timeout_ms`": (
        "test_serving", "test_a_body_that_never_arrives_whole_is_refused_in_time"),
    "a request line or header longer than": (
        "test_secrets", "test_long_headers_pass_and_longer_ones_are_refused_unechoed"),
    "an upstream's (or the gateway's) error answer to a modern request": (
        "test_upstream_edges",
        "test_an_upstreams_missing_capability_is_400_for_a_modern_client"),
}


async def _modern_version(s: Stage, version: str) -> Outcome:
    body = call("tools/list", {"_meta": {"io.modelcontextprotocol/protocolVersion": version,
                                         "io.modelcontextprotocol/clientCapabilities": {}}})
    return await s.post(body, headers={**headers_for("tools/list", {}),
                                       "MCP-Protocol-Version": version, **AUTH})


def expected(answer: str) -> tuple[int, int | None]:
    """(HTTP status, JSON-RPC code or None) a row's answer column states."""
    if answer.startswith("passed to the server"):
        return 200, -32601
    status = int(re.match(r"\d{3}", answer).group())  # type: ignore[union-attr]
    code = re.search(r"-32\d{3}", answer)
    return status, int(code.group()) if code else None


def probe_for(row: str) -> Probe | None:
    found = [p for key, p in PROBES.items() if row.startswith(key)]
    assert len(found) <= 1, row
    return found[0] if found else None


async def test_every_bad_input_row_gets_the_answer_the_readme_states(gateway, http) -> None:
    url = await gateway(auth={"bearer_tokens": [TOKEN]}, limits={"max_body_bytes": 4096})
    session = McpHttp(http, url)
    await session.initialize(headers=AUTH)
    stage = Stage(http, url, session)
    rows = table()
    assert len(rows) >= 20
    for row, answer in rows:
        probe = probe_for(row)
        if probe is None:
            where = next((w for key, w in ELSEWHERE.items() if row.startswith(key)), None)
            assert where is not None, f"no probe for the table's row: {row}"
            assert callable(getattr(importlib.import_module(where[0]), where[1])), where
            continue
        status, body = await probe(stage)
        want_status, want_code = expected(answer)
        assert status == want_status, (row, status, body)
        if want_code is not None:
            assert body["error"]["code"] == want_code, (row, body)
        if "with `supported` and `requested`" in answer:
            assert {"supported", "requested"} <= set(body["error"]["data"]), body
        if "WWW-Authenticate: Bearer" in answer:
            assert stage.headers["WWW-Authenticate"] == "Bearer", row


@pytest.mark.parametrize("row", [r for r, _ in table()])
def test_every_row_is_checked(row: str) -> None:
    assert probe_for(row) is not None or any(map(row.startswith, ELSEWHERE)), row
