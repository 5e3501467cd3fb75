"""One MCP endpoint (a path): reads and checks the request, then hands it to its era.

Era detection is per request (spec 2026-07-28, versioning): a request whose `_meta` carries a
protocol version is modern; everything else, starting with `initialize`, is legacy.
"""

from __future__ import annotations

from aiohttp import web

from gateway.downstream.http import error_response, read_message
from gateway.downstream.legacy import LegacyEra
from gateway.errors import GatewayError


class Endpoint:
    def __init__(self, legacy: LegacyEra, max_body_bytes: int) -> None:
        self.legacy = legacy
        self.max_body_bytes = max_body_bytes

    async def post(self, request: web.Request) -> web.StreamResponse:
        msg = None
        try:
            msg = await read_message(request, self.max_body_bytes)
            return await self.legacy.post(request, msg)
        except GatewayError as exc:
            return error_response(exc, msg.get("id") if msg else None)

    async def get(self, request: web.Request) -> web.StreamResponse:
        try:
            return await self.legacy.get(request)
        except GatewayError as exc:
            return error_response(exc)

    async def delete(self, request: web.Request) -> web.StreamResponse:
        try:
            return await self.legacy.delete(request)
        except GatewayError as exc:
            return error_response(exc)
