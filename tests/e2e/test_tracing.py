"""OpenTelemetry traces, read from the SDK's in-memory exporter: a span per client request
(continuing the caller's W3C trace from `_meta` or headers), the upstream call as its child
with the context passed to the server in `_meta`, and a span per task; none of it when
tracing is not configured."""

from __future__ import annotations

import json

import pytest
from mcp_http import McpHttp, text_of
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from test_modern import modern
from test_tasks import POLICY, TASKS, wait_for

from gateway.observability import owner_hash
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


# -- the semantic conventions' attributes, both eras (issue 44, item 4) ---------------------
ALICE, BOB = "alice-token", "bob-token"
CALLER_SPAN_2 = "b7ad6b7169203331"


@pytest.fixture
async def authed(gateway, spans) -> str:
    """A traced gateway with two principals, Alice and Bob (static tokens)."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    return await gateway(tasks=POLICY, tracing=Tracer(provider),
                         auth={"bearer_tokens": [ALICE, BOB]})


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def served(spans: InMemorySpanExporter, name: str):
    (span,) = [s for s in by_name(spans, name) if s.kind is SpanKind.SERVER]
    return span


def sent(spans: InMemorySpanExporter, name: str):
    (span,) = [s for s in by_name(spans, name) if s.kind is SpanKind.CLIENT]
    return span


async def legacy(client, url: str, token: str, version: str = "2025-11-25") -> McpHttp:
    c = client(url)
    await c.initialize({"elicitation": {}}, version=version, headers=bearer(token))
    return c


def holds(attributes, want) -> bool:
    return dict(attributes).items() >= want.items()


def hexid(n: int, width: int) -> str:
    return format(n, f"0{width}x")


async def test_a_modern_tool_call_has_the_conventions_attributes(authed, http, spans) -> None:
    reply = await call(http, authed, "echo", {"text": "hello"}, caps={}, headers=bearer(ALICE),
                       traced=True)
    server, client = served(spans, "tools/call echo"), sent(spans, "tools/call echo")
    assert holds(server.attributes, {
        "mcp.method.name": "tools/call", "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "echo", "jsonrpc.request.id": str(reply.body["id"]),
        "mcp.protocol.version": "2026-07-28", "mcp.gateway.era": "modern",
        "network.transport": "tcp", "network.protocol.name": "http",
        "network.protocol.version": "1.1", "http.response.status_code": 200})
    # The principal as the digest the audit events name it by, never its token.
    assert server.attributes["enduser.pseudo.id"] == owner_hash(owner_hash(f"Bearer {ALICE}"))
    assert "mcp.session.id" not in server.attributes  # modern: no session
    assert "error.type" not in server.attributes
    assert server.status.status_code is StatusCode.UNSET
    assert format(server.parent.span_id, "016x") == CALLER_SPAN
    assert client.parent.span_id == server.context.span_id
    assert holds(client.attributes, {
        "mcp.method.name": "tools/call", "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "echo"})
    assert client.attributes["jsonrpc.request.id"]  # the gateway's own id upstream


async def test_a_legacy_tool_call_continues_the_trace_in_its_meta(authed, client,
                                                                  spans) -> None:
    """Both eras honour `_meta.traceparent` over the HTTP header (spec 2026-07-28, _meta:
    OpenTelemetry trace context; 2025-11-25 clients send it the same way)."""
    c = await legacy(client, authed, ALICE)
    other = f"00-{'1' * 32}-{CALLER_SPAN_2}-01"
    reply = await c.call("meta", meta={"traceparent": TRACEPARENT, "tracestate": "rojo=1"},
                         traceparent=other, **bearer(ALICE))
    reached = json.loads(reply.message["result"]["content"][0]["text"])
    server, upstream = served(spans, "tools/call meta"), sent(spans, "tools/call meta")
    assert hexid(server.context.trace_id, 32) == TRACE_ID
    assert hexid(server.parent.span_id, 16) == CALLER_SPAN
    assert server.context.trace_state.get("rojo") == "1"
    (link,) = server.links  # the conventions: the transport's context, as a link
    assert hexid(link.context.span_id, 16) == CALLER_SPAN_2
    assert holds(server.attributes, {
        "mcp.method.name": "tools/call", "gen_ai.tool.name": "meta",
        "gen_ai.operation.name": "execute_tool", "mcp.gateway.era": "legacy",
        "mcp.protocol.version": "2025-11-25", "network.transport": "tcp"})
    # The session id bears the session: only its digest.
    assert server.attributes["mcp.session.id"] == owner_hash(c.session_id)
    assert c.session_id not in str(dict(server.attributes))
    # The server continues the gateway's upstream span, not the client's.
    assert reached["traceparent"] == f"00-{TRACE_ID}-{hexid(upstream.context.span_id, 16)}-01"
    assert upstream.parent.span_id == server.context.span_id


async def test_a_legacy_call_without_meta_continues_the_headers_trace(authed, client,
                                                                      spans) -> None:
    c = await legacy(client, authed, BOB)
    await c.call("echo", {"text": "x"}, traceparent=TRACEPARENT, **bearer(BOB))
    server = served(spans, "tools/call echo")
    assert hexid(server.parent.span_id, 16) == CALLER_SPAN and not server.links


async def test_failures_say_their_error_type(authed, http, client, spans) -> None:
    """semconv error.type: the JSON-RPC code (and rpc.response.status_code), `tool_error`
    for an isError result; the status has no description, a server's words may quote an
    argument (issue 42)."""
    c = await legacy(client, authed, ALICE)
    await c.call("no-such-tool", {"secret": "shh-42"}, **bearer(ALICE))
    tool_error = served(spans, "tools/call no-such-tool")
    assert tool_error.attributes["error.type"] == "tool_error"
    assert "rpc.response.status_code" not in tool_error.attributes
    assert tool_error.status.status_code is StatusCode.ERROR
    assert sent(spans, "tools/call no-such-tool").attributes["error.type"] == "tool_error"
    await call(http, authed, "blob", {"bytes": "nan"}, caps={}, headers=bearer(ALICE))
    failed = served(spans, "tools/call blob")
    code = failed.attributes["error.type"]
    assert code.lstrip("-").isdigit() and failed.attributes["rpc.response.status_code"] == code
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.status.description is None
    upstream = sent(spans, "tools/call blob")
    assert upstream.attributes["error.type"] == code and upstream.status.description is None


@pytest.mark.parametrize("era", ["modern", "legacy"])
async def test_a_task_span_names_its_task_tool_and_owner(authed, http, client, spans,
                                                         era) -> None:
    if era == "modern":
        task = (await call(http, authed, "sleep", {"ms": 400}, TASKS, headers=bearer(ALICE),
                           traced=True)).body["result"]
        task_id = task["taskId"]
        await wait_for(http, authed, task_id, "completed", headers=bearer(ALICE))
    else:
        c = await legacy(client, authed, ALICE)
        reply = await c.send({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {
            "name": "sleep", "arguments": {"ms": 400}, "task": {},
            "_meta": {"traceparent": TRACEPARENT}}}, **bearer(ALICE))
        task_id = reply.message["result"]["task"]["taskId"]
        await c.send({"jsonrpc": "2.0", "id": 10, "method": "tasks/result",
                      "params": {"taskId": task_id}}, **bearer(ALICE))
    (span,) = by_name(spans, "task sleep")
    request = served(spans, "tools/call sleep")
    assert hexid(span.context.trace_id, 32) == TRACE_ID
    assert span.parent.span_id == request.context.span_id
    assert holds(span.attributes, {
        "mcp.task.id": task_id, "mcp.task.status": "completed", "gen_ai.tool.name": "sleep",
        "gen_ai.operation.name": "execute_tool", "mcp.method.name": "tools/call",
        "enduser.pseudo.id": request.attributes["enduser.pseudo.id"]})
    assert "error.type" not in span.attributes


async def test_a_failed_task_says_how_in_the_gateways_words(authed, http, spans) -> None:
    task = (await call(http, authed, "blob", {"bytes": "nan-shh-7"}, TASKS,
                       headers=bearer(ALICE))).body["result"]
    await wait_for(http, authed, task["taskId"], "failed", headers=bearer(ALICE))
    (span,) = by_name(spans, "task blob")
    assert span.status.status_code is StatusCode.ERROR
    code = span.attributes["error.type"]
    assert code.lstrip("-").isdigit()
    assert "nan-shh-7" not in (span.status.description or "")
    assert span.status.description == f"the server answered JSON-RPC error {code}"


async def test_a_timed_out_task_is_described_in_the_gateways_words(authed, http,
                                                                    spans) -> None:
    task = (await call(http, authed, "hang", {}, TASKS, headers=bearer(BOB))).body["result"]
    final = await wait_for(http, authed, task["taskId"], "failed", headers=bearer(BOB))
    (span,) = by_name(spans, "task hang")
    assert span.attributes["error.type"] == "-32603"  # the gateway's internal error
    assert span.status.description == final["statusMessage"]
    upstream = sent(spans, "tools/call hang")  # the call the gateway cancelled
    assert upstream.attributes["error.type"] == "cancelled"
    assert upstream.status.description is None  # a cancel's reason is the client's own


def everything_of(span) -> str:
    """Every word a span holds that an exporter sends: name, attributes, status, events."""
    events = [(e.name, dict(e.attributes or {})) for e in span.events]
    return json.dumps([span.name, dict(span.attributes), span.status.description, events,
                       str(span.context.trace_state)], default=str)


async def test_no_span_holds_a_token_or_an_argument_and_bob_none_of_alices(
        authed, http, client, spans) -> None:
    """Two principals (issue 44): every span of every kind, inline and task, both eras,
    holds no token and no argument value; Bob's spans hold nothing of Alice's (her digest,
    her session's id or digest, her arguments)."""
    secrets = {"alice": ["alice-arg-Zq1", "alice-task-Zq2", "alice-meta-Zq3"],
               "bob": ["bob-arg-Xw1", "bob-task-Xw2", "bob-meta-Xw3"]}
    sessions = {}
    for who, token in (("alice", ALICE), ("bob", BOB)):
        arg, task_arg, meta_value = secrets[who]
        await call(http, authed, "echo", {"text": arg}, caps={}, headers=bearer(token),
                   traced=True)
        created = (await call(http, authed, "sleep", {"ms": 250, "note": task_arg}, TASKS,
                              headers=bearer(token))).body["result"]
        await wait_for(http, authed, created["taskId"], "completed", headers=bearer(token))
        c = await legacy(client, authed, token)
        sessions[who] = c.session_id
        await c.call("echo", {"text": arg}, meta={"traceparent": TRACEPARENT,
                                                  "note": meta_value}, **bearer(token))
        await c.call("no-such-tool", {"text": arg}, **bearer(token))
    finished = spans.get_finished_spans()
    digests = {who: owner_hash(owner_hash(f"Bearer {token}"))
               for who, token in (("alice", ALICE), ("bob", BOB))}
    owners = {}
    for span in finished:
        text = everything_of(span)
        for word in (ALICE, BOB, *secrets["alice"], *secrets["bob"]):
            assert word not in text, (word, span.name)
        if (who := span.attributes.get("enduser.pseudo.id")) is not None:
            owners.setdefault(who, []).append(span)
    assert set(owners) == set(digests.values())  # every request and task span names one
    alices = [digests["alice"], sessions["alice"], owner_hash(sessions["alice"])]
    for span in owners[digests["bob"]]:
        text = everything_of(span)
        assert not [word for word in alices if word in text], span.name
    assert len(owners[digests["bob"]]) >= 5  # calls, a task, the session's requests
