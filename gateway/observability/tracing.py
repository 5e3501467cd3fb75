"""OpenTelemetry traces, off unless `tracing.otlp_endpoint` is set.

One span per client request (kind SERVER), a child of the caller's W3C trace context, read
from the request's `params._meta` (`traceparent`, `tracestate`: the MCP convention) or else
its HTTP headers; one span per upstream call (CLIENT), whose context goes upstream in the
request's `_meta`, so a traced server continues the trace; one span per task, from creation
to its end, however long that is.

Names and attributes follow OpenTelemetry's semantic conventions for MCP (docs/gen-ai/mcp.md
of semantic-conventions-genai v0.1.0, status Development; its common attributes are
semantic-conventions v1.41's): span name `{method} {target}`, `mcp.method.name`,
`gen_ai.tool.name` / `gen_ai.prompt.name`, `gen_ai.operation.name` `execute_tool` on a tool
call, `jsonrpc.request.id`, `mcp.protocol.version`, `mcp.session.id`, `network.*`, and on
failure `error.type` (the JSON-RPC error code; `tool_error` for a result with isError; an
upstream failure's reason) with `rpc.response.status_code`. The gateway's own are
`mcp.gateway.*` and `mcp.task.*`.

What a span never holds (issue 44): a token, an argument value, or anything the server or
the client wrote in free text. The principal is `enduser.pseudo.id`, the short digest audit
events name it by (`owner_hash`); a session id is a bearer of the session, so
`mcp.session.id` is its digest too; a failed span's status has no description, since a
server's error message may quote an argument (issue 42), unless the words are the
gateway's own. The conventions' opt-in `gen_ai.tool.call.arguments` and `.result`, and
`mcp.resource.uri` (a path may name a person), are left out.

The request span's `Tracer` is made current in a context variable for the request's own
context only, so the upstream call and the task it starts find it without a tracer being
passed through every layer; with tracing off the cost is that variable's lookup. The SDK is
imported only when tracing is configured (the `otel` extra).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, get_args

from gateway import __version__
from gateway.errors import UpstreamFailure
from gateway.observability import owner_hash
from gateway.protocol import mcp
from gateway.settings import ConfigError
from gateway.settings.schema import Tracing

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span

_ACTIVE: ContextVar[Tracer | None] = ContextVar("gateway_tracing", default=None)
TRACE_KEYS = ("traceparent", "tracestate")
# The conventions' name for a failure its error has no class for (semconv error.type).
OTHER_ERROR = "_OTHER"
TOOL_ERROR = "tool_error"  # semconv (MCP, error.type): a CallToolResult with isError
UPSTREAM_FAILURES = frozenset(get_args(UpstreamFailure))


def active() -> Tracer | None:
    """The tracer of the request being served in this context, if traced."""
    return _ACTIVE.get()


class Tracer:
    def __init__(self, provider: TracerProvider) -> None:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        self.provider = provider
        self.tracer = provider.get_tracer("mcp-task-gateway", __version__)
        self.propagator = TraceContextTextMapPropagator()

    @classmethod
    def from_settings(cls, conf: Tracing) -> Tracer | None:
        if conf.otlp_endpoint is None:
            return None
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
        except ImportError as exc:
            raise ConfigError("tracing.otlp_endpoint is set, but OpenTelemetry is not "
                              "installed: pip install 'mcp-task-gateway[otel]'") from exc
        provider = TracerProvider(resource=Resource.create({"service.name": conf.service_name}),
                                  sampler=ParentBased(TraceIdRatioBased(conf.sample_ratio)))
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(conf.otlp_endpoint)))
        return cls(provider)

    @contextmanager
    def request(self, msg: Mapping[str, Any], era: str, upstream: str,
                headers: Mapping[str, str], owner: str, http_version: str
                ) -> Iterator[Span]:
        """The span of one client request, current while it is served; `owner` is its
        principal's (only its digest is kept)."""
        from opentelemetry.trace import Link, SpanKind, get_current_span
        params = msg.get("params")
        meta = params.get("_meta") if isinstance(params, Mapping) else None
        # spec 2026-07-28 (basic, _meta: OpenTelemetry trace context) and the conventions
        # (MCP, Context propagation): the context in `_meta` is the parent, the transport's
        # (the HTTP header's) a link; the header's is the parent only when `_meta` has none
        # (a client of an older spec, or a proxy's).
        carrier: Mapping[str, Any] = (meta if isinstance(meta, Mapping) and "traceparent" in meta
                                      else headers)
        parent = self._extract(carrier)
        links = []
        if carrier is not headers and "traceparent" in headers:
            transport = get_current_span(self._extract(headers)).get_span_context()
            if transport.is_valid:
                links.append(Link(transport))
        method = str(msg.get("method", "response"))
        attributes = {"mcp.method.name": method, "mcp.gateway.era": era,
                      "mcp.gateway.upstream": upstream, **_target(method, params),
                      "enduser.pseudo.id": owner_hash(owner),
                      "network.transport": "tcp", "network.protocol.name": "http",
                      "network.protocol.version": http_version}
        if msg.get("id") is not None:  # semconv: not for a null or missing id
            attributes["jsonrpc.request.id"] = str(msg["id"])[:128]
        version = meta.get(mcp.META_VERSION) if isinstance(meta, Mapping) else None
        if method == mcp.INITIALIZE and isinstance(params, Mapping):  # the one it asks for
            version = params.get("protocolVersion")
        if isinstance(version := version or headers.get(mcp.H_PROTOCOL), str):
            attributes["mcp.protocol.version"] = version[:32]
        if (session := headers.get(mcp.H_SESSION)) is not None:
            attributes["mcp.session.id"] = owner_hash(session)
        token = _ACTIVE.set(self)
        try:
            with self.tracer.start_as_current_span(
                    _name(method, params), context=parent, kind=SpanKind.SERVER,
                    attributes=attributes, links=links) as span:
                yield span
        finally:
            _ACTIVE.reset(token)

    def _extract(self, carrier: Mapping[str, Any]) -> Context:
        return self.propagator.extract({k: str(carrier[k]) for k in TRACE_KEYS
                                        if k in carrier})

    def upstream_call(self, upstream: str, msg: dict[str, Any]) -> Span:
        """A span for a request sent upstream (a child of the current span); its context
        is written into the request's `_meta`, replacing the client's."""
        from opentelemetry.trace import SpanKind, set_span_in_context
        method, params = str(msg.get("method")), msg.get("params")
        attributes = {"mcp.method.name": method, "mcp.gateway.upstream": upstream,
                      **_target(method, params)}
        if msg.get("id") is not None:  # the gateway's own id for the call upstream
            attributes["jsonrpc.request.id"] = str(msg["id"])
        span = self.tracer.start_span(_name(method, params), kind=SpanKind.CLIENT,
                                      attributes=attributes)
        if not isinstance(params, dict):
            msg["params"] = params = {}
        meta = params.get("_meta")
        params["_meta"] = meta = dict(meta) if isinstance(meta, dict) else {}
        for key in TRACE_KEYS:
            meta.pop(key, None)
        self.propagator.inject(meta, context=set_span_in_context(span))
        return span

    def task(self, task_id: str, tool: str, upstream: str, dialect: str, owner: str) -> Span:
        """A span for a task's whole life (a child of the request that created it)."""
        return self.tracer.start_span(f"task {tool[:64]}", attributes={
            "mcp.task.id": task_id, "mcp.method.name": mcp.TOOLS_CALL,
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool[:256],
            "mcp.gateway.upstream": upstream, "mcp.task.dialect": dialect,
            "enduser.pseudo.id": owner_hash(owner)})

    def shutdown(self) -> None:
        self.provider.shutdown()  # exports what is still queued


def end(span: Span, error_type: str | None = None, description: str | None = None,
        **attributes: Any) -> None:
    """End a span, failed when `error_type` (semconv `error.type`) says how; its status
    described only by `description`: words of the gateway's own, never a server's or a
    client's."""
    if attributes:
        span.set_attributes(attributes)
    if error_type is not None:
        _failed(span, error_type, description)
    span.end()


def answered(span: Span, http_status: int, failed: bool, error_type: str | None) -> None:
    """What the request's span records of its answer: its HTTP status, and how it failed
    (semconv error.type: the JSON-RPC code or `tool_error`, else the HTTP status)."""
    span.set_attribute("http.response.status_code", http_status)
    if error_type is None and (failed or http_status >= 400):
        error_type = str(http_status) if http_status >= 400 else OTHER_ERROR
    if error_type is not None:
        _failed(span, error_type, None)


def error_type(msg: dict[str, Any]) -> str | None:
    """The semconv `error.type` of an answer: its JSON-RPC error's code (for an error the
    gateway made for an upstream that failed the call, its reason: `timeout`, `down`, ...);
    `tool_error` for a tool's result with isError; None when it did not fail. Every answer
    passes here, traced or not: plain dict checks (an ABC's isinstance costs ten times)."""
    error = msg.get("error")
    if error is None:
        result = msg.get("result")
        if type(result) is dict and result.get("isError") is True:
            return TOOL_ERROR
        return None
    if type(error) is not dict:
        return OTHER_ERROR
    data = error.get("data")
    # errors.UpstreamError's: the gateway's own words (a known one: a server could write
    # any `reason` of its own)
    if type(data) is dict and data.get("reason") in UPSTREAM_FAILURES:
        return str(data["reason"])
    code = error.get("code")
    return str(code) if type(code) is int else OTHER_ERROR


def _failed(span: Span, kind: str, description: str | None) -> None:
    """semconv (MCP spans, Span status): ERROR whenever `error.type` is set; the JSON-RPC
    code also as `rpc.response.status_code`."""
    from opentelemetry.trace import Status, StatusCode
    span.set_attribute("error.type", kind)
    if kind.lstrip("-").isdigit():
        span.set_attribute("rpc.response.status_code", kind)
    span.set_status(Status(StatusCode.ERROR, description))


def _name(method: str, params: Any) -> str:
    """`{method} {target}` (semantic conventions), the target being the tool or prompt."""
    target = params.get("name") if isinstance(params, Mapping) else None
    if method in ("tools/call", "prompts/get") and isinstance(target, str):
        return f"{method} {target[:64]}"
    return method


def _target(method: str, params: Any) -> dict[str, str]:
    """The conventions' attributes naming what a request is about (a name, never a value)."""
    name = params.get("name") if isinstance(params, Mapping) else None
    if not isinstance(name, str):
        return {}
    if method == mcp.TOOLS_CALL:
        return {"gen_ai.tool.name": name[:256], "gen_ai.operation.name": "execute_tool"}
    if method == "prompts/get":
        return {"gen_ai.prompt.name": name[:256]}
    return {}
