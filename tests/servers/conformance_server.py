#!/usr/bin/env python3
"""The conformance suite's server fixture, written with the official Python SDK (`mcp` 2.x).

It implements the tools, resources and prompts the suite's server scenarios call. It speaks
both eras (mcp 2.x serves the era a client opens with: initialize, or a request carrying the
modern _meta): the tools that ask the client do so with input_required rounds on a modern
request and with server-to-client requests on a legacy session. `stdio` (default) serves it
behind the gateway; `http PORT` serves it directly over Streamable HTTP, as the baseline.
Over HTTP it polls as SEP-1699 (2025-11-25) has it: every SSE stream opens with a priming
event (an id, `retry`), and `test_reconnection` closes its call's stream before it answers,
so the client must GET with Last-Event-ID for the answer (scenario server-sse-polling).
"""

import asyncio
import json
import sys
from typing import Annotated, Any

import mcp_types as types
import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.prompts.base import UserMessage
from mcp.server.streamable_http import EventCallback, EventMessage, EventStore
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import MCPError
from pydantic import Field

IMAGE = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJ"
         "RU5ErkJggg==")
AUDIO = "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA="

server = MCPServer("mcp-conformance-test-server", version="1.0.0")
subscriptions: set[str] = set()


def text(s: str) -> types.TextContent:
    return types.TextContent(type="text", text=s)


@server.tool(description="Tests simple text content response")
def test_simple_text() -> list[Any]:
    return [text("This is a simple text response for testing.")]


@server.tool(description="Echoes its region, which clients mirror in Mcp-Param-Region")
def test_header_param(
        region: Annotated[str, Field(json_schema_extra={"x-mcp-header": "Region"})]) -> str:
    return f"region={region}"


async def close_after_priming(ctx: Context) -> None:
    """Close the call's stream (a no-op over stdio, and for clients before 2025-11-25) once
    its priming event is out: the SDK writes that event while the tool runs, and a stream
    closed at once may end before it, leaving the client no id to resume from."""
    await asyncio.sleep(0.05)
    await ctx.close_sse_stream()


@server.tool(description="Tests SSE stream disconnection and client reconnection (SEP-1699): "
             "the server closes the stream mid-call and answers after the client reconnects")
async def test_reconnection(ctx: Context) -> list[Any]:
    await close_after_priming(ctx)
    await asyncio.sleep(0.1)
    return [text("Reconnection test completed successfully. If you received this, the client "
                 "properly reconnected after stream closure.")]


@server.tool(description="Tests image content response")
def test_image_content() -> list[Any]:
    return [types.ImageContent(type="image", data=IMAGE, mime_type="image/png")]


@server.tool(description="Tests audio content response")
def test_audio_content() -> list[Any]:
    return [types.AudioContent(type="audio", data=AUDIO, mime_type="audio/wav")]


def _resource(uri: str, mime: str, body: str) -> types.EmbeddedResource:
    return types.EmbeddedResource(type="resource", resource=types.TextResourceContents(
        uri=uri, mime_type=mime, text=body))


@server.tool(description="Tests embedded resource content response")
def test_embedded_resource() -> list[Any]:
    return [_resource("test://embedded-resource", "text/plain",
                      "This is an embedded resource content.")]


@server.tool(description="Tests response with multiple content types (text, image, resource)")
def test_multiple_content_types() -> list[Any]:
    return [text("Multiple content types test:"),
            types.ImageContent(type="image", data=IMAGE, mime_type="image/png"),
            _resource("test://mixed-content-resource", "application/json",
                      json.dumps({"test": "data", "value": 123}))]


async def _log(ctx: Context, message: str) -> None:
    await ctx.session.send_log_message(level="info", data=message, logger="conformance",
                                       related_request_id=ctx.request_id)


@server.tool(description="Tests tool that emits log messages during execution")
async def test_tool_with_logging(ctx: Context) -> list[Any]:
    for message in ("Tool execution started", "Tool processing data", "Tool execution completed"):
        await _log(ctx, message)
    return [text("Tool with logging executed successfully")]


@server.tool(description="Closes its stream, then logs and answers `word` (after a resume)")
async def reconnect_and_log(word: str, ctx: Context) -> str:
    await close_after_priming(ctx)
    await _log(ctx, f"log for {word}")  # stored for the stream's replay
    await asyncio.sleep(0.1)
    return f"answer for {word}"


@server.tool(description="Tests tool that reports progress notifications")
async def test_tool_with_progress(ctx: Context) -> list[Any]:
    for step in (0, 50, 100):
        await ctx.report_progress(step, 100, f"Completed step {step} of 100")
    return [text(str(step))]


@server.tool(description="Tests error response handling")
def test_error_handling() -> list[Any]:
    raise RuntimeError("This tool intentionally returns an error for testing")


@server.tool(description="Tests server-initiated sampling (LLM completion request)")
async def test_sampling(prompt: str, ctx: Context) -> list[Any]:
    result = await ctx.session.create_message(
        messages=[types.SamplingMessage(role="user", content=text(prompt))], max_tokens=100)
    content = result.content
    reply = getattr(content, "text", None) or "No response"
    return [text(f"LLM response: {reply}")]


async def _elicit(ctx: Context, message: str, schema: dict[str, Any]) -> str:
    result = await ctx.session.elicit_form(message, schema, related_request_id=ctx.request_id)
    return f"action={result.action}, content={json.dumps(result.content or {})}"


@server.tool(description="Tests server-initiated elicitation (user input request)")
async def test_elicitation(message: str, ctx: Context) -> list[Any]:
    answer = await _elicit(ctx, message, {
        "type": "object", "required": ["response"],
        "properties": {"response": {"type": "string", "description": "User's response"}}})
    return [text(f"User response: {answer}")]


@server.tool(description="Tests elicitation with default values per SEP-1034")
async def test_elicitation_sep1034_defaults(ctx: Context) -> list[Any]:
    answer = await _elicit(ctx, "Please review and update the form fields with defaults", {
        "type": "object", "required": [], "properties": {
            "name": {"type": "string", "description": "User name", "default": "John Doe"},
            "age": {"type": "integer", "description": "User age", "default": 30},
            "score": {"type": "number", "description": "User score", "default": 95.5},
            "status": {"type": "string", "description": "User status",
                       "enum": ["active", "inactive", "pending"], "default": "active"},
            "verified": {"type": "boolean", "description": "Verification status",
                         "default": True}}})
    return [text(f"Elicitation completed: {answer}")]


@server.tool(description="Tests elicitation with enum schema improvements per SEP-1330")
async def test_elicitation_sep1330_enums(ctx: Context) -> list[Any]:
    titled = [{"const": f"value{i}", "title": t}
              for i, t in enumerate(("First Option", "Second Option", "Third Option"), 1)]
    answer = await _elicit(ctx, "Please select options from the enum fields", {
        "type": "object", "required": [], "properties": {
            "untitledSingle": {"type": "string", "description": "Select one option",
                               "enum": ["option1", "option2", "option3"]},
            "titledSingle": {"type": "string", "description": "Select one option with titles",
                             "oneOf": titled},
            "legacyEnum": {"type": "string", "description": "Select one option (legacy)",
                           "enum": ["opt1", "opt2", "opt3"],
                           "enumNames": ["Option One", "Option Two", "Option Three"]},
            "untitledMulti": {"type": "array", "description": "Select multiple options",
                              "minItems": 1, "maxItems": 3,
                              "items": {"type": "string",
                                        "enum": ["option1", "option2", "option3"]}},
            "titledMulti": {"type": "array", "description": "Select multiple options with titles",
                            "minItems": 1, "maxItems": 3, "items": {"anyOf": titled}}}})
    return [text(f"Elicitation completed: {answer}")]


# -- Tools that ask the client, in both eras (the server is dual-era: mcp 2.x serves the era
# a client opens with). On a modern request what is missing is asked for with an
# InputRequiredResult under the scenarios' keys and answered in inputResponses (the SDK
# seals requestState); on a legacy session each is an ordinary server-to-client request,
# whose key the gateway learns from the hint below when it bridges the call.
NAME = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
KEY = "mcp-task-gateway/inputKey"  # lets the gateway name the input request's key
MODERN = "2026-07-28"


def elicit(message: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"method": "elicitation/create",
            "params": {"message": message, "requestedSchema": schema}}


def sample(prompt: str, max_tokens: int = 100) -> dict[str, Any]:
    return {"method": "sampling/createMessage", "params": {
        "messages": [{"role": "user", "content": {"type": "text", "text": prompt}}],
        "maxTokens": max_tokens}}


ROOTS = {"method": "roots/list", "params": {}}
RESULTS = {"elicitation/create": (types.ElicitRequest, types.ElicitResult),
           "sampling/createMessage": (types.CreateMessageRequest, types.CreateMessageResult),
           "roots/list": (types.ListRootsRequest, types.ListRootsResult)}


def modern(ctx: Context) -> bool:
    return ctx.protocol_version == MODERN


def _plain(value: Any) -> dict[str, Any]:
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json", by_alias=True, exclude_none=True)
    if not isinstance(value, dict):
        raise MCPError(-32602, "Invalid params: each input response must be an object")
    return value


async def _legacy(ctx: Context, key: str, ask: dict[str, Any]) -> dict[str, Any]:
    request, result = RESULTS[ask["method"]]
    params = {**ask["params"], "_meta": {KEY: key}}
    answer = await ctx.session.send_request(
        request.model_validate({"method": ask["method"], "params": params}), result)
    return _plain(answer)


async def need(ctx: Context, asks: dict[str, dict[str, Any]], state: dict[str, Any] | None = None
               ) -> dict[str, dict[str, Any]] | types.InputRequiredResult:
    """Every answer of `asks` (key -> input request), or the InputRequiredResult asking
    for those a modern request did not bring; `state` rides requestState to the next round."""
    if not modern(ctx):
        keys = list(asks)
        answers = await asyncio.gather(*(_legacy(ctx, k, asks[k]) for k in keys))
        return dict(zip(keys, answers, strict=True))
    given = ctx.input_responses or {}
    got = {k: _plain(given[k]) for k in asks if given.get(k) is not None}
    missing = {k: v for k, v in asks.items() if k not in got}
    if not missing:
        return got
    return types.InputRequiredResult.model_validate({
        "resultType": "input_required", "inputRequests": missing,
        "requestState": json.dumps({"asked": sorted(missing), **(state or {})})})


def content(answer: dict[str, Any]) -> dict[str, Any]:
    return answer.get("content") or {}


def said(answer: dict[str, Any]) -> str:
    return str(content(answer).get("text", ""))


def earlier(ctx: Context) -> dict[str, Any]:
    """What an earlier round kept in requestState (the SDK checked its seal)."""
    if not modern(ctx) or not ctx.request_state:
        return {}
    state = json.loads(ctx.request_state)
    return state if isinstance(state, dict) else {}


@server.tool(description="MRTR: one elicitation")
async def test_input_required_result_elicitation(ctx: Context) -> Any:
    got = await need(ctx, {"user_name": elicit("What is your name?", NAME)})
    if isinstance(got, types.InputRequiredResult):
        return got
    return [text(f"Hello, {content(got['user_name']).get('name')}!")]


@server.tool(description="MRTR: one sampling request")
async def test_input_required_result_sampling(ctx: Context) -> Any:
    got = await need(ctx, {"capital_question": sample("What is the capital of France?")})
    if isinstance(got, types.InputRequiredResult):
        return got
    return [text(f"Sampling said: {said(got['capital_question'])}")]


@server.tool(description="MRTR: one roots/list request")
async def test_input_required_result_list_roots(ctx: Context) -> Any:
    got = await need(ctx, {"client_roots": ROOTS})
    if isinstance(got, types.InputRequiredResult):
        return got
    roots = [str(r.get("uri")) for r in got["client_roots"].get("roots") or ()]
    return [text(f"Roots: {', '.join(roots)}")]


@server.tool(description="MRTR: requestState round trip")
async def test_input_required_result_request_state(ctx: Context) -> Any:
    got = await need(ctx, {"confirm": elicit("Please confirm", {
        "type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]})})
    if isinstance(got, types.InputRequiredResult):
        return got
    return [text(f"state-ok: confirmed={content(got['confirm']).get('ok')}")]


@server.tool(description="MRTR: several inputs at once")
async def test_input_required_result_multiple_inputs(ctx: Context) -> Any:
    got = await need(ctx, {"user_name": elicit("What is your name?", NAME),
                           "greeting": sample("Generate a greeting", 50),
                           "client_roots": ROOTS})
    if isinstance(got, types.InputRequiredResult):
        return got
    roots = got["client_roots"].get("roots") or ()
    return [text(f"name={content(got['user_name']).get('name')} "
                 f"greeting={said(got['greeting'])} roots={len(roots)}")]


@server.tool(description="MRTR: two rounds")
async def test_input_required_result_multi_round(ctx: Context) -> Any:
    name = earlier(ctx).get("name")
    if name is None:
        got = await need(ctx, {"step1": elicit("Step 1: What is your name?", NAME)})
        if isinstance(got, types.InputRequiredResult):
            return got
        name = content(got["step1"]).get("name")
    color = {"type": "object", "properties": {"color": {"type": "string"}},
             "required": ["color"]}
    got = await need(ctx, {"step2": elicit("Step 2: What is your favorite color?", color)},
                     {"name": name})
    if isinstance(got, types.InputRequiredResult):
        return got
    return [text(f"{name} likes {content(got['step2']).get('color')}")]


@server.tool(description="MRTR: tampered state is refused")
async def test_input_required_result_tampered_state(ctx: Context) -> Any:
    got = await need(ctx, {"user_name": elicit("What is your name?", NAME)})
    if isinstance(got, types.InputRequiredResult):
        return got
    return [text(f"Hello, {content(got['user_name']).get('name')}!")]


def _declared(ctx: Context, capability: str) -> bool:
    caps = ctx.client_capabilities
    return caps is not None and getattr(caps, capability, None) is not None


@server.tool(description="Asks for what the client declared of elicitation and sampling")
async def test_input_required_result_capabilities(ctx: Context) -> Any:
    asks = {"user_name": elicit("Your name?", NAME), "greeting": sample("Say hi")}
    if modern(ctx):  # spec MRTR: ask only for what the client declared
        asks = {k: v for k, v in asks.items()
                if _declared(ctx, "elicitation" if k == "user_name" else "sampling")}
    got = await need(ctx, asks) if asks else {}
    if isinstance(got, types.InputRequiredResult):
        return got
    return [text(f"answered: {sorted(got)}")]


@server.tool(description="Needs sampling, which the stateless scenario does not declare")
async def test_missing_capability(ctx: Context) -> Any:
    if modern(ctx) and not _declared(ctx, "sampling"):
        raise MCPError(-32021, "Missing required client capability: sampling",
                       {"requiredCapabilities": {"sampling": {}}})
    got = await need(ctx, {"greeting": sample("Say hi")})
    if isinstance(got, types.InputRequiredResult):
        return got
    return [text(said(got["greeting"]))]


@server.prompt(name="test_input_required_result_prompt", description="MRTR on prompts/get")
async def input_required_prompt(ctx: Context) -> Any:
    got = await need(ctx, {"user_context": elicit("What context should the prompt use?", {
        "type": "object", "properties": {"context": {"type": "string"}},
        "required": ["context"]})})
    if isinstance(got, types.InputRequiredResult):
        return got
    context = content(got["user_context"]).get("context")
    return [UserMessage(text(f"Prompt with context: {context}"))]


@server.tool(description="The protocol version this request was served at")
def protocol_of(ctx: Context) -> str:
    return str(ctx.protocol_version)


# json-schema-2020-12 (SEP-1613, SEP-2106): an input schema of the 2020-12 vocabulary,
# listed as written; the gateway must pass it on untouched.
SCHEMA_2020_12 = {
    "$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
    "$defs": {"address": {"$anchor": "addressDef", "type": "object", "properties": {
        "street": {"type": "string"}, "city": {"type": "string"}}}},
    "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/address"},
                   "contactMethod": {"type": "string", "enum": ["phone", "email"]},
                   "phone": {"type": "string"}, "email": {"type": "string"}},
    "allOf": [{"anyOf": [{"required": ["phone"]}, {"required": ["email"]}]}],
    "if": {"properties": {"contactMethod": {"const": "phone"}}, "required": ["contactMethod"]},
    "then": {"required": ["phone"]}, "else": {"required": ["email"]},
    "additionalProperties": False}


@server.tool(description="A tool whose input schema uses JSON Schema 2020-12")
def json_schema_2020_12_tool(name: str = "") -> str:
    return f"ok {name}"


server._tool_manager.get_tool("json_schema_2020_12_tool").parameters = SCHEMA_2020_12


# -- Tools of the tasks scenarios: plain synchronous code; the gateway alone makes tasks.
@server.tool(description="Sync-only greeting")
def greet(name: str = "world") -> list[Any]:
    return [text(f"Hello, {name}!")]


@server.tool(description="Sleeps `seconds`, then answers")
async def slow_compute(seconds: float = 1.0) -> list[Any]:
    await asyncio.sleep(seconds)
    return [text(f"computed in {seconds} s")]


@server.tool(description="Fails as a tool (isError) after about a second")
async def failing_job() -> list[Any]:
    await asyncio.sleep(1)
    raise RuntimeError("the job failed")


@server.tool(description="Fails with a JSON-RPC error")
async def protocol_error_job() -> list[Any]:
    raise MCPError(-32603, "protocol_error_job always breaks the protocol")


@server.tool(description="Asks for confirmation, then deletes")
async def confirm_delete(ctx: Context, path: str = "/tmp/x") -> Any:
    got = await need(ctx, {"confirm": elicit(f"Delete {path}?", {
        "type": "object", "properties": {"confirm": {"type": "boolean"}},
        "required": ["confirm"]})})
    if isinstance(got, types.InputRequiredResult):
        return got
    return [text(f"deleted {path}: {content(got['confirm'])}")]


@server.tool(description="Asks two questions at once")
async def multi_input(ctx: Context) -> Any:
    got = await need(ctx, {"first": elicit("First?", NAME), "second": elicit("Second?", NAME)})
    if isinstance(got, types.InputRequiredResult):
        return got
    return [text(f"{content(got['first']).get('name')} and {content(got['second']).get('name')}")]


@server.tool(description="Asks for a name, then works long enough to become a task")
async def test_tool_with_task(ctx: Context) -> Any:
    got = await need(ctx, {"user_name": elicit("What is your name?", NAME)})
    if isinstance(got, types.InputRequiredResult):
        return got
    await asyncio.sleep(1.5)
    return [text(f"Hello, {content(got['user_name']).get('name')}! Your task is done.")]


@server.resource("test://static-text", name="static-text", title="Static Text Resource",
                 description="A static text resource for testing", mime_type="text/plain")
def static_text() -> str:
    return "This is the content of the static text resource."


@server.resource("test://static-binary", name="static-binary", title="Static Binary Resource",
                 description="A static binary resource (image) for testing",
                 mime_type="image/png")
def static_binary() -> bytes:
    import base64

    return base64.b64decode(IMAGE)


@server.resource("test://template/{id}/data", name="template", title="Resource Template",
                 description="A resource template with parameter substitution",
                 mime_type="application/json")
def template(id: str) -> str:
    return json.dumps({"id": id, "templateTest": True, "data": f"Data for ID: {id}"})


@server.resource("test://watched-resource", name="watched-resource", title="Watched Resource",
                 description="A resource that can be subscribed to", mime_type="text/plain")
def watched() -> str:
    return "Watched resource content"


@server.prompt(name="test_simple_prompt", title="Simple Test Prompt",
               description="A simple prompt without arguments")
def simple_prompt() -> list[Any]:
    return [UserMessage(text("This is a simple prompt for testing."))]


@server.prompt(name="test_prompt_with_arguments", title="Prompt With Arguments",
               description="A prompt with required arguments")
def prompt_with_arguments(arg1: str, arg2: str) -> list[Any]:
    return [UserMessage(text(
        f"Prompt with arguments: arg1='{arg1}', arg2='{arg2}'"))]


@server.prompt(name="test_prompt_with_embedded_resource", title="Prompt With Embedded Resource",
               description="A prompt that includes an embedded resource")
def prompt_with_embedded_resource(resourceUri: str) -> list[Any]:
    return [UserMessage(_resource(
                resourceUri, "text/plain", "Embedded resource content for testing.")),
            UserMessage(text(
                "Please process the embedded resource above."))]


@server.prompt(name="test_prompt_with_image", title="Prompt With Image",
               description="A prompt that includes image content")
def prompt_with_image() -> list[Any]:
    return [UserMessage(types.ImageContent(
                type="image", data=IMAGE, mime_type="image/png")),
            UserMessage(text("Please analyze the image above."))]


@server.completion()
async def complete(ref: Any, argument: Any, context: Any) -> types.Completion:
    return types.Completion(values=[], total=0, has_more=False)


async def subscribe(ctx: Any, params: types.SubscribeRequestParams) -> types.EmptyResult:
    subscriptions.add(str(params.uri))
    return types.EmptyResult()


async def unsubscribe(ctx: Any, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
    subscriptions.discard(str(params.uri))
    return types.EmptyResult()


async def set_level(ctx: Any, params: types.SetLevelRequestParams) -> types.EmptyResult:
    return types.EmptyResult()


low = server._lowlevel_server
low.add_request_handler("resources/subscribe", types.SubscribeRequestParams, subscribe)
low.add_request_handler("resources/unsubscribe", types.UnsubscribeRequestParams, unsubscribe)
low.add_request_handler("logging/setLevel", types.SetLevelRequestParams, set_level)


# -- Over HTTP: SEP-1699 polling (priming events with `retry`, replay after Last-Event-ID).
class SessionEvents(EventStore):
    """One session's events, kept for replay after a Last-Event-ID. The SDK names a stream
    by its request id, so one store for all sessions would give a session the events of
    another's request of the same id: each session has its own (`_with_events`)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, Any]] = []  # (event id, stream id, message)

    async def store_event(self, stream_id: str, message: Any) -> str:
        event_id = f"e{len(self.events) + 1}"
        self.events.append((event_id, stream_id, message))
        return event_id

    async def replay_events_after(self, last_event_id: str, send_callback: EventCallback
                                  ) -> str | None:
        at = next((i for i, (e, _, _) in enumerate(self.events) if e == last_event_id), None)
        if at is None:
            return None
        stream = self.events[at][1]
        for event_id, stream_id, message in self.events[at + 1:]:
            if stream_id == stream and message is not None:  # None: a priming event
                await send_callback(EventMessage(message, event_id))
        return stream


# The `retry` of every priming event: the 1 s a client waits when a server names none, so
# a dropped GET stream is asked for again no sooner than before (a restart takes a while).
RETRY_MS = 1000
_admit = StreamableHTTPSessionManager._admit_session


def _with_events(self: StreamableHTTPSessionManager, requestor: Any) -> Any:
    transport = _admit(self, requestor)
    if transport is not None:
        transport._event_store = SessionEvents()
    return transport


def serve_http(port: int) -> None:
    StreamableHTTPSessionManager._admit_session = _with_events  # type: ignore[method-assign]
    uvicorn.run(server.streamable_http_app(retry_interval=RETRY_MS), host="127.0.0.1",
                port=port, log_level="warning",
                timeout_graceful_shutdown=2)  # open streams: don't wait on them


if __name__ == "__main__":
    if sys.argv[1:2] == ["http"]:
        serve_http(int(sys.argv[2]))
    else:
        server.run("stdio")
