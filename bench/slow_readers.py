#!/usr/bin/env python3
"""Slow readers: R clients each ask for a big result (the blob tool) and never read it; the
gateway's resident memory while they hang, once the gateway has cut them off
(`limits.slow_reader_ms`), and after they have gone, followed by some ordinary traffic.

    .venv/bin/python bench/slow_readers.py [--readers 6] [--mib 8] [--cut-ms 3000]
"""

from __future__ import annotations

import argparse
import asyncio
import json

from tasks import TaskClient, rss_mib, running

from bench import SERVER, free_port


async def never_read(port: int, size: int) -> asyncio.StreamWriter:
    """A modern tools/call for `size` bytes on a raw connection whose answer nobody reads."""
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "blob", "arguments": {"bytes": size}, "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {}}}}).encode()
    writer.write(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Accept: application/json, text/event-stream\r\n"
                 b"MCP-Protocol-Version: 2026-07-28\r\nMcp-Method: tools/call\r\n"
                 b"Mcp-Name: blob\r\n" + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    await writer.drain()
    return writer


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--readers", type=int, default=6)
    ap.add_argument("--mib", type=int, default=8)
    ap.add_argument("--cut-ms", type=int, default=3000)
    args = ap.parse_args()
    conf = {"listen": {"port": free_port()},
            "upstreams": {"main": {"command": SERVER[0], "args": SERVER[1:]}},
            "limits": {"slow_reader_ms": args.cut_ms, "max_result_bytes": 64 << 20},
            "logging": {"level": "warning"}}
    async with running(conf) as (gateway, client):
        start = rss_mib(gateway.pid)[0]
        writers = [await never_read(conf["listen"]["port"], args.mib << 20)
                   for _ in range(args.readers)]
        await asyncio.sleep(args.cut_ms / 2000)
        hanging = rss_mib(gateway.pid)[0]
        await asyncio.sleep(args.cut_ms / 1000 + 1)
        cut = rss_mib(gateway.pid)[0]
        for writer in writers:
            writer.close()
        await asyncio.sleep(1)
        gone = rss_mib(gateway.pid)[0]
        await ordinary(client)
        later = rss_mib(gateway.pid)
    print(f"{args.readers} readers that never read {args.mib} MiB each; gateway RSS: "
          f"{start:.1f} MiB at the start, {hanging:.1f} while they hang, {cut:.1f} once cut "
          f"off, {gone:.1f} after they left, {later[0]:.1f} after 1,000 ordinary calls "
          f"(peak {later[1]:.1f})")


async def ordinary(client: TaskClient) -> None:
    for _ in range(1000):
        await client.request("tools/call", {"name": "echo", "arguments": {"text": "hi"}})


if __name__ == "__main__":
    asyncio.run(main())
