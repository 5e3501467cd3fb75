"""An MCP server over HTTP as an upstream: the gateway is a legacy-era client of it.

spec: mcp-base-2025-06-18.md, Streamable HTTP. The connection initializes once (newest legacy
version the server accepts) and keeps the `Mcp-Session-Id` it is given; every message is its
own POST, answered with JSON, an SSE stream, or 202; the server's own requests and
notifications arrive on a GET stream as well. A 4xx to the POST of initialize means a server
of the older HTTP+SSE transport (2024-11-05; spec: Backwards Compatibility): one GET stream
names the endpoint to POST to and carries every answer. Either way all messages are fed to
the same correlation as a stdio upstream (`Connection._on_line`), so routing, tasks and MRTR
do not care which transport is behind a call.

Failures: a POST that cannot connect is tried again (nothing was sent); one whose connection
drops after sending is tried again only for read-only methods; otherwise its call fails at
once with a JSON-RPC error. An SSE answer that ends early is resumed with `Last-Event-ID`
when the server gave event ids. A 404 means the server dropped the session: calls in flight
fail and the connection initializes again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urljoin

import aiohttp

from gateway.errors import UpstreamError
from gateway.observability import log
from gateway.protocol import jsonrpc, mcp
from gateway.protocol.jsonrpc import Message
from gateway.settings import Upstream as UpstreamConf
from gateway.upstream import modern
from gateway.upstream.base import Call, Connection

RETRY_S = 1.0  # between attempts to (re)initialize, and before resuming a stream
CONNECT_ATTEMPTS = 3  # a POST that could not connect sent nothing: safe to try again
RESUME_ATTEMPTS = 5  # GETs with Last-Event-ID for one answer whose stream ended early
# Requests that change nothing on the server: sent again once when the connection drops
# after they went out (others could run twice).
IDEMPOTENT = frozenset({mcp.PING, "tools/list", "prompts/list", "prompts/get",
                        "resources/list", "resources/templates/list", "resources/read",
                        "completion/complete"})


class EventReader:
    """Reads one SSE stream after another, remembering the last event id and `retry:`."""

    def __init__(self) -> None:
        self.last_id: str | None = None
        self.retry_s = RETRY_S

    async def events(self, resp: aiohttp.ClientResponse) -> AsyncIterator[tuple[str, bytes]]:
        event, data = "message", []
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


class HttpUpstream(Connection):
    def __init__(self, name: str, conf: UpstreamConf, restart: bool = True) -> None:
        super().__init__(name, conf.startup_timeout_ms / 1000)
        assert conf.url is not None
        self.conf = conf
        self.url = conf.url
        self.post_url = conf.url  # the HTTP+SSE transport names its own
        self.restart = restart
        self.session_id: str | None = None
        self.version = mcp.LATEST_LEGACY
        self.transport = "streamable-http"
        self._http: aiohttp.ClientSession | None = None
        self._post_timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=conf.connect_timeout_ms / 1000,
            sock_read=conf.read_timeout_ms / 1000 if conf.read_timeout_ms else None)
        self._refused: int | None = None  # HTTP status of a refused initialize POST
        self._lost = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._task: asyncio.Task[None] | None = None
        self._stream: asyncio.Task[None] | None = None  # the HTTP+SSE transport's stream
        self._posts: dict[int, asyncio.Task[None]] = {}  # modern requests, to cancel them

    # -- lifecycle (the same surface as StdioUpstream) ------------------------------------
    def start(self) -> None:
        # GET streams may be quiet for hours: only connecting has a deadline by default.
        timeout = aiohttp.ClientTimeout(total=None,
                                        sock_connect=self.conf.connect_timeout_ms / 1000)
        self._http = aiohttp.ClientSession(timeout=timeout)
        self._task = asyncio.create_task(self._supervise(), name=f"upstream:{self.name}")

    def status(self) -> dict[str, Any]:
        return {**super().status(), "url": self.url, "transport": self.transport}

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for task in [*self._tasks, *([self._stream] if self._stream else [])]:
            task.cancel()
        self.fail_all(UpstreamError(self.name, "the gateway is shutting down", "shutdown"))
        if self._http is not None:
            if self.session_id is not None:  # spec: DELETE ends the session
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with self._http.delete(self.url, headers=self._headers(),
                                                 timeout=aiohttp.ClientTimeout(total=2)):
                        pass
            await self._http.close()

    async def _supervise(self) -> None:
        while True:
            try:
                await self._initialize()
            except (aiohttp.ClientError, UpstreamError, TimeoutError) as exc:
                self.state = "backoff"
                log.error("upstream.start_failed", upstream=self.name, error=str(exc))
                if not self.restart:
                    return
                await asyncio.sleep(RETRY_S)
                continue
            listener = asyncio.create_task(self._listen())
            await self._lost.wait()
            listener.cancel()
            self._on_lost()
            if not self.restart:
                return
            self.restarts += 1

    async def _initialize(self) -> None:
        self.session_id, self.post_url, self._refused = None, self.url, None
        self.transport = "streamable-http"
        self._lost.clear()
        try:
            await self._handshake(self._answer)
        except UpstreamError:
            if self._refused is None:
                raise
            # spec (Backwards Compatibility): a 4xx to the POST of initialize, and no modern
            # server either: the HTTP+SSE transport, whose GET stream names where to POST.
            await self._open_sse_transport()
            await self._handshake(self._answer)
        assert self.init_result is not None
        self.version = self.init_result["protocolVersion"]

    async def _answer(self, reply: asyncio.Future[Message]) -> Message:
        return await asyncio.wait_for(reply, self.startup_timeout_s)

    def _on_lost(self) -> None:
        self.init_result, self.state = None, "restarting"
        self._ready.clear()
        if self._stream is not None:
            self._stream.cancel()
            self._stream = None
        log.warning("upstream.session_lost", upstream=self.name, in_flight=self.in_flight)
        self.fail_all(UpstreamError(self.name, f"upstream '{self.name}' ended its session",
                                    "session_lost"))

    # -- the HTTP+SSE transport (2024-11-05) --------------------------------------------------
    async def _open_sse_transport(self) -> None:
        assert self._http is not None
        resp = await self._http.get(self.url, headers={**self.conf.headers,
                                                       "Accept": mcp.CT_SSE})
        if resp.status != 200 or resp.content_type != mcp.CT_SSE:
            resp.release()
            raise UpstreamError(self.name, f"upstream '{self.name}' refused initialize (HTTP "
                                f"{self._refused}) and offers no HTTP+SSE stream (HTTP "
                                f"{resp.status})", "initialize")
        events = EventReader().events(resp)
        try:
            async for event, data in events:
                if event == "endpoint":
                    self.post_url = urljoin(self.url, data.decode().strip())
                    break
            else:
                raise UpstreamError(self.name, f"upstream '{self.name}': its SSE stream "
                                    "named no endpoint", "initialize")
        except BaseException:
            resp.release()
            raise
        self.transport = "http+sse"
        log.info("upstream.http_sse_transport", upstream=self.name)
        self._stream = asyncio.create_task(self._pump_sse(resp, events))

    async def _pump_sse(self, resp: aiohttp.ClientResponse,
                        events: AsyncIterator[tuple[str, bytes]]) -> None:
        try:
            async for event, data in events:
                if event == "message":
                    self._on_line(data)
        except (aiohttp.ClientError, TimeoutError):
            pass
        finally:
            resp.release()
            self._lost.set()  # this transport's session is its stream

    # -- transport ----------------------------------------------------------------------------
    def _headers(self) -> dict[str, str]:
        headers = {**self.conf.headers, "Content-Type": mcp.CT_JSON,
                   "Accept": f"{mcp.CT_JSON}, {mcp.CT_SSE}"}
        if self.modern is not None:  # stateless: the version on every request, no session
            headers[mcp.H_PROTOCOL] = modern.VERSION
        elif self.session_id is not None:
            headers[mcp.H_SESSION] = self.session_id
            headers[mcp.H_PROTOCOL] = self.version
        return headers

    def _write(self, data: bytes, call: Call | None = None,
               headers: dict[str, str] | None = None) -> None:
        if self._http is None or self._http.closed:
            raise UpstreamError(self.name, f"upstream '{self.name}' is not running", "down")
        task = asyncio.create_task(self._post(data, call, headers))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if self.modern is not None and call is not None:
            uid = call.upstream_id
            self._posts[uid] = task
            task.add_done_callback(lambda _: self._posts.pop(uid, None))

    def cancel(self, call: Call, reason: str) -> None:
        """spec 2026-07-28 cancellation: over HTTP a modern server is told by closing the
        request's stream; a legacy one by notifications/cancelled."""
        post = self._posts.pop(call.upstream_id, None)
        if post is None:
            super().cancel(call, reason)
            return
        self.modern.forget(call)  # type: ignore[union-attr]
        self._calls.pop(call.upstream_id, None)
        post.cancel()

    async def _post(self, data: bytes, call: Call | None, extra: dict[str, str] | None) -> None:
        assert self._http is not None
        headers = {**extra, **self._headers()} if extra else self._headers()
        for attempt in range(1, CONNECT_ATTEMPTS + 1):
            try:
                async with self._http.post(self.post_url, data=data, headers=headers,
                                           timeout=self._post_timeout) as resp:
                    await self._answered(resp, data, call)
                return
            except aiohttp.ClientConnectorError as exc:  # nothing was sent
                why = f"cannot connect: {exc}"
                await asyncio.sleep(0.1 * attempt)
            except TimeoutError:
                why = f"no reply within read_timeout_ms ({self.conf.read_timeout_ms})"
                if call is not None and call.upstream_id in self._calls:
                    self.notify(jsonrpc.notification(mcp.CANCELLED, {
                        "requestId": call.upstream_id, "reason": why}))
                break
            except aiohttp.ClientError as exc:
                why = f"the connection dropped: {exc}"
                if attempt > 1 or _method(data) not in IDEMPOTENT:
                    break
        self._failed(data, call, why)

    async def _answered(self, resp: aiohttp.ClientResponse, data: bytes, call: Call | None
                        ) -> None:
        if resp.status == 404 and self.session_id is not None:
            self._lost.set()  # spec: 404 means the session is gone
            return
        sid = resp.headers.get(mcp.H_SESSION)
        if sid and self.session_id is None:
            self.session_id = sid
        if resp.status >= 400:
            if resp.status < 500 and self.init_result is None:
                self._refused = resp.status
            if resp.content_type == mcp.CT_JSON:  # a JSON-RPC error, e.g. a modern server's
                self._on_line(await resp.read())
            self._failed(data, call, f"HTTP {resp.status}")
        elif resp.content_type == mcp.CT_SSE:
            reader = EventReader()
            await self._read(reader, resp)
            await self._resume(reader, call)
        elif resp.content_type == mcp.CT_JSON:
            self._on_line(await resp.read())
        # else 202 (a notification or response was accepted), or the HTTP+SSE transport,
        # whose answers come on its stream

    async def _read(self, reader: EventReader, resp: aiohttp.ClientResponse) -> None:
        async for _, data in reader.events(resp):
            self._on_line(data)

    async def _resume(self, reader: EventReader, call: Call | None) -> None:
        """spec (Resumability): a stream that ended before the answer is picked up again with
        Last-Event-ID; a server that gave no event ids cannot resume, and the call fails."""
        attempts = 0
        while call is not None and call.upstream_id in self._calls:
            if reader.last_id is None or attempts == RESUME_ATTEMPTS:
                self._failed(b"", call, "the stream ended before the answer")
                return
            attempts += 1
            await asyncio.sleep(reader.retry_s)
            assert self._http is not None
            headers = {**self._headers(), "Accept": mcp.CT_SSE,
                       mcp.H_LAST_EVENT: reader.last_id}
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with self._http.get(self.url, headers=headers) as resp:
                    if resp.status == 200:
                        await self._read(reader, resp)

    async def _listen(self) -> None:
        """The GET stream: the server's messages that belong to no POST (resumed with
        Last-Event-ID after a drop)."""
        if self.transport != "streamable-http":
            return  # the HTTP+SSE stream is read since initialize
        assert self._http is not None
        reader = EventReader()
        while True:
            headers = {**self._headers(), "Accept": mcp.CT_SSE}
            if reader.last_id is not None:
                headers[mcp.H_LAST_EVENT] = reader.last_id
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with self._http.get(self.url, headers=headers) as resp:
                    if resp.status == 405:
                        return  # the server offers no GET stream (spec allows it)
                    if resp.status == 404:
                        self._lost.set()
                        return
                    if resp.status == 200:
                        await self._read(reader, resp)
            await asyncio.sleep(reader.retry_s)

    def _failed(self, data: bytes, call: Call | None, why: str) -> None:
        """A request that got no answer fails now, with a JSON-RPC error that says why."""
        if call is None or self._calls.pop(call.upstream_id, None) is None:
            return
        log.warning("upstream.request_failed", upstream=self.name, reason=why,
                    method=_method(data) if data else None)
        call.sink.on_response(UpstreamError(
            self.name, f"upstream '{self.name}': {why}", "connection").to_message(call.client_id))


def _method(data: bytes) -> str | None:
    with contextlib.suppress(jsonrpc.JSONDecodeError):
        msg = jsonrpc.loads(data)
        if isinstance(msg, dict) and isinstance(msg.get("method"), str):
            return msg["method"]
    return None
