"""What one upstream message costs the connection, from bytes to the sink that gets it.

    .venv/bin/python bench/inbound.py [--messages 200000]

A connection over the mock transport (no I/O, no event loop turns in the timed part) with
one call in flight; the server's messages are fed to `Connection.on_message` as bytes, as a
transport would: progress notifications, log notifications, elicitation requests (each
answered by the client), and responses to fresh calls. Reports µs per message, best of 5.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable

from gateway.observability.counters import Counters
from gateway.protocol import jsonrpc, mcp
from gateway.protocol.jsonrpc import Message
from gateway.upstream.connection import Connection
from gateway.upstream.mock import MockOwner, MockSink, MockTransport


def server(msg: Message) -> list[Message]:
    if msg.get("method") == mcp.INITIALIZE:
        return [jsonrpc.result(msg["id"], {"protocolVersion": "2025-11-25", "capabilities": {},
                                           "serverInfo": {"name": "bench"}})]
    return []


def best_of(n: int, run: Callable[[], None], count: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return min(times) / count * 1e6


async def main(count: int) -> None:
    conn = Connection("bench", lambda link: MockTransport(link, server), 1.0, Counters())
    conn.start()
    await conn.wait_ready()
    owner, sink = MockOwner("bench", "elicitation"), MockSink()
    request = jsonrpc.request(1, mcp.TOOLS_CALL, {"name": "slow", "arguments": {},
                                                  "_meta": {"progressToken": "p"}})
    call = conn.request(request, owner, sink)
    progress = jsonrpc.dumps(jsonrpc.notification(mcp.PROGRESS, {
        "progressToken": call.upstream_id, "progress": 1, "total": 10}))
    logged = jsonrpc.dumps(jsonrpc.notification("notifications/message", {
        "level": "info", "data": "x" * 64}))
    asked = jsonrpc.dumps(jsonrpc.request("srv-1", "elicitation/create", {"message": "?"}))

    def feed(data: bytes) -> Callable[[], None]:
        def run() -> None:
            for _ in range(count):
                conn.on_message(data)
        return run

    def ask_and_answer() -> None:
        for _ in range(count):
            conn.on_message(asked)
            asked_id = sink.messages[-1]["id"]
            conn.reply(asked_id, jsonrpc.result(asked_id, {"action": "decline"}))

    def call_and_answer() -> None:
        for i in range(count):
            c = conn.request(jsonrpc.request(i, mcp.TOOLS_CALL, {"name": "x"}), owner, MockSink())
            conn.on_message(jsonrpc.dumps(jsonrpc.result(c.upstream_id, {"content": []})))

    for name, run in [("progress", feed(progress)), ("log notification", feed(logged)),
                      ("server request + reply", ask_and_answer),
                      ("call + response", call_and_answer)]:
        print(f"{name:24} {best_of(5, run, count):6.2f} µs/message")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    asyncio.run(main(parser.parse_args().messages))
