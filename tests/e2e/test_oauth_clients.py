"""The SDKs' own OAuth clients against the gateway and node's oidc-provider: from a bare 401
through protected resource metadata, authorization server discovery, dynamic client
registration and the authorization code flow with PKCE (the login and consent pages played
over HTTP) to a tool call and a task; then the access token expires, the client refreshes
it, and the task's result is read with the new token."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from conftest import NODE_BIN, free_port, node_env, settings_for, wait_until_ready
from consent import authorize
from idp import Idp, Key
from mcp import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client
from mcp.shared.auth import (
    AuthorizationCodeResult,
    OAuthClientInformationFull,
    OAuthClientMetadata,
    OAuthToken,
)
from mcp_http import ACCEPT_BOTH
from test_modern import envelope
from test_tasks import POLICY, TASKS

from gateway.app import create_app
from gateway.settings.load import from_mapping

pytestmark = pytest.mark.node
REDIRECT = "http://localhost:3030/callback"
TOKEN_TTL_S = 3


@pytest.fixture
async def resource(aiohttp_server: Any) -> AsyncIterator[tuple[str, Idp]]:
    """A gateway whose resource is its own URL, and an authorization server whose access
    tokens live TOKEN_TTL_S."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    idp = Idp(free_port(), url, Key("k1"), ttl_s=TOKEN_TTL_S).start()
    # Every request needs `tools`: the clients learn it from the challenge and the metadata
    # (oidc-provider denies a request that names no scope at all).
    conf = settings_for(tasks=POLICY, auth={"oauth": {"resource": url, "issuers": [idp.issuer],
                                                      "scopes": ["tools"], "leeway_s": 0}})
    server = await aiohttp_server(create_app(from_mapping(conf)), port=port)
    await wait_until_ready(str(server.make_url("")))
    yield url, idp
    idp.close()


class Storage:
    """The SDK's TokenStorage, in memory; remembers every access token it was given."""

    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client: OAuthClientInformationFull | None = None
        self.seen: list[str] = []

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens
        self.seen.append(tokens.access_token)

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client = client_info


def python_provider(url: str, storage: Storage) -> OAuthClientProvider:
    codes: asyncio.Queue[dict[str, str]] = asyncio.Queue()

    async def redirect(auth_url: str) -> None:  # the "browser": log in, consent
        codes.put_nowait(await authorize(auth_url, REDIRECT))

    async def callback() -> AuthorizationCodeResult:
        query = await codes.get()
        return AuthorizationCodeResult(code=query["code"], state=query.get("state"),
                                       iss=query.get("iss"))

    metadata = OAuthClientMetadata(
        client_name="gateway-tests", redirect_uris=[REDIRECT], response_types=["code"],
        grant_types=["authorization_code", "refresh_token"], token_endpoint_auth_method="none")
    return OAuthClientProvider(url, metadata, storage, redirect, callback)


async def modern_post(http: Any, url: str, method: str, params: dict[str, Any]) -> Any:
    body = {"jsonrpc": "2.0", "id": 1, "method": method,
            "params": {**params, "_meta": envelope(TASKS)}}
    headers = {"Accept": ACCEPT_BOTH, "MCP-Protocol-Version": "2026-07-28",
               "Mcp-Method": method, "Mcp-Name": params.get("name", params.get("taskId"))}
    reply = await http.post(url, content=json.dumps(body), headers={
        **headers, "Content-Type": "application/json"})
    assert reply.status_code == 200, reply.text
    return reply.json()["result"]


async def test_python_sdk_oauth_client_from_401_to_a_task_across_a_refresh(resource) -> None:
    url, _ = resource
    storage = Storage()
    async with create_mcp_http_client(auth=python_provider(url, storage)) as http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            echoed = await client.call_tool("echo", {"text": "authorized"})
            assert echoed.content[0].text == "authorized"
        assert storage.client is not None and storage.client.client_id  # registered itself
        assert storage.tokens is not None and storage.tokens.refresh_token
        task = await modern_post(http, url, "tools/call",
                                 {"name": "sleep", "arguments": {"ms": 4000}})
        assert task["resultType"] == "task"
        first = storage.seen[-1]
        await asyncio.sleep(TOKEN_TTL_S + 2)  # the access token expires meanwhile
        for _ in range(50):
            got = await modern_post(http, url, "tasks/get", {"taskId": task["taskId"]})
            if got["status"] == "completed":
                break
            await asyncio.sleep(0.2)
        assert got["result"]["content"][0]["text"] == "slept 4000"
        assert storage.seen[-1] != first  # read with a refreshed token


async def test_typescript_sdk_oauth_client_from_401_to_a_task_across_a_refresh(resource
                                                                                ) -> None:
    url, _ = resource
    wait_ms = (TOKEN_TTL_S + 2) * 1000
    proc = await asyncio.create_subprocess_exec(
        str(NODE_BIN / "node"), str(NODE_BIN.parents[1] / "oauth.mjs"), url, str(wait_ms),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=node_env())
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()[-2000:]
    assert json.loads(out) == {
        "firstTry": "unauthorized", "registered": True, "echo": "ts authorized",
        "created": "working", "status": "completed", "result": f"slept {wait_ms + 1000}",
        "refreshed": True}
