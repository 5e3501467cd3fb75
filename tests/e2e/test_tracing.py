"""OpenTelemetry traces, read from the SDK's in-memory exporter: a span per client request
(continuing the caller's W3C trace from `_meta` or headers), the upstream call as its child
with the context passed to the server in `_meta`, and a span per task; none of it when
tracing is not configured."""

from __future__ import annotations

import json

import pytest
from mcp_http import text_of
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from test_modern import modern
from test_tasks import POLICY, TASKS, wait_for

from gateway.observability.tracing import Tracer
from gateway.settings.schema import Tracing

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CALLER_SPAN}-01"


@pytest.fixture
def spans() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
async def url(gateway, spans) -> str:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    return await gateway(tasks=POLICY, tracing=Tracer(provider))


async def call(http, url, name, arguments=None, caps=None, headers=None, traced=False):
    meta = {"traceparent": TRACEPARENT} if traced else None
    return await modern(http, url, "tools/call", {"name": name, "arguments": arguments or {}},
                        caps, meta=meta, headers=headers)


def by_name(spans: InMemorySpanExporter, name: str):
    return [s for s in spans.get_finished_spans() if s.name == name]


async def test_a_call_continues_the_callers_trace_through_the_gateway(url, http,
                                                                      spans) -> None:
    reply = await call(http, url, "meta", caps={}, traced=True)
    reached = json.loads(text_of(reply))
    (server,) = [s for s in by_name(spans, "tools/call meta") if s.kind is SpanKind.SERVER]
    (client,) = [s for s in by_name(spans, "tools/call meta") if s.kind is SpanKind.CLIENT]
    assert format(server.context.trace_id, "032x") == TRACE_ID
    assert format(server.parent.span_id, "016x") == CALLER_SPAN
    assert client.parent.span_id == server.context.span_id
    assert server.attributes["gen_ai.tool.name"] == "meta"
    assert server.attributes["mcp.gateway.era"] == "modern"
    assert server.attributes["http.response.status_code"] == 200
    # The server got the gateway's upstream-call span as its parent, in _meta.
    want = f"00-{TRACE_ID}-{client.context.span_id:016x}-01"
    assert reached["traceparent"] == want


async def test_the_trace_context_may_come_in_headers(url, http, spans) -> None:
    await call(http, url, "echo", {"text": "x"}, caps={},
               headers={"traceparent": TRACEPARENT})
    server = next(s for s in by_name(spans, "tools/call echo") if s.kind is SpanKind.SERVER)
    assert format(server.context.trace_id, "032x") == TRACE_ID


async def test_a_task_has_a_span_from_creation_to_its_end(url, http, spans) -> None:
    task = (await call(http, url, "sleep", {"ms": 600}, TASKS,
                       traced=True)).body["result"]
    assert task["resultType"] == "task"
    await wait_for(http, url, task["taskId"], "completed")
    (span,) = by_name(spans, "task sleep")
    assert format(span.context.trace_id, "032x") == TRACE_ID
    assert span.attributes["mcp.task.id"] == task["taskId"]
    assert span.attributes["mcp.task.status"] == "completed"
    assert (span.end_time - span.start_time) / 1e9 >= 0.3
    upstream = next(s for s in by_name(spans, "tools/call sleep") if s.kind is SpanKind.CLIENT)
    assert upstream.end_time >= span.start_time  # the call outlived its request, as a task
    failed = (await call(http, url, "blob", {"bytes": "nan"}, TASKS)).body["result"]
    await wait_for(http, url, failed["taskId"], "failed")
    (blob,) = by_name(spans, "task blob")
    assert blob.status.status_code is StatusCode.ERROR


async def test_errors_mark_the_request_span(url, http, spans) -> None:
    await call(http, url, "blob", {"bytes": "nan"}, caps={})
    server = next(s for s in by_name(spans, "tools/call blob") if s.kind is SpanKind.SERVER)
    assert server.status.status_code is StatusCode.ERROR


async def test_no_tracing_unless_configured(gateway, http) -> None:
    assert Tracer.from_settings(Tracing()) is None
    url = await gateway()
    reply = await call(http, url, "meta", caps={}, traced=True)
    reached = json.loads(text_of(reply))
    assert reached.get("traceparent") == TRACEPARENT  # passed through untouched
