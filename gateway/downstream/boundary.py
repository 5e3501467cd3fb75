"""Checks and helpers at the HTTP boundary, shared by both eras: what the guard (guard.py:
Host, Origin and CORS, authentication and its challenges, the operators' routes) records on
a request and a response, Accept and Content-Type, body size, JSON parsing, scopes per tool,
and error responses.

Every refusal is a `GatewayError` raised where its fault is known, rendered once by
`error_response`.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from aiohttp import StreamReader, web

from gateway import errors, router
from gateway.auth import ANONYMOUS, Principal
from gateway.auth.replicas import digest
from gateway.auth.token_exchange import TokenExchanger
from gateway.errors import GatewayError
from gateway.observability.tracing import TOOL_ERROR, error_type
from gateway.protocol import jsonrpc, mcp
from gateway.tasks import keys
from gateway.tasks.dialects import Lacking
from gateway.tasks.keys import CallKey
from gateway.tasks.model import Dialect
from gateway.upstream.isolation import Backend

JSON_HEADERS = {"Content-Type": mcp.CT_JSON}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
PRINCIPAL = web.RequestKey("principal", Principal)  # who is calling (gateway/auth/)
# A relayed request's: the digest of the body its replica seal vouches for (auth/replicas.py)
RELAYED_BODY = web.RequestKey("relayed_body", str)
# (JSON allowed, SSE allowed) for a POST: its Accept, checked once by the endpoint.
ACCEPTS = web.RequestKey("accepts", tuple[bool, bool])
# Set on a response that carries a JSON-RPC error (its HTTP status may still be 200): the
# request's outcome in metrics.
FAILED = web.ResponseKey("failed", bool)
# Set on a response whose answer failed (a JSON-RPC error, or a tool's isError result): how,
# as the semconv error.type its request's trace span records (tracing.error_type).
ERROR_TYPE = web.ResponseKey("error_type", str)
# Set on a 401/403 of authentication or scopes: the guard adds its challenge and audit event.
AUTH_FAULT = web.ResponseKey("auth_fault", errors.AuthRefusal)
AUTH_FAULTS = (errors.Unauthorized, errors.InsufficientScope)
# Set once the guard admitted an operator (auth/operators.py): what only operators may read.
OPERATOR = web.RequestKey("operator", bool)
T = TypeVar("T")


def principal_of(request: web.Request) -> Principal:
    principal: Principal = request.get(PRINCIPAL, ANONYMOUS)
    return principal


def json_response(msg: Any, status: int = 200, headers: dict[str, str] | None = None
                  ) -> web.Response:
    resp = web.Response(body=jsonrpc.dumps(msg), status=status,
                        headers={**JSON_HEADERS, **headers} if headers else JSON_HEADERS)
    mark(resp, error_type(msg) if isinstance(msg, dict) else None)
    return resp


def mark(resp: web.StreamResponse, kind: str | None) -> web.StreamResponse:
    """`resp`, marked with how its answer failed (`kind`: tracing.error_type), if it did: a
    JSON-RPC error counts as failed in metrics; a tool's isError result is the tool's
    answer, only the trace records it."""
    if kind is not None:
        resp[ERROR_TYPE] = kind
        if kind != TOOL_ERROR:
            resp[FAILED] = True
    return resp


def call_key(request: web.Request, msg: dict[str, Any], owner: str, upstream: str,
             dialect: Dialect) -> CallKey | None:
    """A tools/call's Idempotency-Key, as `owner`'s for a task of `dialect` (tasks/keys.py),
    None without one (or for another method: the header names calls only);
    BadIdempotencyKey (400) when it cannot be kept."""
    params = msg.get("params")
    if msg["method"] != mcp.TOOLS_CALL or not isinstance(params, dict):
        return None
    key = keys.parse(request.headers.getall(keys.HEADER, []))
    return None if key is None else CallKey.of(owner, key, upstream, dialect, params)


def scopes_checked(request: web.Request, msg: dict[str, Any], policy_for: router.PolicyFor
                   ) -> Lacking | None:
    """What the request's token lacks of each tool's scopes, None when it is not scoped (a
    static token, or no auth: every tool is open to it); InsufficientScope (403) when the
    request is a tools/call of a tool it may not call."""
    principal = principal_of(request)
    if principal.scopes is None:
        return None
    if (refusal := router.scope_refusal(msg, principal.lacks, policy_for)) is not None:
        raise refusal
    return router.lacking(principal.lacks, policy_for)


def metadata_handler(document: dict[str, Any]) -> Handler:
    """Serves a fixed public JSON document to anyone, from any origin (clients discover
    the authorization server from it before they hold a token)."""
    body = jsonrpc.dumps(document)
    headers = {**JSON_HEADERS, "Access-Control-Allow-Origin": "*",
               "Cache-Control": "max-age=3600"}

    async def handler(_: web.Request) -> web.StreamResponse:
        return web.Response(body=body, headers=headers)
    return handler


def failed(resp: web.StreamResponse) -> bool:
    """Whether the answer was an error: an HTTP error status, or a JSON-RPC error."""
    return resp.status >= 400 or said(resp, FAILED) is True


def said(resp: web.StreamResponse, key: web.ResponseKey[T]) -> T | None:
    """What `resp` is marked with under `key`, None if nothing: read from its state, as its
    Mapping mixin's `get` would, but without raising and catching a KeyError for a key not
    set (an answer that did not fail: twice a request)."""
    value: T | None = resp._state.get(key)
    return value


def error_response(exc: GatewayError, id_: jsonrpc.RequestId | None = None) -> web.Response:
    resp = json_response(exc.to_message(id_), exc.http_status)
    if exc.retry_after_s is not None:  # RFC 9110 section 10.2.3: whole seconds
        resp.headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after_s)))
    if isinstance(exc, AUTH_FAULTS):
        resp[AUTH_FAULT] = exc  # the challenge is the guard's (it knows the resource)
    return resp


def check_accept(request: web.Request, *, need_json: bool) -> tuple[bool, bool]:
    """(json allowed, SSE allowed) from Accept; NotAcceptable when neither is usable.

    spec (Sending Messages): clients MUST list both; a missing header or */* counts as both.
    """
    accept = request.headers.get(mcp.H_ACCEPT, "*/*")
    anything = "*/*" in accept
    json_ok = anything or mcp.CT_JSON in accept or "application/*" in accept
    sse_ok = anything or mcp.CT_SSE in accept or "text/*" in accept
    if not (sse_ok or (need_json and json_ok)):
        wanted = f"{mcp.CT_JSON} and {mcp.CT_SSE}" if need_json else mcp.CT_SSE
        raise errors.NotAcceptable(f"Not Acceptable: the client must accept {wanted}")
    return json_ok, sse_ok


async def read_message(request: web.Request, max_bytes: int, body_s: float = 30.0
                       ) -> tuple[dict[str, Any], jsonrpc.Kind]:
    """The POST body as one JSON-RPC message and its kind, or the right GatewayError."""
    ctype = request.headers.get("Content-Type", "")
    if ctype.split(";", 1)[0].strip().lower() != mcp.CT_JSON:
        raise errors.UnsupportedMediaType(
            f"Unsupported Media Type: Content-Type must be {mcp.CT_JSON}")
    if (length := request.content_length) is not None and length > max_bytes:
        raise _too_large(max_bytes)
    body = await _read_body(request, max_bytes, body_s)
    if (vouched := request.get(RELAYED_BODY)) is not None and digest(body) != vouched:
        raise errors.Unauthorized("Unauthorized: a relayed request whose body is not the "
                                  "one its replica seal vouches for", "wrong")
    size = len(body)
    try:
        msg = jsonrpc.loads(body)
    except jsonrpc.JSONDecodeError as exc:
        raise errors.ParseError(f"Parse error: {exc}") from None
    if isinstance(msg, list):
        # Protocol 2025-06-18 removed JSON-RPC batching; one message per POST.
        raise errors.InvalidRequest("Invalid Request: batches are not supported; "
                                    "send one JSON-RPC message per POST")
    kind = jsonrpc.classify(msg)
    if kind is None:
        raise errors.InvalidRequest("Invalid Request: not a JSON-RPC 2.0 request, "
                                    "notification or response")
    del body  # parsed: a multi-MiB body is held once
    if jsonrpc.too_deep(msg, size):  # checked here, once: the gateway re-serializes it
        raise errors.InvalidRequest(f"Invalid Request: nested deeper than {jsonrpc.MAX_DEPTH} "
                                    "levels, more than the gateway forwards")
    return msg, kind


def check_params(msg: dict[str, Any]) -> None:
    """MCP's params are objects (JSON-RPC 2.0 allows arrays; no MCP method takes one):
    anything else is -32602 here, once, so nothing further on meets another type. An
    explicit null is taken as no params. A notification's method sent as a request (with
    an id) is refused: passed on, a server dispatching on the name would act on it (a
    `notifications/cancelled` naming another caller's request id, say)."""
    if "id" in msg and msg["method"].startswith("notifications/"):
        raise errors.InvalidRequest(f"Invalid Request: {msg['method']} is a notification; "
                                    "send it without an id")
    params = msg.get("params", msg)
    if params is None:
        del msg["params"]
    elif params is not msg and not isinstance(params, dict):
        raise errors.InvalidParams(f"Invalid params: params must be an object, not "
                                   f"{errors.shown(params)}")


async def _read_body(request: web.Request, max_bytes: int, body_s: float
                     ) -> bytes | bytearray:
    """The body, bounded in size and in time (`body_s`: a client sending it slowly, or
    never, holds a connection no longer). Unlike `request.read()`, this keeps no cached
    copy on the request for its whole life, and never holds the chunks and their join at
    once: a proxied multi-MiB body is in memory once, and only until it is parsed."""
    content = request.content
    if content.is_eof():  # arrived whole (the usual): read with no timer armed
        body = await content.readany()
        if content.at_eof() and len(body) <= max_bytes:  # in one read
            return body
        return await _rest(content, body, max_bytes)
    try:
        async with asyncio.timeout(body_s):
            return await _rest(content, await content.readany(), max_bytes)
    except TimeoutError:
        raise errors.BodyTimeout(f"Request Timeout: the body did not arrive within "
                                 f"{body_s:g} s") from None


async def _rest(content: StreamReader, body: bytes | bytearray, max_bytes: int
                ) -> bytes | bytearray:
    """The rest of a body whose first part is `body`, bounded."""
    while len(body) <= max_bytes and (chunk := await content.readany()):
        if isinstance(body, bytes):
            body = bytearray(body)
        body += chunk
    if len(body) > max_bytes:  # chunked bodies carry no Content-Length to check up front
        raise _too_large(max_bytes)
    return body


def _too_large(limit: int) -> errors.PayloadTooLarge:
    return errors.PayloadTooLarge(f"Payload Too Large: the body exceeds {limit} bytes",
                                  {"maxBytes": limit})


class UpstreamHeaders:
    """The headers a client request gives its upstream call: those the backend forwards,
    and with `token_exchange` the caller's token traded for the upstream's (RFC 8693; the
    caller's own token is never among them unless `forward_headers` names it)."""

    def __init__(self, backend: Backend, exchanger: TokenExchanger | None) -> None:
        self.backend = backend
        self.exchanger = exchanger

    async def of(self, request: web.Request) -> dict[str, str] | None:
        headers = self.backend.client_headers(request.headers)
        token = principal_of(request).token
        if self.exchanger is None or token is None:
            return headers
        exchanged = await self.exchanger.token_for(token)
        return {**(headers or {}), "Authorization": f"Bearer {exchanged}"}
