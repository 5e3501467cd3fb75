"""Where an upstream gets things wrong or goes away (issue 31, items 2-5): its errors reach
modern clients with the one table's HTTP status, a broken answer ends its call at once, an
HTTP server that forgets its session (400, as the TypeScript SDK says it) or goes away is
found again and shown in /readyz, and the small conformance edges."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from test_http_upstream import basic_http
from test_modern import call, modern


@pytest.fixture(params=["stdio", "http"])
async def url(request, gateway) -> AsyncIterator[str]:
    """The gateway in front of basic.py, over stdio or over Streamable HTTP."""
    if request.param == "stdio":
        yield await gateway()
        return
    async with basic_http() as base:
        yield await gateway(url=base + "/mcp")


# -- item 2: one table of HTTP statuses for modern error responses ---------------------------
async def test_an_upstreams_missing_capability_is_400_for_a_modern_client(url, http,
                                                                          client) -> None:
    """spec 2026-07-28 basic: -32021 "On HTTP, the response status MUST be 400"."""
    needed = {"requiredCapabilities": {"sampling": {}}}
    reply = await call(http, url, "fail", {"code": -32021, "message": "needs sampling",
                                           "data": needed})
    assert reply.status == 400
    assert reply.message["error"] == {"code": -32021, "message": "needs sampling",
                                      "data": needed}
    # The same error of a tool that failed otherwise is an answer: 200.
    other = await call(http, url, "fail", {"code": -32603, "message": "broke"})
    assert (other.status, other.message["error"]["code"]) == (200, -32603)
    # A legacy session is told by JSON-RPC alone, as ever.
    legacy = client(url)
    await legacy.initialize()
    said = await legacy.call("fail", {"code": -32021, "message": "needs sampling"})
    assert said.status == 200 and said.message["error"]["code"] == -32021


async def test_a_bridged_resource_not_found_names_its_uri(url, http) -> None:
    """A legacy -32002 becomes -32602 (400) with data.uri (spec 2026-07-28, sep-2164)."""
    reply = await modern(http, url, "resources/read", {"uri": "test://missing"})
    assert reply.status == 400
    error = reply.message["error"]
    assert (error["code"], error["data"]["uri"]) == (-32602, "test://missing")
