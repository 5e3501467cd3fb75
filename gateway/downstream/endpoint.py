"""One MCP endpoint (a path): reads and checks the request, then hands it to its era.

Era detection is per request (spec 2026-07-28, versioning, dual-era servers): a request whose
`_meta` carries a protocol version is modern; `initialize` and everything of a session is
legacy. Both eras are served side by side on the same path.
"""

from __future__ import annotations

import time

from aiohttp import web

from gateway import errors, router
from gateway.downstream.boundary import (
    ACCEPTS,
    ERROR_TYPE,
    check_accept,
    check_params,
    error_response,
    failed,
    principal_of,
    read_message,
    said,
)
from gateway.downstream.guard import Guard
from gateway.downstream.legacy import LegacyEra
from gateway.downstream.modern import ModernEra
from gateway.errors import GatewayError
from gateway.observability.counters import Counters
from gateway.observability.metrics import Metrics
from gateway.observability.tracing import Tracer, answered
from gateway.protocol import jsonrpc, mcp
from gateway.protocol.jsonrpc import Message
from gateway.settings.schema import Limits


class Endpoint:
    """POST is the one lean path: a plain handler that calls the guard, reads the message and
    hands it to its era; the app runs no middleware (docs/architecture.md, The request
    path). GET and DELETE are routed behind the guard like every other route."""

    def __init__(self, legacy: LegacyEra, modern: ModernEra, guard: Guard, limits: Limits,
                 metrics: Metrics, counters: Counters, tracing: Tracer | None = None
                 ) -> None:
        self.guard = guard
        self.legacy = legacy
        self.modern = modern
        self.max_body_bytes = limits.max_body_bytes
        self.body_s = limits.body_timeout_ms / 1000
        self.upstream = legacy.backend.name
        self.metrics = metrics
        self.counters = counters
        self.tracing = tracing

    async def post(self, request: web.Request) -> web.StreamResponse:
        if (refused := await self.guard.caller(request)) is not None:
            return refused  # not counted as a request: it never reached the endpoint
        started = time.monotonic()
        msg, era, tool_call = None, "legacy", None
        try:
            msg, kind = await read_message(request, self.max_body_bytes, self.body_s)
            if kind != "response":
                check_params(msg)
            # spec (Sending Messages): every POST accepts JSON and SSE; checked before the
            # session or envelope, so a bad Accept is always 406, whatever else is wrong.
            request[ACCEPTS] = check_accept(request, need_json=True)
            if router.is_modern(msg, request.headers.get(mcp.H_PROTOCOL)):
                era = "modern"
            if msg.get("method") == mcp.TOOLS_CALL:  # its name read now: the era may move it
                tool_call = self.metrics.calling((msg.get("params") or {}).get("name"))
            resp = await self._serve(request, msg, kind, era)
        except GatewayError as exc:
            self.counters.refused(exc)
            resp = error_response(exc, msg.get("id") if msg else None)
        except BaseException:  # a fault of the gateway's, or cancelled: the call's mark goes
            if tool_call is not None:
                self.metrics.uncalled(tool_call)
            raise
        method = msg.get("method", "other") if msg else "other"  # a reply to the server: other
        ok, seconds = not failed(resp), time.monotonic() - started
        self.metrics.request(self.upstream, method, era, ok, seconds)
        if tool_call is not None:
            self.metrics.called(self.upstream, tool_call, ok, seconds)
        return resp

    async def _serve(self, request: web.Request, msg: Message, kind: jsonrpc.Kind, era: str
                     ) -> web.StreamResponse:
        serve = self.modern.post if era == "modern" else self.legacy.post
        if self.tracing is None:
            return await serve(request, msg, kind)
        version = f"{request.version.major}.{request.version.minor}"
        with self.tracing.request(msg, era, self.upstream, request.headers,
                                  principal_of(request).owner, version) as span:
            resp = await serve(request, msg, kind)
            answered(span, resp.status, failed(resp), said(resp, ERROR_TYPE))
            return resp

    async def get(self, request: web.Request) -> web.StreamResponse:
        try:
            self._legacy_only(request)
            return await self.legacy.get(request)
        except GatewayError as exc:
            self.counters.refused(exc)
            return error_response(exc)

    async def delete(self, request: web.Request) -> web.StreamResponse:
        try:
            self._legacy_only(request)
            return await self.legacy.delete(request)
        except GatewayError as exc:
            self.counters.refused(exc)
            return error_response(exc)

    @staticmethod
    def _legacy_only(request: web.Request) -> None:
        """GET and DELETE belong to legacy sessions; without one, this is a modern client
        (spec 2026-07-28 Streamable HTTP, Backward Compatibility: 405)."""
        if mcp.H_SESSION not in request.headers or (
                request.headers.get(mcp.H_PROTOCOL) in mcp.MODERN_VERSIONS):
            raise errors.MethodNotAllowed("Method Not Allowed: GET and DELETE serve legacy "
                                          "sessions only; modern clients POST every request")
