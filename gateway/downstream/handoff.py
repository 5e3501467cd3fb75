"""Handing a request to the replica that holds what it needs: an MRTR retry whose call is
parked on another replica (its sealed requestState names that replica and its
`replica.url`) is sent there, once, and the answer is streamed back as it comes (JSON or SSE
alike). A replica that is gone, or never gave an address, cannot take the retry, and the
client is told to send its request afresh.

Issue 41, item 7: a retry goes only to the address sealed with its state (with a key of
`replica.secret`: the holder's `replica.url`, or its bind address when that names one host
and port), never to one read from the store, which anyone who can write to it could
change; and it carries no credential of the client's: the principal this replica
authenticated goes sealed with the replicas' secret (auth/replicas.py).
"""

from __future__ import annotations

from typing import Any

import aiohttp
from aiohttp import web

from gateway import errors
from gateway.auth.principal import Principal
from gateway.auth.replicas import ReplicaSeals, binding
from gateway.observability import log
from gateway.protocol import jsonrpc, mcp

RELAYED = mcp.H_RELAYED  # set on a relayed request: it is never relayed again
# What the owning replica needs to check the request as the client sent it; never the
# client's credential (`Authorization`): the seal in RELAYED stands for it.
PASSED = ("Content-Type", "Accept", "MCP-Protocol-Version", "Mcp-Method", "Mcp-Name", "Origin")
GONE = ("Invalid requestState: the gateway replica holding that request cannot be reached; "
        "send it again without requestState")


class Handoff:
    def __init__(self, seals: ReplicaSeals) -> None:
        self.seals = seals
        self._http: aiohttp.ClientSession | None = None

    async def to(self, replica: str, url: str | None, request: web.Request,
                 msg: dict[str, Any], principal: Principal) -> web.StreamResponse:
        """`url`: where the holder said it is reached, sealed with the state; without one,
        nowhere (the store's word for an address is not taken: see the module's doc)."""
        if RELAYED in request.headers or not url:
            if not url:
                log.info("relay.no_address", replica=replica)
            raise errors.InvalidParams(GONE)
        headers = {k: v for k in PASSED if (v := request.headers.get(k)) is not None}
        body = jsonrpc.dumps(msg)
        headers[RELAYED] = self.seals.seal(principal, replica,
                                           binding(request.path, request.headers), body)
        try:
            async with self._session().post(url + request.path, data=body,
                                            headers=headers) as answer:
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
