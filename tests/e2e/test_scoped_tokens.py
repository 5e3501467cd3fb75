"""Static tokens with scopes (issue 53, item 2): `auth.bearer_tokens` entries may be
`{token, scopes, name}`, so `tasks.tools.<pattern>.scopes` curates each token's tools
without an identity provider: what it cannot call it does not see, in either era, and a
call to it is refused (403 insufficient_scope) as a core task too; a plain string token
keeps every scope; `name` labels the principal in audit events, never the token."""

from __future__ import annotations

from typing import Any

import structlog
from mcp_http import McpHttp
from test_modern import modern

READER = "reader-token-0123456789abcdef0123456789"
WRITER = "writer-token-0123456789abcdef0123456789"
TOKENS = [{"token": READER, "scopes": ["read"], "name": "team-read"}, WRITER]
TOOLS = {"echo": {"scopes": ["read"]}, "sleep": {"scopes": ["write"], "mode": "always"}}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def listed(http, url: str, token: str) -> set[str]:
    reply = await modern(http, url, "tools/list", {}, headers=bearer(token))
    # spec 2026-07-28 (caching): a list filtered per caller is private, never public.
    assert reply.body["result"]["cacheScope"] == "private"
    return {t["name"] for t in reply.body["result"]["tools"]}


async def test_each_token_sees_and_calls_its_own_tool_set(gateway, http) -> None:
    # Lists said public by the settings are private once filtered per token (`listed`).
    url = await gateway(auth={"bearer_tokens": TOKENS}, tasks={"tools": TOOLS},
                        caching={"scope": "public"})
    reader, writer = await listed(http, url, READER), await listed(http, url, WRITER)
    assert "echo" in reader and "sleep" not in reader and "whoami" in reader  # unscoped: all
    assert {"echo", "sleep", "whoami"} <= writer
    with structlog.testing.capture_logs() as events:
        refused = await modern(http, url, "tools/call", {"name": "sleep", "arguments": {
            "ms": 1}}, headers=bearer(READER))
    assert refused.status == 403 and refused.body["error"]["data"] == {
        "requiredScopes": ["write"]}
    # RFC 6750 section 3.1: the challenge says why and what to ask for (no metadata here).
    assert refused.headers["WWW-Authenticate"] == 'Bearer error="insufficient_scope", scope="write"'
    said = [e for e in events if e["event"] == "auth.failed"]
    assert said and said[0]["subject"] == "team-read"
    assert READER not in str(events)
    done = await modern(http, url, "tools/call", {"name": "echo", "arguments": {
        "text": "mine"}}, headers=bearer(READER))
    assert done.body["result"]["content"][0]["text"] == "mine"
    slept = await modern(http, url, "tools/call", {"name": "sleep", "arguments": {"ms": 1}},
                         headers=bearer(WRITER))
    assert slept.status == 200, slept.body


async def test_a_legacy_session_and_a_core_task_are_curated_alike(gateway, http) -> None:
    url = await gateway(auth={"bearer_tokens": TOKENS}, tasks={"tools": TOOLS})
    reader = McpHttp(http, url)
    await reader.initialize({"tasks": {}}, version="2025-11-25", headers=bearer(READER))
    tools = await reader.send({"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
                              **bearer(READER))
    assert "sleep" not in {t["name"] for t in tools.body["result"]["tools"]}
    task: dict[str, Any] = {"name": "sleep", "arguments": {"ms": 1}, "task": {}}
    refused = await reader.send({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                                 "params": task}, **bearer(READER))
    assert refused.status == 403


async def test_status_names_each_named_token_never_the_token(gateway, http) -> None:
    """/status labels a named static token's principal by its name and scopes, with what it
    holds here (a task running, a legacy session); the token itself is never shown."""
    admin = "admin-token-0123456789abcdef0123456789ab"
    tokens = [TOKENS[0], {"token": WRITER, "scopes": ["read", "write"], "name": "team-write"}]
    url = await gateway(auth={"bearer_tokens": tokens, "admin_tokens": [admin]},
                        tasks={"tools": TOOLS})
    reader = McpHttp(http, url)
    await reader.initialize({}, version="2025-06-18", headers=bearer(READER))
    started = await modern(http, url, "tools/call", {"name": "sleep", "arguments": {
        "ms": 5000}}, {"extensions": {"io.modelcontextprotocol/tasks": {}}},
        headers=bearer(WRITER))
    assert started.body["result"]["resultType"] == "task", started.body
    async with http.get(url.replace("/mcp", "/status"), headers=bearer(admin)) as page:
        html = await page.text()
    assert page.status == 200
    table = html.split("<table id=principals>", 1)[1].split("</table>", 1)[0]
    assert "<td>team-read</td><td>read</td><td>0</td><td>1</td>" in table
    assert "<td>team-write</td><td>read write</td><td>1</td><td>0</td>" in table
    assert READER not in html and WRITER not in html
