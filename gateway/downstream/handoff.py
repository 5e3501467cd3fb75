"""Handing a request to the replica that holds what it needs: an MRTR retry whose call is
parked on another replica (its sealed requestState names that replica and its
`replica.url`) is sent there, once, and the answer is streamed back as it comes (JSON or SSE
alike). The address comes sealed with the state, so a store outage does not stop MRTR
rounds; a state without one is looked up in the holder's lease. A replica that is gone, or
never gave an address, cannot take the retry, and the client is told to send its request
afresh.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web

from gateway import errors
from gateway.observability import log
from gateway.protocol import jsonrpc

RELAYED = "Mcp-Gateway-Relayed"  # set on a relayed request: it is never relayed again
# What the owning replica needs to check the request as the client sent it.
PASSED = ("Content-Type", "Accept", "Authorization", "MCP-Protocol-Version", "Mcp-Method",
          "Mcp-Name", "Origin")
GONE = ("Invalid requestState: the gateway replica holding that request cannot be reached; "
        "send it again without requestState")


Address = Callable[[str], Awaitable[str | None]]  # a replica -> where it is reached


class Handoff:
    def __init__(self, address: Address) -> None:
        self.address = address
        self._http: aiohttp.ClientSession | None = None

    async def to(self, replica: str, url: str | None, request: web.Request,
                 msg: dict[str, Any]) -> web.StreamResponse:
        """`url`: where the holder said it is reached, sealed with the state; else its
        lease tells."""
        if RELAYED in request.headers:
            raise errors.InvalidParams(GONE)
        address = url or await self.address(replica)
        if address is None:
            raise errors.InvalidParams(GONE)
        headers = {k: v for k in PASSED if (v := request.headers.get(k)) is not None}
        try:
            async with self._session().post(address + request.path, data=jsonrpc.dumps(msg),
                                            headers={**headers, RELAYED: "1"}) as answer:
                resp = web.StreamResponse(status=answer.status, headers={
                    k: v for k in ("Content-Type", "Cache-Control")
                    if (v := answer.headers.get(k)) is not None})
                await resp.prepare(request)
                async for chunk in answer.content.iter_any():
                    await resp.write(chunk)
                await resp.write_eof()
                return resp
        except aiohttp.ClientConnectionError as exc:
            log.warning("relay.failed", replica=replica, error=type(exc).__name__)
            raise errors.InvalidParams(GONE) from None

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(
                total=None, connect=3))
        return self._http

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
