"""The gateway's HTTP connections (downstream/serving.py): a POST to an MCP path is served below
aiohttp's web layer, every other request as aiohttp serves it, on the same connection;
what HTTP/1.1 asks of a connection holds for both (keep-alive, pipelining, Connection:
close, HTTP/1.0, chunked bodies, Expect, a body left unread), and a lean answer carries the
headers the routed one does. Raw sockets: an HTTP client would hide what is checked here."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import aiohttp
import pytest
from conftest import settings_for, wait_until_ready
from yarl import URL

from gateway.app import LEASES, create_app
from gateway.downstream import serving
from gateway.settings.load import from_mapping

MODERN = "2026-07-28"


class Wire:
    """One raw connection to the gateway."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def to(cls, url: str) -> Wire:
        target = URL(url)
        return cls(*await asyncio.open_connection(target.host, target.port))

    async def answer(self) -> tuple[str, dict[str, str], bytes]:
        """The next answer: its status line, headers (lower-cased names) and body."""
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), 10)
        status, *lines = head.decode().split("\r\n")[:-2]
        headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
        body = await self.reader.readexactly(int(headers.get("content-length", 0)))
        return status, headers, body

    async def closed(self) -> bool:
        return await asyncio.wait_for(self.reader.read(), 10) == b""

    def close(self) -> None:
        self.writer.close()


def post(path: str, message: dict, session: str | None = None, version: str = "1.1",
         extra: str = "", chunked: bool = False) -> bytes:
    body = json.dumps(message).encode()
    head = (f"POST {path} HTTP/{version}\r\nHost: 127.0.0.1\r\n"
            "Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
            + (f"Mcp-Session-Id: {session}\r\nMCP-Protocol-Version: 2025-06-18\r\n"
               if session else "") + extra)
    if chunked:
        return (head + "Transfer-Encoding: chunked\r\n\r\n").encode() + b"".join(
            b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:7], body[7:])) + b"0\r\n\r\n"
    return (head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def echo(n: int, text: str) -> dict:
    return {"jsonrpc": "2.0", "id": n, "method": "tools/call",
            "params": {"name": "echo", "arguments": {"text": text}}}


def echoed(body: bytes) -> str:
    return str(json.loads(body)["result"]["content"][0]["text"])


async def test_one_connection_serves_pipelined_requests_of_both_paths_in_order(
        gateway, client) -> None:
    url = await gateway()
    mcp = client(url)
    await mcp.initialize()
    conn = await Wire.to(url)
    conn.writer.write(post("/mcp", echo(1, "one"), mcp.session_id)
                      + b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
                      + post("/mcp", echo(2, "two"), mcp.session_id, chunked=True)
                      + post("/mcp?routed", echo(3, "three"), mcp.session_id))
    answers = [await conn.answer() for _ in range(4)]
    assert [status for status, _, _ in answers] == ["HTTP/1.1 200 OK"] * 4
    assert echoed(answers[0][2]) == "one"
    assert json.loads(answers[1][2]) == {"status": "ok"}
    assert [echoed(answers[2][2]), echoed(answers[3][2])] == ["two", "three"]
    conn.writer.write(post("/mcp", echo(4, "last"), mcp.session_id, extra="Connection: close\r\n"))
    status, headers, body = await conn.answer()
    assert (status, headers["connection"], echoed(body)) == ("HTTP/1.1 200 OK", "close", "last")
    assert await conn.closed()
    conn.close()


@pytest.mark.parametrize("upgrade", [
    "Connection: Upgrade\r\nUpgrade: websocket\r\n",
    "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQ\r\n"])
async def test_a_declined_upgrade_leaves_the_connection_serving(gateway, client,
                                                                upgrade) -> None:
    """A POST asking to upgrade (curl --http2 on http:// asks for h2c): aiohttp declines
    and reads on what followed it, so the lean path leaves such a request to aiohttp (it
    once left the connection deaf to the next request)."""
    url = await gateway()
    mcp = client(url)
    await mcp.initialize()
    conn = await Wire.to(url)
    conn.writer.write(post("/mcp", echo(1, "up"), mcp.session_id, extra=upgrade))
    assert echoed((await conn.answer())[2]) == "up"
    conn.writer.write(post("/mcp", echo(2, "after"), mcp.session_id))
    assert echoed((await conn.answer())[2]) == "after"
    conn.close()


async def test_a_lean_answer_carries_the_headers_a_routed_one_does(gateway, client) -> None:
    """The same request by its MCP path (lean) and spelled so that only the router finds it
    (with a query): the same headers, CORS and Date included, bar the Date's value."""
    origin = "http://app.example"
    url = await gateway(security={"allowed_origins": [origin]})
    mcp = client(url)
    await mcp.initialize(headers={"Origin": origin})
    conn = await Wire.to(url)
    seen = []
    for path in ("/mcp", "/mcp?routed"):
        conn.writer.write(post(path, echo(1, "x"), mcp.session_id, extra=f"Origin: {origin}\r\n"))
        status, headers, body = await conn.answer()
        seen.append((status, {k: v for k, v in headers.items() if k != "date"}, body))
        assert "date" in headers
    assert seen[0] == seen[1]
    assert seen[0][1]["access-control-allow-origin"] == origin
    conn.close()


async def test_a_refused_body_left_unread_keeps_the_connection(gateway, client) -> None:
    """401 is answered before the body is read (its challenge added to the lean answer);
    the body is then read and dropped, and the connection serves the next request."""
    url = await gateway(auth={"bearer_tokens": ["secret-token-of-twenty-chars"]})
    conn = await Wire.to(url)
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"}}}
    conn.writer.write(post("/mcp", init))
    status, headers, _ = await conn.answer()
    assert status == "HTTP/1.1 401 Unauthorized"
    assert headers["www-authenticate"].startswith("Bearer")
    conn.writer.write(post("/mcp", init,
                           extra="Authorization: Bearer secret-token-of-twenty-chars\r\n"))
    status, headers, _ = await conn.answer()
    assert status == "HTTP/1.1 200 OK" and "mcp-session-id" in headers
    conn.close()


async def test_http10_expect_and_unparsable_requests(gateway, client) -> None:
    url = await gateway()
    mcp = client(url)
    await mcp.initialize()
    conn = await Wire.to(url)
    conn.writer.write(post("/mcp", echo(1, "old"), mcp.session_id, version="1.0"))
    status, _, body = await conn.answer()
    assert (status, echoed(body)) == ("HTTP/1.0 200 OK", "old")
    assert await conn.closed()  # HTTP/1.0 without keep-alive
    conn.close()
    conn = await Wire.to(url)
    request = post("/mcp", echo(2, "expected"), mcp.session_id, extra="Expect: 100-continue\r\n")
    head, _, body = request.partition(b"\r\n\r\n")
    conn.writer.write(head + b"\r\n\r\n")
    assert (await conn.reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 100 Continue")
    conn.writer.write(body)
    status, _, answer = await conn.answer()
    assert (status, echoed(answer)) == ("HTTP/1.1 200 OK", "expected")
    conn.writer.write(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: x\r\n\r\n")
    status, _, _ = await conn.answer()
    assert status.endswith(" 400 Bad Request")  # aiohttp's answer, as before
    assert await conn.closed()
    conn.close()


def modern(n: int, name: str, arguments: dict) -> bytes:
    """A modern tools/call (2026-07-28: no session, its envelope in _meta and headers)."""
    return post("/mcp", {"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": {
        "name": name, "arguments": arguments, "_meta": {
            "io.modelcontextprotocol/protocolVersion": MODERN,
            "io.modelcontextprotocol/clientCapabilities": {}}}},
        extra=f"MCP-Protocol-Version: {MODERN}\r\nMcp-Method: tools/call\r\n"
              f"Mcp-Name: {name}\r\n")


async def test_a_call_whose_client_goes_away_is_cancelled(gateway) -> None:
    """Handler cancellation holds on the lean path: a modern client cancels by closing its
    connection (spec 2026-07-28), and the server is told."""
    url = await gateway()
    conn = await Wire.to(url)
    conn.writer.write(modern(9, "sleep", {"ms": 5000}))
    await asyncio.sleep(0.5)
    conn.close()
    seen: list = []
    for n in range(50):
        conn = await Wire.to(url)
        conn.writer.write(modern(10 + n, "cancelled", {}))
        _, _, body = await conn.answer()
        conn.close()
        if seen := json.loads(echoed(body)):
            break
        await asyncio.sleep(0.1)
    assert len(seen) == 1  # the call in flight, cancelled upstream


def test_the_installed_aiohttp_is_the_one_serving_follows() -> None:
    """serving.py redoes aiohttp 3.14's connection loop on its private parts: another aiohttp
    is served aiohttp's own way (slower), so an upgrade shows here first."""
    assert aiohttp.__version__.startswith(serving.AIOHTTP)


def blob(n: int, size: int) -> dict:
    return {"jsonrpc": "2.0", "id": n, "method": "tools/call",
            "params": {"name": "blob", "arguments": {"bytes": size}}}


async def test_a_client_that_does_not_read_holds_back_only_its_own_pipeline(
        aiohttp_server, client) -> None:
    """A client pipelining calls with big answers and reading none: the connection waits
    for it once its buffer is full, as aiohttp's own writes do, instead of reading and
    answering on into memory (an attack on the lean path grew the gateway by 60 KB a
    pipelined request, 240 MiB in five seconds)."""
    server = await aiohttp_server(create_app(from_mapping(settings_for())))
    url = str(server.make_url("/mcp"))
    await wait_until_ready(url.removesuffix("/mcp"))
    mcp = client(url)
    await mcp.initialize()
    conn = await Wire.to(url)
    conn.writer.transport.set_write_buffer_limits(high=1 << 20)  # the client's own side
    conn.writer.transport.pause_reading()  # and it reads nothing
    conn.writer.write(b"".join(post("/mcp", blob(n, 60_000), mcp.session_id)
                               for n in range(300)))
    held = await settled(lambda: sum(c.transport.get_write_buffer_size()
                                     for c in server.runner.server.connections
                                     if c.transport is not None))
    assert held < 1 << 20, f"{held} bytes of answers held for a client that reads none"
    conn.close()


async def settled(read: Callable[[], int]) -> int:
    """`read()` once it has not grown for half a second (five seconds at most)."""
    last = -1
    for _ in range(50):
        now = read()
        if now == last:
            break
        last = now
        await asyncio.sleep(0.5)
    return last


async def test_pipelined_refusals_leave_the_loop_to_others(aiohttp_server) -> None:
    """Refusals never wait on anything: a connection pipelining thousands of them is served
    a request a turn of the loop, as aiohttp's task a request did, so other clients are not
    held up (an attack held /healthz for 0.4 s a batch: a read buffer's ~1,800 requests
    answered in one turn)."""
    app = create_app(from_mapping(settings_for()))
    server = await aiohttp_server(app)
    counters = app[LEASES].answers.counters
    refusals = lambda: sum(counters.rejections.values())  # noqa: E731
    most, done = 0, asyncio.Event()

    async def other() -> None:  # another client's work: it runs once a turn of the loop
        nonlocal most
        seen = refusals()
        while not done.is_set():
            await asyncio.sleep(0)
            most, seen = max(most, refusals() - seen), refusals()

    watching = asyncio.create_task(other())
    conn = await Wire.to(str(server.make_url("/mcp")))
    refused = post("/mcp", {"jsonrpc": "2.0", "id": 1, "method": "ping"}).replace(
        b"Host: 127.0.0.1", b"Host: evil.example")
    conn.writer.write(refused * 1000)
    answers = [await conn.answer() for _ in range(1000)]
    done.set()
    await watching
    assert {status for status, _, _ in answers} == {"HTTP/1.1 421 Misdirected Request"}
    assert refusals() >= 1000 and most <= 2, f"{most} requests served in one turn of the loop"
    conn.close()


async def test_a_body_that_never_arrives_whole_is_refused_in_time(gateway, client) -> None:
    """limits.body_timeout_ms: a client that sends its headers and part of its body, then
    nothing, gets 408 rather than holding the connection and its handler for as long as it
    likes; a body that arrives in parts within the time is served."""
    url = await gateway(limits={"body_timeout_ms": 300})
    mcp = client(url)
    await mcp.initialize()
    whole = post("/mcp", echo(1, "slow but whole"), mcp.session_id)
    conn = await Wire.to(url)
    conn.writer.write(whole[:-10])
    await asyncio.sleep(0.1)
    conn.writer.write(whole[-10:])
    assert echoed((await conn.answer())[2]) == "slow but whole"
    conn.writer.write(post("/mcp", echo(2, "never whole"), mcp.session_id)[:-5])
    status, _, body = await conn.answer()
    assert status == "HTTP/1.1 408 Request Timeout"
    assert "did not arrive within 0.3 s" in json.loads(body)["error"]["message"]
    conn.close()
