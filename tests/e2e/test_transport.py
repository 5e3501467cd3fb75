"""Downstream Streamable HTTP, legacy era: each rule of the transport spec and each bad input."""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest
from mcp_http import ACCEPT_BOTH, McpHttp, parse_sse, text_of
from yarl import URL


async def test_initialize_issues_a_secure_session_and_negotiates(gateway, client) -> None:
    mcp: McpHttp = client(await gateway())
    reply = await mcp.initialize(version="2025-03-26")
    sid = reply.headers["Mcp-Session-Id"]
    assert len(sid) >= 32 and all(0x21 <= ord(c) <= 0x7E for c in sid)
    result = reply.body["result"]
    assert result["protocolVersion"] == "2025-03-26"
    assert result["serverInfo"]["name"] == "basic-test-server"  # from the upstream
    assert result["instructions"] == "A server for tests."
    other = client(mcp.url)
    assert (await other.initialize(version="1999-01-01")).body["result"]["protocolVersion"] \
        == "2025-11-25"
    assert other.session_id != sid


async def test_plain_call_is_json_and_related_messages_make_it_sse(gateway, client) -> None:
    mcp = client(await gateway())
    await mcp.initialize()
    plain = await mcp.call("echo", {"text": "hi"})
    assert plain.headers["Content-Type"].startswith("application/json")
    assert text_of(plain) == "hi"
    streamed = await mcp.call("progress", {"steps": 3}, meta={"progressToken": "p-1"})
    assert streamed.headers["Content-Type"].startswith("text/event-stream")
    progress = [e for e in streamed.events if e.get("method") == "notifications/progress"]
    assert [p["params"]["progress"] for p in progress] == [1, 2, 3]
    assert all(p["params"]["progressToken"] == "p-1" for p in progress)
    assert text_of(streamed) == "done 3"
    assert len(set(streamed.event_ids)) == len(streamed.events)  # every event has its own id


async def test_notifications_and_responses_get_202(gateway, client) -> None:
    mcp = client(await gateway())
    await mcp.initialize()
    reply = await mcp.send({"jsonrpc": "2.0", "method": "notifications/roots/list_changed"})
    assert reply.status == 202 and reply.raw == b""


async def test_a_cancel_naming_no_possible_request_is_ignored(gateway, client) -> None:
    """Issue 11: a requestId that is an array or object once answered 500."""
    mcp = client(await gateway())
    await mcp.initialize()
    for bad in ([1], {"a": 1}, None):
        reply = await mcp.send({"jsonrpc": "2.0", "method": "notifications/cancelled",
                                "params": {"requestId": bad}})
        assert reply.status == 202
    assert text_of(await mcp.call("echo", {"text": "still fine"})) == "still fine"


async def test_an_id_already_in_flight_is_refused_and_the_first_call_answered(
        gateway, client) -> None:
    """A request reusing the id of one still in flight on its session is refused (its
    answer could not be told from the first's: a JSON-RPC error, HTTP 200 as a server's),
    whatever it asks, before anything is done for it; the first call is answered as if
    nothing happened, and the id is free after."""
    mcp = client(await gateway())
    await mcp.initialize()
    first = asyncio.ensure_future(mcp.send({"jsonrpc": "2.0", "id": 77, "method": "tools/call",
                                            "params": {"name": "sleep",
                                                       "arguments": {"ms": 600}}}))
    await asyncio.sleep(0.2)
    for method, params in (("tools/call", {"name": "echo", "arguments": {"text": "x"}}),
                           ("ping", {}), ("resources/subscribe", {"uri": "test://r"})):
        again = await mcp.send({"jsonrpc": "2.0", "id": 77, "method": method,
                                "params": params})
        assert again.status == 200, (method, again.raw)
        assert again.message["error"]["code"] == -32600
        assert "already in flight" in again.message["error"]["message"]
    answered = await first
    assert answered.message["id"] == 77 and text_of(answered) == "slept 600"
    reused = await mcp.send({"jsonrpc": "2.0", "id": 77, "method": "tools/call",
                             "params": {"name": "echo", "arguments": {"text": "free"}}})
    assert text_of(reused) == "free"


async def test_an_answer_nested_too_deep_fails_its_call_with_a_reason(gateway, client) -> None:
    mcp = client(await gateway())
    await mcp.initialize()
    error = (await mcp.call("deep", {"levels": 230})).message["error"]
    assert error["code"] == -32603 and "nested deeper than 200 levels" in error["message"]
    assert text_of(await mcp.call("deep", {"levels": 150})).startswith("nested 150")


@pytest.mark.parametrize(("data", "code"), [
    (b"{not json", -32700),
    (b"[]", -32600),
    (b'[{"jsonrpc":"2.0","id":1,"method":"ping"}]', -32600),
    (b'{"jsonrpc":"1.0","id":1,"method":"ping"}', -32600),
    (b'{"jsonrpc":"2.0","id":null,"method":"ping"}', -32600),
    (b'{"jsonrpc":"2.0","method":7}', -32600),
    (b'"just a string"', -32600),
    # Issue 11: once 500s. A response whose id is an object; a request nested deeper than
    # the gateway can write again (orjson reads 1024 levels and writes 254).
    (b'{"jsonrpc":"2.0","id":{"a":1},"result":{}}', -32600),
    (b'{"jsonrpc":"2.0","id":[1],"error":{"code":1,"message":"x"}}', -32600),
    (b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":'
     + b'{"a":' * 300 + b"1" + b"}" * 300 + b"}}", -32600),
])
async def test_malformed_bodies_get_json_rpc_errors(gateway, client, data, code) -> None:
    mcp = client(await gateway())
    await mcp.initialize()
    reply = await mcp.send(None, data=data)
    assert reply.status == 400
    assert reply.body["error"]["code"] == code
    assert reply.body["id"] is None
    assert text_of(await mcp.call("echo", {"text": "still fine"})) == "still fine"


async def test_session_header_rules(gateway, client, http) -> None:
    url = await gateway()
    mcp = client(url)
    await mcp.initialize()
    ping = b'{"jsonrpc":"2.0","id":1,"method":"ping"}'
    base = {"Content-Type": "application/json", "Accept": ACCEPT_BOTH}
    async with http.post(url, data=ping, headers=base) as resp:
        assert resp.status == 400
        assert "Mcp-Session-Id" in (await resp.json())["error"]["message"]
    async with http.post(url, data=ping, headers={**base, "Mcp-Session-Id": "nope"}) as resp:
        assert resp.status == 404
    assert (await mcp.send(None, data=ping)).status == 200
    async with http.delete(url, headers={"Mcp-Session-Id": mcp.session_id}) as resp:
        assert resp.status == 200
    assert (await mcp.send(None, data=ping)).status == 404  # ended sessions stay ended
    async with http.get(url, headers={"Mcp-Session-Id": mcp.session_id,
                                      "Accept": "text/event-stream"}) as resp:
        assert resp.status == 404


async def test_protocol_version_header_is_checked(gateway, client) -> None:
    mcp = client(await gateway())
    await mcp.initialize()
    bad = await mcp.send({"jsonrpc": "2.0", "id": 1, "method": "ping"},
                         **{"MCP-Protocol-Version": "2024-01-01"})
    assert bad.status == 400
    assert bad.body["error"]["data"]["requested"] == "2024-01-01"
    assert "2025-11-25" in bad.body["error"]["data"]["supported"]


async def test_origin_is_checked_and_cors_served(gateway, client, http) -> None:
    url = await gateway(security={"allowed_origins": ["http://localhost"]})
    mcp = client(url)
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t",
                                                                            "version": "1"}}}
    evil = await mcp.send(init, Origin="http://evil.example")
    assert evil.status == 403
    assert "evil.example" in evil.body["error"]["message"]
    ok = await mcp.send(init, Origin="http://localhost:6274")  # the MCP Inspector's port
    assert ok.status == 200
    assert ok.headers["Access-Control-Allow-Origin"] == "http://localhost:6274"
    assert "Mcp-Session-Id" in ok.headers["Access-Control-Expose-Headers"]
    async with http.options(url, headers={
            "Origin": "http://localhost:6274", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type, mcp-session-id"}) as pre:
        assert pre.status == 204
        assert "POST" in pre.headers["Access-Control-Allow-Methods"]
        assert "mcp-session-id" in pre.headers["Access-Control-Allow-Headers"]
        assert pre.headers["Access-Control-Allow-Origin"] == "http://localhost:6274"


async def test_oversize_body_gets_413(gateway, client) -> None:
    mcp = client(await gateway(limits={"max_body_bytes": 2048}))
    await mcp.initialize()
    reply = await mcp.call("echo", {"text": "x" * 4096})
    assert reply.status == 413
    assert reply.body["error"]["data"]["maxBytes"] == 2048
    assert text_of(await mcp.call("echo", {"text": "small"})) == "small"


async def test_oversize_chunked_body_gets_413(gateway, client, http) -> None:
    url = await gateway(limits={"max_body_bytes": 2048})
    mcp = client(url)
    await mcp.initialize()

    async def body():  # chunked transfer: no Content-Length to refuse up front
        yield b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo",'
        for _ in range(10):
            yield b'"pad":"' + b"z" * 1000 + b'",'
        yield b'"arguments":{}}}'

    async with http.post(url, data=body(), headers=mcp.headers()) as resp:
        assert resp.status == 413
        assert (await resp.json())["error"]["data"]["maxBytes"] == 2048

    async def one_chunk():  # whole in the first read, and still over the bound
        yield b'{"jsonrpc":"2.0","id":2,"method":"ping","params":{"pad":"' + b"z" * 4000 + b'"}}'

    async with http.post(url, data=one_chunk(), headers=mcp.headers()) as resp:
        assert resp.status == 413


async def test_wrong_content_type_and_accept(gateway, client) -> None:
    mcp = client(await gateway())
    await mcp.initialize()
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    assert (await mcp.send(ping, **{"Content-Type": "text/plain"})).status == 415
    assert (await mcp.send(ping, Accept="text/html")).status == 406


async def test_get_stream_carries_server_messages(gateway, client, http) -> None:
    url = await gateway()
    mcp = client(url)
    await mcp.initialize()
    headers = {"Mcp-Session-Id": mcp.session_id, "Accept": "text/event-stream"}
    async with http.get(url, headers=headers) as stream:
        assert stream.status == 200
        assert stream.headers["Content-Type"].startswith("text/event-stream")
        await mcp.call("changed")  # the upstream sends notifications/tools/list_changed
        line = b""
        while b"list_changed" not in line:
            line = await asyncio.wait_for(stream.content.readline(), 5)
    # The GET stream never carries responses: the call's answer went on its own POST.


async def test_last_event_id_replays_a_stream(gateway, client, http) -> None:
    url = await gateway()
    mcp = client(url)
    await mcp.initialize()
    streamed = await mcp.call("progress", {"steps": 3}, meta={"progressToken": 1})
    first_id = streamed.event_ids[0]
    headers = {"Mcp-Session-Id": mcp.session_id, "Accept": "text/event-stream",
               "Last-Event-ID": first_id}
    async with http.get(url, headers=headers) as resumed:
        events, ids = parse_sse(await asyncio.wait_for(resumed.read(), 5))
    assert ids == streamed.event_ids[1:]  # what came after the given id, and only that
    assert events[-1]["result"]["content"][0]["text"] == "done 3"


async def test_slow_call_gets_keepalives(gateway, client, http) -> None:
    url = await gateway(listen={"sse_keepalive_ms": 200})
    mcp = client(url)
    await mcp.initialize()
    reply = await mcp.call("sleep", {"ms": 900})
    assert reply.headers["Content-Type"].startswith("text/event-stream")
    assert reply.raw.count(b": keep-alive") >= 2
    assert text_of(reply) == "slept 900"


async def test_messages_of_several_mib_pass_both_ways(gateway, client) -> None:
    mcp = client(await gateway(limits={"max_body_bytes": 16 << 20}))
    await mcp.initialize()
    big = "y" * (5 << 20)
    assert text_of(await mcp.call("echo", {"text": big})) == big
    assert len(text_of(await mcp.call("blob", {"bytes": 6 << 20}))) == 6 << 20


async def test_unknown_methods_pass_through_to_the_upstream(gateway, client) -> None:
    mcp = client(await gateway())
    await mcp.initialize()
    reply = await mcp.send({"jsonrpc": "2.0", "id": 9, "method": "no/such"})
    assert reply.status == 200
    assert reply.body == {"jsonrpc": "2.0", "id": 9,
                          "error": {"code": -32601, "message": "Method not found: no/such"}}


async def test_bearer_tokens_guard_the_endpoint(gateway, client, http) -> None:
    url = await gateway(auth={"bearer_tokens": ["s3cret", "other"]})
    mcp = client(url)
    with pytest.raises(KeyError):  # no session: the gateway answered 401 with no result
        await mcp.initialize()
    denied = await mcp.send({"jsonrpc": "2.0", "id": 1, "method": "ping"})
    assert denied.status == 401 and denied.headers["WWW-Authenticate"] == "Bearer"
    reply = await mcp.send({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"}}}, Authorization="Bearer s3cret")
    assert reply.status == 200
    mcp.session_id = reply.headers["Mcp-Session-Id"]
    ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
    assert (await mcp.send(ping, Authorization="Bearer s3cret")).status == 200
    # Another valid token cannot use that session: it is bound to the token that opened it.
    stolen = await mcp.send(ping, Authorization="Bearer other")
    assert stolen.status == 404 and stolen.body["error"]["code"] == -32600
    async with http.get(url.replace("/mcp", "/healthz")) as health:
        assert health.status == 200  # probes stay open


async def test_readyz_and_healthz(gateway, http) -> None:
    url = await gateway()
    async with http.get(url.replace("/mcp", "/readyz")) as resp:
        assert resp.status == 200 and await resp.json() == {"ready": True}
    async with http.get(url.replace("/mcp", "/readyz?detail")) as resp:  # an operator's
        body = await resp.json()
    assert resp.status == 200 and body["upstreams"]["main"]["state"] == "ready"
    async with http.get(url.replace("/mcp", "/healthz")) as resp:
        assert resp.status == 200 and (await resp.json()) == {"status": "ok"}


async def raw_post(url: str, headers: dict[str, str], bad: tuple[bytes, bytes],
                   body: bytes) -> tuple[int, dict]:
    """POST with one header whose bytes are not UTF-8 (no HTTP client sends that)."""
    target = URL(url)
    reader, writer = await asyncio.open_connection(target.host, target.port)
    lines = [f"POST {target.path} HTTP/1.1", f"Host: {target.host}", "Connection: close",
             f"Content-Length: {len(body)}", *(f"{k}: {v}" for k, v in headers.items())]
    writer.write("\r\n".join(lines).encode() + b"\r\n" + bad[0] + b": " + bad[1] +
                 b"\r\n\r\n" + body)
    raw = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    head, _, rest = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(rest)


@pytest.mark.parametrize("name", [b"Origin", b"Authorization", b"MCP-Protocol-Version",
                                  b"Mcp-Name", b"X-Anything"])
async def test_header_bytes_that_are_not_utf8_get_400(gateway, client, name) -> None:
    """Issue 11: Origin, Authorization and MCP-Protocol-Version once answered a plain-text
    500 (the value came back in an error, or was compared as a token); every header is now
    checked once, at the boundary. The value is never echoed: it may be a secret. An Origin
    that cannot be read is an invalid one: 403 (spec: MUST), as issue 21 asked."""
    url = await gateway(auth={"bearer_tokens": ["secret"]})
    mcp = client(url)
    await mcp.initialize(headers={"Authorization": "Bearer secret"})
    headers = {**mcp.headers(), "Authorization": "Bearer secret"}
    headers.pop(name.decode(), None)
    body = json.dumps({"jsonrpc": "2.0", "id": 5, "method": "ping"}).encode()
    status, answer = await raw_post(url, headers, (name, b"\xff\xfe" + b"\x80" * 3), body)
    assert answer["error"]["code"] == -32600
    if name == b"Origin":
        assert status == 403
        assert answer["error"]["message"] == "Forbidden: the Origin header is not valid UTF-8"
    else:
        assert status == 400
        assert answer["error"]["message"] == (f"Bad Request: the {name.decode()} header is "
                                              "not valid UTF-8")
    fine = await mcp.send({"jsonrpc": "2.0", "id": 6, "method": "ping"},
                          Authorization="Bearer secret")
    assert fine.status == 200 and fine.body["result"] == {}


async def test_calls_in_flight_are_bounded_per_client(gateway, client) -> None:
    """Issue 11: one client (auth context) cannot hold more than max_calls_per_owner calls
    at once, in either era; a slot comes back when a call ends."""
    url = await gateway(limits={"max_calls_per_owner": 2})
    mcp = client(url)
    await mcp.initialize()
    slow = [asyncio.create_task(mcp.call("sleep", {"ms": 800})) for _ in range(2)]
    await asyncio.sleep(0.2)
    refused = (await mcp.call("echo", {"text": "third"})).message["error"]
    assert refused["code"] == -32000 and refused["data"] == {"maxInFlight": 2}
    assert "Too many calls in flight" in refused["message"]
    await asyncio.gather(*slow)
    assert text_of(await mcp.call("echo", {"text": "after"})) == "after"


@pytest.mark.parametrize("accept", ["text/event-stream", ACCEPT_BOTH])
async def test_a_reader_that_never_reads_is_cut_off(gateway, client, accept) -> None:
    """Issue 11: a client that never reads a big answer, streamed or plain JSON, is cut off
    after slow_reader_ms, which frees what was queued for it; the gateway goes on serving
    others."""
    url = await gateway(limits={"slow_reader_ms": 300})
    mcp = client(url)
    await mcp.initialize()
    target = URL(url)
    reader, writer = await asyncio.open_connection(target.host, target.port)
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "blob", "arguments": {"bytes": 30_000_000}}}).encode()
    writer.write(f"POST {target.path} HTTP/1.1\r\nHost: {target.host}\r\n"
                 "Content-Type: application/json\r\n"
                 f"Accept: {accept}\r\nMcp-Session-Id: {mcp.session_id}\r\n"
                 f"MCP-Protocol-Version: 2025-06-18\r\nContent-Length: {len(body)}\r\n\r\n"
                 .encode() + body)
    await asyncio.sleep(3)  # reads nothing meanwhile
    received = 0
    with contextlib.suppress(ConnectionError):
        while chunk := await asyncio.wait_for(reader.read(1 << 20), 5):
            received += len(chunk)
    writer.close()
    assert 0 < received < 30_000_000  # the connection ended before the whole answer
    assert text_of(await mcp.call("echo", {"text": "still serving"})) == "still serving"
