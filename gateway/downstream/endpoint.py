"""One MCP endpoint (a path): reads and checks the request, then hands it to its era.

Era detection is per request (spec 2026-07-28, versioning, dual-era servers): a request whose
`_meta` carries a protocol version is modern; `initialize` and everything of a session is
legacy. Both eras are served side by side on the same path.
"""

from __future__ import annotations

from aiohttp import web

from gateway import errors, router
from gateway.downstream.http import error_response, read_message
from gateway.downstream.legacy import LegacyEra
from gateway.downstream.modern import ModernEra
from gateway.errors import GatewayError
from gateway.protocol import mcp


class Endpoint:
    def __init__(self, legacy: LegacyEra, modern: ModernEra, max_body_bytes: int) -> None:
        self.legacy = legacy
        self.modern = modern
        self.max_body_bytes = max_body_bytes

    async def post(self, request: web.Request) -> web.StreamResponse:
        msg = None
        try:
            msg, kind = await read_message(request, self.max_body_bytes)
            if router.is_modern(msg, request.headers.get(mcp.H_PROTOCOL)):
                return await self.modern.post(request, msg, kind)
            return await self.legacy.post(request, msg, kind)
        except GatewayError as exc:
            return error_response(exc, msg.get("id") if msg else None)

    async def get(self, request: web.Request) -> web.StreamResponse:
        try:
            self._legacy_only(request)
            return await self.legacy.get(request)
        except GatewayError as exc:
            return error_response(exc)

    async def delete(self, request: web.Request) -> web.StreamResponse:
        try:
            self._legacy_only(request)
            return await self.legacy.delete(request)
        except GatewayError as exc:
            return error_response(exc)

    @staticmethod
    def _legacy_only(request: web.Request) -> None:
        """GET and DELETE belong to legacy sessions; without one, this is a modern client
        (spec 2026-07-28 Streamable HTTP, Backward Compatibility: 405)."""
        if mcp.H_SESSION not in request.headers or (
                request.headers.get(mcp.H_PROTOCOL) in mcp.MODERN_VERSIONS):
            raise errors.MethodNotAllowed("Method Not Allowed: GET and DELETE serve legacy "
                                          "sessions only; modern clients POST every request")
