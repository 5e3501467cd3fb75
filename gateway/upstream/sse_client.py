"""Reading server-sent events from an upstream: the event stream itself, and the endpoint
event of the 2024-11-05 HTTP+SSE transport (spec 2025-06-18 Streamable HTTP, Backwards
Compatibility: its GET stream names where to POST and carries every answer)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin

import aiohttp
from yarl import URL

from gateway.protocol import mcp

RETRY_S = 1.0  # before resuming a stream, unless the server said otherwise (`retry:`)


class Refused(ValueError):
    """An HTTP+SSE stream the gateway does not take: why, as clients may read it, and
    `detail` for the operator's log only (where it pointed: no client learns the inside of
    the network, README.md, Security model)."""

    def __init__(self, why: str, detail: str = "") -> None:
        super().__init__(why)
        self.detail = detail


class EventReader:
    """Reads one SSE stream after another, remembering the last event id and `retry:`."""

    def __init__(self) -> None:
        self.last_id: str | None = None
        self.retry_s = RETRY_S

    async def events(self, resp: aiohttp.ClientResponse) -> AsyncIterator[tuple[str, bytes]]:
        event, data = "message", list[bytes]()
        async for raw in resp.content:
            line = raw.rstrip(b"\r\n")
            if not line:
                payload = b"\n".join(data)
                if payload:  # an event with no data only primes the id (spec: polling)
                    yield event, payload
                event, data = "message", []
                continue
            name, _, value = line.partition(b":")
            value = value[1:] if value.startswith(b" ") else value
            if name == b"data":
                data.append(value)
            elif name == b"event":
                event = value.decode()
            elif name == b"id":
                self.last_id = value.decode()
            elif name == b"retry" and value.isdigit():
                self.retry_s = int(value) / 1000


async def read(reader: EventReader, resp: aiohttp.ClientResponse,
               on_message: Callable[[bytes, Any], object], via: Any) -> None:
    """Every message of one stream to `on_message`, with the call it belongs to (`via`)."""
    async for _, data in reader.events(resp):
        on_message(data, via)


@dataclass(frozen=True, slots=True)
class Got:
    """How a GET went: its HTTP status (None when the connection failed or dropped),
    whether the server could not be reached at all, and the start of a refusal's body."""

    status: int | None
    unreachable: bool = False
    body: bytes = b""


REFUSAL_BYTES = 4096  # of a refused GET's body, kept to say why


async def follow(http: aiohttp.ClientSession, url: str, headers: Mapping[str, str],
                 reader: EventReader, on_message: Callable[[bytes, Any], object], via: Any
                 ) -> Got:
    """GET `url` as an event stream, resumed after the reader's last event id, and read it
    to its end."""
    wanted = {**headers, "Accept": mcp.CT_SSE}
    if reader.last_id is not None:
        wanted[mcp.H_LAST_EVENT] = reader.last_id
    try:
        async with http.get(url, headers=wanted, allow_redirects=False) as resp:
            if resp.status == 200:
                await read(reader, resp, on_message, via)
                return Got(200)
            return Got(resp.status, body=await resp.content.read(REFUSAL_BYTES))
    except aiohttp.ClientConnectorError:
        return Got(None, unreachable=True)
    except (aiohttp.ClientError, TimeoutError):
        return Got(None)


async def open_endpoint(http: aiohttp.ClientSession, url: str, headers: Mapping[str, str]
                        ) -> tuple[aiohttp.ClientResponse, AsyncIterator[tuple[str, bytes]], str]:
    """The HTTP+SSE stream, its events, and the URL its endpoint event names; Refused
    saying what is missing or refused."""
    resp = await http.get(url, headers={**headers, "Accept": mcp.CT_SSE}, allow_redirects=False)
    if resp.status != 200 or resp.content_type != mcp.CT_SSE:
        resp.release()
        raise Refused(f"offers no HTTP+SSE stream (HTTP {resp.status})")
    events = EventReader().events(resp)
    try:
        async for event, data in events:
            if event == "endpoint":
                return resp, events, same_origin(url, urljoin(url, data.decode().strip()))
        raise Refused("its SSE stream named no endpoint")
    except BaseException:
        resp.release()
        raise


def same_origin(configured: str, endpoint: str) -> str:
    """`endpoint`, if it has the configured URL's scheme, host and port: the gateway's
    headers for this upstream (credentials among them) go nowhere else (the MCP SDKs refuse
    another origin too); Refused otherwise."""
    origin = URL(endpoint).origin()
    if origin != URL(configured).origin():
        raise Refused("its endpoint event names another origin, where the gateway does not "
                      "post", detail=f"endpoint event named {origin}")
    return endpoint


async def pump(resp: aiohttp.ClientResponse, events: AsyncIterator[tuple[str, bytes]],
               on_message: Callable[[bytes], object], on_end: Callable[[], None]) -> None:
    """Every message event of the stream to `on_message` until it ends; then `on_end`."""
    try:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async for event, data in events:
                if event == "message":
                    on_message(data)
    finally:
        resp.release()
        on_end()
