"""OpenTelemetry traces, off unless `tracing.otlp_endpoint` is set.

One span per client request (kind SERVER), a child of the caller's W3C trace context, read
from the request's `params._meta` (`traceparent`, `tracestate`: the MCP convention) or else
its HTTP headers; one span per upstream call (CLIENT), whose context goes upstream in the
request's `_meta`, so a traced server continues the trace; one span per task, from creation
to its end, however long that is. Names and attributes follow OpenTelemetry's MCP semantic
conventions (`mcp.method.name`, `gen_ai.tool.name`, `jsonrpc.request.id`).

The request span's `Tracer` is made current in a context variable for the request's own
context only, so the upstream call and the task it starts find it without a tracer being
passed through every layer; with tracing off the cost is that variable's lookup. The SDK is
imported only when tracing is configured (the `otel` extra).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from gateway import __version__
from gateway.settings import ConfigError
from gateway.settings.schema import Tracing

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span

_ACTIVE: ContextVar[Tracer | None] = ContextVar("gateway_tracing", default=None)
TRACE_KEYS = ("traceparent", "tracestate")


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
                headers: Mapping[str, str]) -> Iterator[Span]:
        """The span of one client request, current while it is served."""
        from opentelemetry.trace import SpanKind
        params = msg.get("params")
        meta = params.get("_meta") if isinstance(params, Mapping) else None
        carrier = meta if isinstance(meta, Mapping) and "traceparent" in meta else headers
        parent = self.propagator.extract({k: str(carrier[k]) for k in TRACE_KEYS
                                          if k in carrier})
        method = str(msg.get("method", "response"))
        attributes = {"mcp.method.name": method, "mcp.gateway.era": era,
                      "mcp.gateway.upstream": upstream, **_target(method, params)}
        if "id" in msg:
            attributes["jsonrpc.request.id"] = str(msg["id"])
        token = _ACTIVE.set(self)
        try:
            with self.tracer.start_as_current_span(
                    _name(method, params), context=parent, kind=SpanKind.SERVER,
                    attributes=attributes) as span:
                yield span
        finally:
            _ACTIVE.reset(token)

    def upstream_call(self, upstream: str, msg: dict[str, Any]) -> Span:
        """A span for a request sent upstream (a child of the current span); its context
        is written into the request's `_meta`, replacing the client's."""
        from opentelemetry.trace import SpanKind, set_span_in_context
        method, params = str(msg.get("method")), msg.get("params")
        span = self.tracer.start_span(_name(method, params), kind=SpanKind.CLIENT, attributes={
            "mcp.method.name": method, "mcp.gateway.upstream": upstream,
            **_target(method, params)})
        if not isinstance(params, dict):
            msg["params"] = params = {}
        meta = params.get("_meta")
        params["_meta"] = meta = dict(meta) if isinstance(meta, dict) else {}
        for key in TRACE_KEYS:
            meta.pop(key, None)
        self.propagator.inject(meta, context=set_span_in_context(span))
        return span

    def task(self, task_id: str, tool: str, upstream: str, dialect: str) -> Span:
        """A span for a task's whole life (a child of the request that created it)."""
        return self.tracer.start_span(f"task {tool}", attributes={
            "mcp.task.id": task_id, "gen_ai.tool.name": tool, "mcp.gateway.upstream": upstream,
            "mcp.task.dialect": dialect})

    def shutdown(self) -> None:
        self.provider.shutdown()  # exports what is still queued


def end(span: Span, error: str | None = None, **attributes: Any) -> None:
    """End a span, marked as failed when `error` says why."""
    from opentelemetry.trace import Status, StatusCode
    if attributes:
        span.set_attributes(attributes)
    if error is not None:
        span.set_status(Status(StatusCode.ERROR, error))
    span.end()


def answered(span: Span, http_status: int, failed: bool) -> None:
    """What the request's span records of its answer."""
    from opentelemetry.trace import Status, StatusCode
    span.set_attribute("http.response.status_code", http_status)
    if failed:
        span.set_status(Status(StatusCode.ERROR))


def _name(method: str, params: Any) -> str:
    """`{method} {target}` (semantic conventions), the target being the tool or prompt."""
    target = params.get("name") if isinstance(params, Mapping) else None
    if method in ("tools/call", "prompts/get") and isinstance(target, str):
        return f"{method} {target[:64]}"
    return method


def _target(method: str, params: Any) -> dict[str, str]:
    name = params.get("name") if isinstance(params, Mapping) else None
    if method == "tools/call" and isinstance(name, str):
        return {"gen_ai.tool.name": name[:256]}
    return {}
