"""Checks and helpers at the HTTP boundary, shared by both eras: Host (peers.py), Origin and
CORS, authentication (gateway/auth/) and its challenges, the operators' routes, Accept and
Content-Type, body size, JSON parsing, and error responses.

Every refusal is a `GatewayError` raised here, rendered once by `error_response`.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from gateway import errors, router
from gateway.auth import ANONYMOUS, Authenticator, Principal
from gateway.auth.operators import Operators
from gateway.auth.replicas import ReplicaSeals, binding, digest
from gateway.auth.resource import WELL_KNOWN
from gateway.auth.throttle import FailedAuths
from gateway.auth.token_exchange import TokenExchanger
from gateway.downstream.origins import Origins
from gateway.downstream.peers import Clients, Hosts, local_peer
from gateway.downstream.screen import Screen
from gateway.errors import GatewayError
from gateway.observability import log
from gateway.observability.counters import Counters
from gateway.observability.tracing import TOOL_ERROR, error_type
from gateway.protocol import jsonrpc, mcp
from gateway.settings.schema import Settings
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
# The operators' routes; /readyz is one only when its detail is asked for (`?detail`).
OPERATOR_PATHS = frozenset({"/status", "/metrics"})


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
    lacking = router.lacking(principal.lacks, policy_for)
    if (refusal := router.scope_refusal(msg, lacking)) is not None:
        raise refusal
    return lacking


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
    return resp.status >= 400 or resp.get(FAILED, False)


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


async def read_message(request: web.Request, max_bytes: int
                       ) -> tuple[dict[str, Any], jsonrpc.Kind]:
    """The POST body as one JSON-RPC message and its kind, or the right GatewayError."""
    ctype = request.headers.get("Content-Type", "")
    if ctype.split(";", 1)[0].strip().lower() != mcp.CT_JSON:
        raise errors.UnsupportedMediaType(
            f"Unsupported Media Type: Content-Type must be {mcp.CT_JSON}")
    if request.content_length is not None and request.content_length > max_bytes:
        raise _too_large(max_bytes)
    body = await _read_body(request, max_bytes)
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


async def _read_body(request: web.Request, max_bytes: int) -> bytes | bytearray:
    """The body, bounded. Unlike `request.read()`, this keeps no cached copy on the request
    for its whole life, and never holds the chunks and their join at once: a proxied
    multi-MiB body is in memory once, and only until it is parsed."""
    body: bytes | bytearray = await request.content.readany()
    if request.content.at_eof() and len(body) <= max_bytes:  # whole in one read: the usual
        return body
    while len(body) <= max_bytes and (chunk := await request.content.readany()):
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


class Guard:
    """Host, Origin, CORS and authentication in front of every route but health probes and
    the protected resource metadata (public, whatever Host a prober sends); operators alone
    on theirs; every authentication failure's challenge and audit event."""

    OPEN_PATHS = frozenset({"/healthz"})  # and /readyz but for its detail: `is_open`

    def __init__(self, conf: Settings, counters: Counters, auth: Authenticator,
                 seals: ReplicaSeals | None = None, *, listener: bool = False) -> None:
        """`seals`: what another replica vouches for on a relayed retry; `listener`: the
        guard of the operator listener (`listen.operator_port`), whose loopback peers may
        be operators (auth/operators.py)."""
        self.counters = counters
        self.seals = seals or ReplicaSeals(None)  # what another replica vouches for
        hosts = Hosts(conf.operator_hosts, addresses=True) if listener else \
            Hosts(conf.allowed_hosts)
        self.screen = Screen(hosts, Origins(conf.security.allowed_origins))
        self.auth = auth
        self.operators = Operators(conf.auth, auth, listener=listener)
        self.failures = FailedAuths(conf.auth.failures_per_minute)
        self.clients = Clients(conf.security.trusted_proxies)

    def is_open(self, request: web.Request) -> bool:
        if request.path == "/readyz":
            return "detail" not in request.query
        return request.path in self.OPEN_PATHS or request.path.startswith(WELL_KNOWN)

    @staticmethod
    def for_operators(request: web.Request) -> bool:
        return request.path in OPERATOR_PATHS or request.path == "/readyz"

    def wrap(self, handler: Handler) -> Handler:
        """`handler` behind the guard. Every route is registered so but the MCP endpoints'
        POST, whose one handler calls `caller` itself: the app has no middleware chain
        (docs/architecture.md, The request path)."""
        async def guarded(request: web.Request) -> web.StreamResponse:
            refused = await self.admit(request)
            return refused if refused is not None else await handler(request)
        return guarded

    async def admit(self, request: web.Request) -> web.StreamResponse | None:
        """None when the request may go on to its route; else the answer it gets."""
        if self.is_open(request):
            return None
        if self.for_operators(request):
            return self._checked(request) or await self._operator(request)
        return await self.caller(request)

    async def caller(self, request: web.Request) -> web.StreamResponse | None:
        """A client's request to an MCP endpoint: None once its Host, headers, Origin and
        credentials pass (its principal recorded); else the refusal (or a CORS preflight's
        answer) it gets."""
        if (refused := self._checked(request)) is not None:
            return refused
        try:
            self.failures.admit(self.clients.address(request))
            principal = await self._principal(request)
            request[PRINCIPAL] = principal
            if lacking := principal.lacks(self.auth.required):
                raise errors.InsufficientScope("this resource", lacking)
        except errors.TooManyFailures as exc:
            return self._throttled(request, exc)
        except errors.Unauthorized as exc:
            return self._failed(request, exc)
        except (errors.InsufficientScope, errors.AuthUnavailable) as exc:
            return self._refuse(exc)
        return None

    async def _principal(self, request: web.Request) -> Principal:
        """Who calls: the principal its credential names, or for a request another replica
        relayed (handoff.py), the one that replica vouches for with the replicas' secret
        (auth/replicas.py; a relayed request carries no client credential)."""
        relayed = request.headers.get(mcp.H_RELAYED)
        if relayed is None:
            return await self.auth.authenticate(request.headers.get(mcp.H_AUTH))
        if request.method != "POST" or mcp.H_SESSION in request.headers:
            # A relay is a modern retry (handoff.py): a POST, of no session; the body digest
            # it is sealed with is checked when a POST's body is read.
            raise errors.Unauthorized("Unauthorized: a replica seal vouches for a relayed "
                                      "POST of no session only", "wrong")
        vouched = self.seals.open(relayed, binding(request.path, request.headers))
        if vouched is None:
            raise errors.Unauthorized("Unauthorized: a relayed request whose replica seal "
                                      "does not open (forged, stale, or used already)",
                                      "wrong")
        request[RELAYED_BODY] = vouched.body
        return vouched.principal

    def _checked(self, request: web.Request) -> web.Response | None:
        """The checks before any credential (screen.py), a refusal answered; a CORS
        preflight's answer."""
        try:
            return self.screen.check(request)
        except errors.ProtocolError as exc:
            return self._refuse(exc)

    async def _operator(self, request: web.Request) -> web.Response | None:
        """An operator's route: operators only (auth/operators.py); a refusal is audited."""
        try:
            self.failures.admit(self.clients.address(request))
            await self.operators.admit(request.headers.get(mcp.H_AUTH), local_peer(request))
        except errors.OperatorOnly as exc:
            self._audit(request, exc)
            return self._refuse(exc)
        except errors.TooManyFailures as exc:
            return self._throttled(request, exc)
        except errors.Unauthorized as exc:
            return self._failed(request, exc)
        except errors.AuthUnavailable as exc:
            return self._refuse(exc)
        request[OPERATOR] = True
        return None

    def _refuse(self, exc: GatewayError) -> web.Response:
        self.counters.refused(exc)
        return error_response(exc)

    def _failed(self, request: web.Request, exc: errors.Unauthorized) -> web.Response:
        """A failed authentication, counted against the client's address (auth/throttle.py;
        behind a trusted proxy, the one it names: downstream/peers.py).
        A request that sent no credential guessed nothing: clients start that way (it is
        how they find the metadata), so it takes nothing."""
        if exc.cause != "missing":
            self.failures.failed(self.clients.address(request))
        return self._refuse(exc)

    def _throttled(self, request: web.Request, exc: errors.TooManyFailures) -> web.Response:
        """429 with Retry-After (RFC 6585 section 4), audited and counted."""
        self._audit(request, exc)
        return self._refuse(exc)  # Retry-After: error_response

    async def on_prepare(self, request: web.Request, response: web.StreamResponse) -> None:
        """CORS headers on every response to an allowed origin, streams included; the
        challenge and the audit event of an authentication or scope failure."""
        origin = request.headers.get(mcp.H_ORIGIN)
        if origin is not None:
            self.screen.origins.expose(response, origin)
        fault = response.get(AUTH_FAULT)
        if fault is not None:
            response.headers["WWW-Authenticate"] = self._challenge(request.path, fault)
            self._audit(request, fault)

    def _challenge(self, path: str, fault: errors.AuthRefusal) -> str:
        resource = self.auth.resource
        if resource is None:
            return "Bearer"  # static tokens only: no metadata to point to
        if isinstance(fault, errors.InsufficientScope):
            return resource.insufficient_scope(path, fault.scopes, fault.message)
        return resource.unauthorized(path, fault.cause, fault.message)

    def _audit(self, request: web.Request, fault: errors.AuthRefusal) -> None:
        """An audit event: why, and who where known (issuer, hashed subject); never what
        was sent (it may be a near-miss token)."""
        who = request.get(PRINCIPAL)
        log.warning("auth.failed", audit=True, path=request.path,
                    remote=self.clients.address(request),
                    reason=fault.cause,
                    issuer=who.issuer if who else None, subject=who.subject if who else None)
