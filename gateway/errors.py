"""Every error the gateway raises on purpose, modelled once: JSON-RPC code, message, data and
the HTTP status that carries it.

    GatewayError                      -32603  500
    ├── ProtocolError                 -32600  400   bad input at the HTTP/JSON-RPC boundary
    │   ├── ParseError                -32700  400   body is not JSON
    │   ├── InvalidRequest            -32600  400   not a single JSON-RPC message
    │   ├── SessionRequired           -32600  400   no Mcp-Session-Id
    │   ├── SessionNotFound           -32600  404   unknown or ended session
    │   ├── UnsupportedVersion        -32600  400   MCP-Protocol-Version we do not speak
    │   ├── NotAcceptable             -32600  406   Accept excludes what we must send
    │   ├── UnsupportedMediaType      -32600  415   POST body is not application/json
    │   ├── MethodNotAllowed          -32600  405   GET/DELETE without a legacy session
    │   ├── PayloadTooLarge           -32600  413   body over limits.max_body_bytes
    │   ├── BodyTimeout               -32600  408   body not whole in limits.body_timeout_ms
    │   ├── ForbiddenOrigin           -32600  403   Origin not in security.allowed_origins
    │   ├── MisdirectedRequest        -32600  421   Host not in security.allowed_hosts
    │   ├── InvalidParams             -32602  400   a modern envelope field is missing or bad
    │   ├── MethodNotFound            -32601  404   not a method of the modern era
    │   ├── HeaderMismatch            -32020  400   Mcp-* headers disagree with the body
    │   ├── MissingCapability         -32021  400   the request lacks a needed capability
    │   ├── UnsupportedModernVersion  -32022  400   protocol version we do not speak
    │   ├── TooManyListeners          -32600  429   listen streams over the per-owner bound
    │   ├── BadIdempotencyKey         -32600  400   an Idempotency-Key too long or odd
    │   ├── IdempotencyKeyReused      -32602  422   a key reused for another call
    │   └── TooManyRequests           -32000  429   a per-owner rate limit (retryAfterMs)
    ├── AuthRefusal                   -32600        reason "auth"; why in `cause` (a word)
    │   ├── Unauthorized              -32600  401   no valid bearer or access token
    │   ├── InsufficientScope         -32600  403   the token lacks a scope this needs
    │   ├── OperatorOnly              -32600  403   an operator's route, and not an operator
    │   ├── TooManyFailures           -32000  429   too many failed authentications from
    │   │                                           the client's address (retryAfterMs)
    │   └── AuthUnavailable           -32603  503   the authorization server does not answer
    ├── TooManySessions               -32603  503   no room for another legacy session
    ├── QueueFull                     -32000  503   a concurrency limit's queue is full
    │                                               (legacy sessions: 200; retryAfterMs)
    ├── GatewayStopping               -32000  503   the gateway drains: no new tools/call
    │                                               (reason "shutdown"; Retry-After)
    ├── AnswersOverBudget             -32000  200   the call's answer would take its principal
    │                                               past its bytes of answers not yet read
    ├── UpstreamError                 -32603  200   the upstream failed this call (sent as a
    │   │                                           JSON-RPC response, so HTTP stays 200);
    │   │                                           by category, one kind per data `reason`:
    │   ├── UpstreamUnavailable                     no server took the call:
    │   │   ├── UpstreamDown                        down: not running, nothing sent
    │   │   ├── UpstreamNotReady                    not_ready: not ready in time
    │   │   ├── UpstreamStartFailed                 start_failed: its command did not start
    │   │   ├── UpstreamUnreachable                 unreachable: its connection failed
    │   │   ├── UpstreamConnectionFailed            connection: an HTTP request unanswered
    │   │   └── TooManyProcesses      -32000        processes: no server process for it
    │   │                                           within limits.max_processes or the
    │   │                                           principal's share (initialize: 503)
    │   ├── UpstreamBroken                          the server broke off the exchange:
    │   │   ├── UpstreamInitializeFailed            initialize: the handshake failed
    │   │   ├── UpstreamExited                      exited: its process exited
    │   │   ├── UpstreamSessionLost                 session_lost: it ended its session
    │   │   └── UpstreamTooLarge                    too_large: an answer over
    │   │                                           limits.max_message_bytes
    │   ├── UpstreamTimeout                         timeout: request_timeout_ms passed
    │   └── UpstreamShutdown                        shutdown: the gateway stops
    ├── StoreUnavailable              -32603  503   the shared task store does not answer
    └── StoreSettling                 -32000  503   the store came back without its records
                                                    and this id may be one not written back
                                                    yet: retry (retryAfterMs, Retry-After)

Raise where the fault is known; the transport turns the error into a response with
`to_message(id)` and `http_status`. A class that names its JSON-RPC code and no status
takes its code's status from the one table of modern statuses (`mcp.MODERN_ERROR_STATUS`,
also used for what an upstream answers: `GatewayError.__init_subclass__`); the rest are
refusals at the HTTP boundary (401, 403, 405, 406, 413, 415, 421, 429) or the gateway's own
state (503), whose status is their own.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import orjson

from gateway import redact
from gateway.protocol import jsonrpc, mcp

SERVER_ERROR = -32000  # JSON-RPC's range for implementation-defined server errors
SHOWN_CHARS = 80

# Why the gateway refused a request to protect itself: mcp_gateway_rejections_total{reason}.
Rejection = Literal["body_too_large", "body_timeout", "origin", "host", "auth", "listeners",
                    "sessions", "rate_limit", "calls_in_flight", "parked", "store_full",
                    "queue_full", "processes", "answer_bytes"]
# Why an authentication or authorization failed (the rejection's `cause` label and the
# audit event's `reason`): why, never what was sent.
AuthCause = Literal["missing", "wrong", "malformed", "expired", "not_yet_valid", "audience",
                    "issuer", "signature", "claims", "algorithm", "typ", "unknown_key",
                    "inactive", "scope", "operator", "rate", "unavailable"]


def shown(value: Any) -> str:
    """A value the client sent, for an error text: as JSON (`null`, never Python's `None`),
    cut short."""
    try:
        text = orjson.dumps(value).decode()
    except TypeError:
        text = str(value)
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS - 3] + "..."


class GatewayError(Exception):
    code: ClassVar[int] = jsonrpc.INTERNAL_ERROR
    http_status: ClassVar[int] = 500
    # A refusal that protects the gateway, counted in mcp_gateway_rejections_total{reason}.
    reason: ClassVar[Rejection | None] = None
    retry_after_s: float | None = None  # when set, the HTTP answer carries Retry-After

    def __init_subclass__(cls) -> None:
        """A kind that names its code and not its status answers with its code's status
        from the one table (mcp.MODERN_ERROR_STATUS), so no status is copied here."""
        super().__init_subclass__()
        if "code" in vars(cls) and "http_status" not in vars(cls):
            cls.http_status = mcp.modern_error_status(cls.code)

    def __init__(self, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.data = data

    def to_message(self, id_: jsonrpc.RequestId | None = None) -> jsonrpc.Message:
        return jsonrpc.error(id_, self.code, self.message, self.data)


class ProtocolError(GatewayError):
    code = jsonrpc.INVALID_REQUEST


class ParseError(ProtocolError):
    code = jsonrpc.PARSE_ERROR


class InvalidRequest(ProtocolError):
    pass


class SessionRequired(ProtocolError):
    pass


class SessionNotFound(ProtocolError):
    http_status = 404


class UnsupportedVersion(ProtocolError):
    pass


class NotAcceptable(ProtocolError):
    http_status = 406


class UnsupportedMediaType(ProtocolError):
    http_status = 415


class MethodNotAllowed(ProtocolError):
    http_status = 405


class PayloadTooLarge(ProtocolError):
    http_status = 413
    reason = "body_too_large"


class BodyTimeout(ProtocolError):
    """A body that did not arrive whole in time (limits.body_timeout_ms): a client sending
    it slowly, or never, holds a connection and a handler no longer (RFC 9110 15.5.9)."""

    http_status = 408
    reason = "body_timeout"


class ForbiddenOrigin(ProtocolError):
    http_status = 403
    reason = "origin"


class MisdirectedRequest(ProtocolError):
    """The Host header names a host this gateway does not serve (security.allowed_hosts): a
    page on another name, resolved to this address (DNS rebinding), gets nothing. RFC 9110,
    section 15.5.20: 421 is for a request the server is unwilling to answer for that target
    (the MCP Python SDK's Host check answers 421 too)."""

    http_status = 421
    reason = "host"


class InvalidParams(ProtocolError):
    code = jsonrpc.INVALID_PARAMS


class MethodNotFound(ProtocolError):
    code = jsonrpc.METHOD_NOT_FOUND


class HeaderMismatch(ProtocolError):
    code = mcp.HEADER_MISMATCH


class MissingCapability(ProtocolError):
    code = mcp.MISSING_CAPABILITY


class UnsupportedModernVersion(ProtocolError):
    code = mcp.UNSUPPORTED_VERSION


class TooManyListeners(ProtocolError):
    http_status = 429
    reason = "listeners"


class BadIdempotencyKey(ProtocolError):
    """An `Idempotency-Key` header the gateway cannot keep (tasks/keys.py): too long,
    empty, sent twice, or with bytes outside visible ASCII."""


class IdempotencyKeyReused(ProtocolError):
    """A tools/call whose `Idempotency-Key` names another call of its principal (another
    tool, other arguments or another upstream): refused, nothing sent upstream (the IETF
    httpapi draft: 422; a legacy session gets it as a JSON-RPC error, HTTP 200)."""

    code = jsonrpc.INVALID_PARAMS
    http_status = 422

    def __init__(self, key: str) -> None:
        super().__init__(f"Invalid params: Idempotency-Key {shown(key)} was used for another "
                         "call (another tool or other arguments); a new call needs a new key",
                         {"idempotencyKey": key})


class TooManyRequests(ProtocolError):
    """A rate limit: the caller should slow down (data: retryAfterMs)."""

    code = SERVER_ERROR
    http_status = 429

    @classmethod
    def after(cls, what: str, per_s: float, wait_s: float) -> TooManyRequests:
        return cls(f"Too many {what}: at most {per_s:g} a second; slow down and retry",
                   {"retryAfterMs": max(1, round(wait_s * 1000))})


class AuthRefusal(GatewayError):
    """A refusal of the caller's credentials (or of the check itself), counted as rejections
    {reason="auth", cause} and audited (`auth.failed`). `cause` is one of a fixed few words
    (a metric label, an audit field): why, never what was sent."""

    code = jsonrpc.INVALID_REQUEST
    reason = "auth"
    cause: AuthCause


class Unauthorized(AuthRefusal):
    """No valid credentials."""

    http_status = 401

    def __init__(self, message: str, cause: AuthCause = "missing") -> None:
        super().__init__(message)
        self.cause = cause


class InsufficientScope(AuthRefusal):
    """spec (MCP 2025-11-25 authorization, scope challenge): a valid token without a scope
    the request needs gets 403 and the scopes to ask for."""

    http_status = 403
    cause = "scope"

    def __init__(self, what: str, scopes: frozenset[str]) -> None:
        self.scopes = sorted(scopes)
        super().__init__(f"Forbidden: {what} needs the scope(s) {' '.join(self.scopes)}",
                         {"requiredScopes": self.scopes})


class OperatorOnly(AuthRefusal):
    """A caller who is not an operator asks for an operator's route (/status, /metrics,
    /readyz?detail): an MCP client's valid credentials do not open them (docs/security.md)."""

    http_status = 403
    cause = "operator"


class TooManyFailures(AuthRefusal):
    """The client's address failed to authenticate too often (`auth.failures_per_minute`):
    its requests are refused unchecked until its budget refills (data: retryAfterMs; the
    guard adds Retry-After)."""

    code = SERVER_ERROR
    http_status = 429
    cause = "rate"

    def __init__(self, wait_s: float) -> None:
        self.retry_after_s = wait_s
        super().__init__("Too many failed authentications from this address; retry later",
                         {"retryAfterMs": max(1, round(wait_s * 1000))})


class AuthUnavailable(AuthRefusal):
    """The gateway cannot check a token because its authorization server (discovery, keys,
    introspection) does not answer usefully: the gateway's dependency is down, not the
    caller wrong. Nobody gets through meanwhile."""

    code = jsonrpc.INTERNAL_ERROR
    http_status = 503
    cause = "unavailable"

    def __init__(self) -> None:
        # Where the authorization server is, and what failed, is the operator's (logged as
        # auth.server_unavailable): the caller may not even be authenticated.
        super().__init__("Cannot check the access token now (authorization server "
                         "unavailable); try again shortly", {"reason": "auth_unavailable"})


class TooManySessions(GatewayError):
    """No room for another legacy session: the caller's principal holds its share
    (`max_sessions_per_principal`), or every session is taken (`max_sessions`), and none of
    the principal's own is idle enough to make room (issue 29: never another's)."""

    http_status = 503
    reason = "sessions"


class QueueFull(GatewayError):
    """A concurrency limit's queue holds its maximum of waiting calls (queues.py): the
    caller should retry later (data: the limit, retryAfterMs)."""

    code = SERVER_ERROR
    http_status = 503  # modern clients; legacy sessions get it as a JSON-RPC error (200)
    # Counted by the queues as rejections{reason="queue_full"}, in either era.


class GatewayStopping(GatewayError):
    """The gateway is stopping (its drain: docs/deploys.md): a new tools/call, or one still
    waiting in a queue, is refused and never sent upstream; another replica (or this one,
    restarted) takes it. A 503 with Retry-After where no stream carries the answer yet, so
    a balancer or client may retry at once; data.reason "shutdown" as a stopped call's."""

    code = SERVER_ERROR
    http_status = 503
    RETRY_S = 1.0

    def __init__(self) -> None:
        self.retry_after_s = self.RETRY_S
        super().__init__("the gateway is stopping; retry (another replica takes the call)",
                         {"reason": "shutdown", "retryAfterMs": round(self.RETRY_S * 1000)})


class AnswersOverBudget(GatewayError):
    """A call's answer came while its principal holds answers not yet written to its
    clients up to its bound (answer_bytes.py): the answer is dropped and the call fails with
    this, naming the bound (`limit`: the setting, `maxBytes`, `heldBytes`). Sent as the
    call's JSON-RPC response (HTTP 200), as an upstream's failure is."""

    code = SERVER_ERROR  # the table's 200: the call's answer, as an upstream's failure is
    reason = "answer_bytes"

    def __init__(self, bound: str, limit: int, held: int) -> None:
        super().__init__(f"The answer was dropped: this client's answers not yet read hold "
                         f"{held} bytes, and this one would pass {bound} ({limit} bytes); "
                         "read the answers in flight, then retry",
                         {"limit": bound, "maxBytes": limit, "heldBytes": held})


# Why an upstream failed a call: the `reason` of its error's data, one per UpstreamError kind.
UpstreamFailure = Literal["down", "not_ready", "start_failed", "unreachable", "connection",
                          "initialize", "exited", "session_lost", "timeout", "too_large",
                          "shutdown", "processes"]


class UpstreamError(GatewayError):
    """The upstream failed a call. Raised as one of the kinds below (httpcore's exception
    tree is the model): each says why in its class, `failure` (the data's `reason`), so the
    gateway tells them apart by type, never by reading that field back; and each kind is of
    one category (unavailable, broken, timeout, shutdown): decide by category where the
    kinds in one need no telling apart (upstream/handshake.py)."""

    http_status = 200
    failure: ClassVar[UpstreamFailure]

    def __init__(self, upstream: str, message: str, *, detail: str = "", **data: Any) -> None:
        # Messages often carry an exception's text, which may quote the upstream's URL: it
        # is left out, clients read the upstream's name (where it is, and its credentials,
        # are the operator's: log lines carry its URL without credentials).
        super().__init__(redact.no_urls(message),
                         {"upstream": upstream, "reason": self.failure, **data})
        # For the operator's log only: what the server said (its stderr may hold secrets,
        # so it never reaches a client).
        self.detail = detail


class UpstreamUnavailable(UpstreamError):
    """No server took the call: none runs, is ready, can be reached or is free for it, or
    its connection failed before an answer. The handshake reads this as "reached nothing"."""


class UpstreamDown(UpstreamUnavailable):
    """The upstream is not running (or not connected): nothing was sent."""

    failure = "down"


class UpstreamNotReady(UpstreamUnavailable):
    """The upstream did not become ready in time (its state in the data)."""

    failure = "not_ready"


class UpstreamStartFailed(UpstreamUnavailable):
    """A stdio server's command could not start (its command in the data)."""

    failure = "start_failed"


class UpstreamUnreachable(UpstreamUnavailable):
    """Nothing reached the server: its connection failed before the handshake."""

    failure = "unreachable"


class UpstreamConnectionFailed(UpstreamUnavailable):
    """An HTTP request got no answer (refused, dropped, timed out, an HTTP error)."""

    failure = "connection"


class TooManyProcesses(UpstreamUnavailable):
    """An isolated upstream has no server process for this session or call: the gateway
    runs `limits.max_processes`, or the caller's principal its share of them
    (`max_processes_per_principal`), and none was given back within `process_wait_ms`
    (upstream/processes.py; data: the bound's name and size, retryAfterMs)."""

    code = SERVER_ERROR
    failure = "processes"

    def __init__(self, upstream: str, message: str, **data: Any) -> None:
        super().__init__(upstream, message, retryAfterMs=1000, **data)


class UpstreamBroken(UpstreamError):
    """The server was reached and broke off the exchange: it refused the handshake, exited,
    ended its session, or answered more than the gateway takes."""


class UpstreamInitializeFailed(UpstreamBroken):
    """The handshake failed: the server refused it, or answered what the gateway does not
    speak, or exited during it."""

    failure = "initialize"


class UpstreamExited(UpstreamBroken):
    """The server's process exited before answering (its exit code in the data)."""

    failure = "exited"


class UpstreamSessionLost(UpstreamBroken):
    """An HTTP server ended its session before answering."""

    failure = "session_lost"


class UpstreamTooLarge(UpstreamBroken):
    """An HTTP server's answer to this call (a JSON body, or one SSE event's data) went past
    `limits.max_message_bytes`: the gateway stopped reading it and fails this call alone;
    the server's session goes on (data: the bound's name and bytes)."""

    failure = "too_large"

    @classmethod
    def over(cls, upstream: str, max_bytes: int) -> UpstreamTooLarge:
        return cls(upstream, f"upstream '{upstream}' answered more than "
                   f"limits.max_message_bytes ({max_bytes} bytes): the answer was dropped",
                   limit="limits.max_message_bytes", maxBytes=max_bytes)


class UpstreamTimeout(UpstreamError):
    """`request_timeout_ms` passed before the server answered."""

    failure = "timeout"

    @classmethod
    def timed_out(cls, upstream: str, seconds: float) -> UpstreamTimeout:
        """The gateway gave up on the call after `seconds` (and cancelled it)."""
        return cls(upstream, f"upstream '{upstream}' did not answer within {seconds:g} s")


class UpstreamShutdown(UpstreamError):
    """The gateway is stopping: calls in flight end."""

    failure = "shutdown"


class StoreUnavailable(GatewayError):
    """The shared task store (Redis/Valkey) does not answer: tasks cannot be read or made
    until it is back (the gateway reconnects by itself); pass-through calls go on."""

    http_status = 503

    def __init__(self, detail: str) -> None:
        # Clients read that the store is away, not where it is (a Redis error names its host
        # and port), as with upstreams; the operator's log (`store.unavailable`) has `detail`.
        super().__init__("The task store is unavailable; try again shortly",
                         {"reason": "store_unavailable"})
        self.detail = redact.text(detail)


class StoreSettling(GatewayError):
    """A task id the shared store does not hold, asked while that store is being written
    back after it came back without its records (a new generation: tasks/generation.py):
    the id may be a live task whose replica has not written it back yet, so the caller is
    told to retry, not that it does not exist ("Task not found" makes a poller give up on
    a live task). Unknown and other owners' ids get exactly this too, never a hint."""

    code = SERVER_ERROR
    http_status = 503

    def __init__(self, wait_s: float, what: str = "this task") -> None:
        self.retry_after_s = wait_s  # `what`: a list's may lack "some tasks"
        super().__init__(f"The task store is being restored after an incident and {what} "
                         "may not be back yet; retry shortly",
                         {"reason": "store_settling", "retryAfterMs": max(1, round(
                             wait_s * 1000))})
