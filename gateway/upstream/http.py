"""The HTTP transport: an MCP server over Streamable HTTP (or the older HTTP+SSE).

spec: mcp-base-2025-06-18.md, Streamable HTTP. The link's handshake runs over it once, and
the transport keeps the `Mcp-Session-Id` it is given; every message is its own POST,
answered with JSON, an SSE stream, or 202; the server's own requests and notifications
arrive on a GET stream as well. A 4xx to the POST of initialize means a server
of the older HTTP+SSE transport (2024-11-05; spec: Backwards Compatibility): one GET stream
names the endpoint to POST to and carries every answer. Either way every message goes to the
link (connection.py) as a stdio server's would, so routing, tasks and MRTR do not care which
transport is behind a call. Every request carries the protocol version the handshake
settled on (spec: MCP-Protocol-Version on all subsequent requests).

Failures: a POST that cannot connect is tried again (nothing was sent); one whose connection
drops after sending is tried again only for read-only methods; otherwise its call fails at
once with a JSON-RPC error. An SSE answer that ends early is resumed with `Last-Event-ID`
when the server gave event ids. A 404 means the server dropped the session: calls in flight
fail and the connection initializes again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import aiohttp

from gateway.errors import UpstreamError
from gateway.observability import log
from gateway.protocol import jsonrpc, mcp
from gateway.settings import Upstream as UpstreamConf
from gateway.upstream import sse_client
from gateway.upstream.correlator import Call
from gateway.upstream.sse_client import EventReader
from gateway.upstream.transport import Link, start_failed

CONNECT_ATTEMPTS = 3  # a POST that could not connect sent nothing: safe to try again
RESUME_ATTEMPTS = 5  # GETs with Last-Event-ID for one answer whose stream ended early
# Requests that change nothing on the server: sent again once when the connection drops
# after they went out (others could run twice).
IDEMPOTENT = frozenset({mcp.PING, "tools/list", "prompts/list", "prompts/get",
                        "resources/list", "resources/templates/list", "resources/read",
                        "completion/complete"})


class HttpTransport:
    def __init__(self, name: str, conf: UpstreamConf, restart: bool = True) -> None:
        assert conf.url is not None
        self.name = name
        self.state, self.restarts = "starting", 0
        self.conf = conf
        self.url = conf.url
        self.post_url = conf.url  # the HTTP+SSE transport names its own
        self.restart = restart
        self.session_id: str | None = None
        self.version: str | None = None  # what the handshake settled on
        self.kind = "streamable-http"
        self._http: aiohttp.ClientSession | None = None
        self._stream_timeout, self._post_timeout = _timeouts(conf)
        self._refused: int | None = None  # HTTP status of a refused initialize POST
        self._lost = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._task: asyncio.Task[None] | None = None
        self._stream: asyncio.Task[None] | None = None  # the HTTP+SSE transport's stream
        self._posts: dict[int, asyncio.Task[None]] = {}  # by upstream id, to abort them
        self._resending: set[Call] = set()  # calls to send again on the next session
        self._link: Link | None = None

    # -- lifecycle -------------------------------------------------------------------------
    def start(self, link: Link) -> None:
        self._link = link
        self._http = aiohttp.ClientSession(timeout=self._stream_timeout)
        self._task = asyncio.create_task(self._supervise(), name=f"upstream:{self.name}")

    def status(self) -> dict[str, Any]:
        return {"url": self.url, "transport": self.kind}

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for task in [*self._tasks, *([self._stream] if self._stream else [])]:
            task.cancel()
        if self._http is not None:
            if self.session_id is not None:  # spec: DELETE ends the session
                await _delete(self._http, self.url, self._headers())
            await self._http.close()

    async def _supervise(self) -> None:
        failures = 0
        while True:
            try:
                await self._initialize()
            except (aiohttp.ClientError, UpstreamError, TimeoutError) as exc:
                self.state, failures = "backoff", failures + 1
                cap_ms = self.conf.restart_backoff_max_ms if self.restart else None
                if not await start_failed(self._link, exc, failures, cap_ms, url=self.url):
                    return
                continue
            failures = 0
            listener = asyncio.create_task(self._listen())
            await self._lost.wait()
            listener.cancel()
            self._on_lost()
            if not self.restart:
                return
            self.restarts += 1

    async def _initialize(self) -> None:
        assert self._link is not None
        self.session_id, self.post_url, self._refused = None, self.url, None
        self.kind, self.version, self.state = "streamable-http", None, "initializing"
        self._lost.clear()
        try:
            self.version = await self._link.on_up()
        except UpstreamError:
            if self._refused is None:
                raise
            # spec (Backwards Compatibility): a 4xx to the POST of initialize, and no modern
            # server either: the HTTP+SSE transport, whose GET stream names where to POST.
            await self._open_sse_transport()
            self.version = await self._link.on_up()
        self.state = "up"

    def _on_lost(self) -> None:
        assert self._link is not None
        self.state = "restarting"
        if self._stream is not None:
            self._stream.cancel()
            self._stream = None
        log.warning("upstream.session_lost", upstream=self.name, in_flight=self._link.in_flight)
        self._link.on_lost(UpstreamError(self.name, f"upstream '{self.name}' ended its session",
                                         "session_lost"), keep=set(self._resending))

    # -- the HTTP+SSE transport (2024-11-05) --------------------------------------------------
    async def _open_sse_transport(self) -> None:
        assert self._http is not None and self._link is not None
        try:
            resp, events, self.post_url = await sse_client.open_endpoint(
                self._http, self.url, self.conf.headers)
        except ValueError as exc:
            raise UpstreamError(self.name, f"upstream '{self.name}' refused initialize (HTTP "
                                f"{self._refused}) and {exc}", "initialize") from None
        self.kind = "http+sse"
        log.info("upstream.http_sse_transport", upstream=self.name)
        # This transport's session is its stream: when it ends, the session is lost.
        self._stream = asyncio.create_task(sse_client.pump(resp, events,
                                                           self._link.on_message, self._lost.set))

    # -- transport ----------------------------------------------------------------------------
    def _headers(self) -> dict[str, str]:
        headers = {**self.conf.headers, "Content-Type": mcp.CT_JSON,
                   "Accept": f"{mcp.CT_JSON}, {mcp.CT_SSE}"}
        if self.version is not None:
            headers[mcp.H_PROTOCOL] = self.version
        if self.session_id is not None:  # a modern server is stateless: it gives none
            headers[mcp.H_SESSION] = self.session_id
        return headers

    def write(self, data: bytes, call: Call | None = None,
              headers: dict[str, str] | None = None) -> None:
        if self._http is None or self._http.closed:
            raise UpstreamError(self.name, f"upstream '{self.name}' is not running", "down")
        task = asyncio.create_task(self._post(data, call, headers))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if call is not None:
            uid = call.upstream_id
            self._posts[uid] = task
            task.add_done_callback(lambda _: self._posts.pop(uid, None))

    def abort(self, call: Call) -> bool:
        """Close the call's POST stream (spec 2026-07-28: cancels it on a modern server)."""
        post = self._posts.pop(call.upstream_id, None)
        if post is None:
            return False
        post.cancel()
        return True

    async def _post(self, data: bytes, call: Call | None, extra: dict[str, str] | None,
                    again: bool = True) -> None:
        assert self._http is not None
        headers = {**extra, **self._headers()} if extra else self._headers()
        carried = headers.get(mcp.H_SESSION)
        for attempt in range(1, CONNECT_ATTEMPTS + 1):
            try:
                async with self._http.post(self.post_url, data=data, headers=headers,
                                           timeout=self._post_timeout) as resp:
                    gone = carried if resp.status == 404 else None  # the forgotten session
                    if gone is None:
                        await self._answered(resp, data, call)
                if gone is not None:
                    await self._again(data, call, extra, gone, again)
                return
            except aiohttp.ClientConnectorError as exc:  # nothing was sent
                why = f"cannot connect: {exc}"
                await asyncio.sleep(0.1 * attempt)
            except TimeoutError:
                why = f"no reply within read_timeout_ms ({self.conf.read_timeout_ms})"
                if call is not None and self._link is not None and self._link.pending(call):
                    with contextlib.suppress(UpstreamError):
                        self.write(jsonrpc.dumps(jsonrpc.notification(mcp.CANCELLED, {
                            "requestId": call.upstream_id, "reason": why})))
                break
            except aiohttp.ClientError as exc:
                why = f"the connection dropped: {exc}"
                if attempt > 1 or _method(data) not in IDEMPOTENT:
                    break
        self._failed(data, call, why)

    async def _again(self, data: bytes, call: Call | None, extra: dict[str, str] | None,
                     carried: str, again: bool) -> None:
        """spec (Session Management): a 404 to a request that carried the session id means
        the server forgot the session and did not process the request: the transport starts
        a new session, and the request goes once more (its call kept meanwhile)."""
        if self.session_id == carried:
            self._lost.set()
        if call is None or not again or self._link is None:
            self._failed(data, call, "the server lost the session again")
            return
        self._resending.add(call)
        try:
            await _until(lambda: self.state == "up" and self.session_id != carried,
                         self.conf.startup_timeout_ms / 1000)
        except TimeoutError:
            self._failed(data, call, "the session was lost and no new one began in time")
            return
        finally:
            self._resending.discard(call)
        if self._link.pending(call):
            await self._post(data, call, extra, again=False)

    async def _answered(self, resp: aiohttp.ClientResponse, data: bytes, call: Call | None
                        ) -> None:
        sid = resp.headers.get(mcp.H_SESSION)
        if sid and self.session_id is None:
            self.session_id = sid
        assert self._link is not None
        if resp.status >= 400:
            if resp.status < 500 and self.state == "initializing":
                self._refused = resp.status
            if resp.content_type == mcp.CT_JSON:  # a JSON-RPC error, e.g. a modern server's
                self._link.on_message(await resp.read(), call)
            self._failed(data, call, f"HTTP {resp.status}")
        elif resp.content_type == mcp.CT_SSE:  # a POST's stream: what comes on it is its call's
            reader = EventReader()
            await sse_client.read(reader, resp, self._link.on_message, call)
            await self._resume(reader, call)
        elif resp.content_type == mcp.CT_JSON:
            self._link.on_message(await resp.read(), call)
        # else 202 (a notification or response was accepted), or the HTTP+SSE transport,
        # whose answers come on its stream

    async def _resume(self, reader: EventReader, call: Call | None) -> None:
        """spec (Resumability): a stream that ended before the answer is picked up again with
        Last-Event-ID; a server that gave no event ids cannot resume, and the call fails."""
        attempts = 0
        while call is not None and self._link is not None and self._link.pending(call):
            if reader.last_id is None or attempts == RESUME_ATTEMPTS:
                self._failed(b"", call, "the stream ended before the answer")
                return
            attempts += 1
            await asyncio.sleep(reader.retry_s)
            assert self._http is not None
            await sse_client.follow(self._http, self.url, self._headers(), reader,
                                    self._link.on_message, call)

    async def _listen(self) -> None:
        """The GET stream: the server's messages that belong to no POST (resumed with
        Last-Event-ID after a drop)."""
        if self.kind != "streamable-http":
            return  # the HTTP+SSE stream is read since initialize
        assert self._http is not None and self._link is not None
        reader = EventReader()
        while True:
            status = await sse_client.follow(self._http, self.url, self._headers(), reader,
                                             self._link.on_message, None)
            if status == 405:
                return  # the server offers no GET stream (spec allows it)
            if status == 404:
                self._lost.set()
                return
            await asyncio.sleep(reader.retry_s)

    def _failed(self, data: bytes, call: Call | None, why: str) -> None:
        """A request that got no answer fails now, with a JSON-RPC error that says why."""
        if call is None or self._link is None:
            return
        error = UpstreamError(self.name, f"upstream '{self.name}': {why}", "connection")
        if self._link.on_failed(call, error) and self.state == "up":  # else: start_failed
            log.warning("upstream.request_failed", upstream=self.name, reason=why,
                        method=_method(data) if data else None)


async def _until(holds: Callable[[], bool], timeout_s: float) -> None:
    """Wait until `holds()`, looking every 20 ms; TimeoutError after `timeout_s`."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not holds():
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError
        await asyncio.sleep(0.02)


async def _delete(http: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> None:
    """End an upstream session, best effort (two seconds at most)."""
    with contextlib.suppress(aiohttp.ClientError, TimeoutError):
        async with http.delete(url, headers=headers, timeout=aiohttp.ClientTimeout(total=2)):
            pass


def _timeouts(conf: UpstreamConf) -> tuple[aiohttp.ClientTimeout, aiohttp.ClientTimeout]:
    """For the session's GET streams, which may be quiet for hours (only connecting has a
    deadline), and for POSTs (`read_timeout_ms` too, when set)."""
    connect = conf.connect_timeout_ms / 1000
    read = conf.read_timeout_ms / 1000 if conf.read_timeout_ms else None
    return (aiohttp.ClientTimeout(total=None, sock_connect=connect),
            aiohttp.ClientTimeout(total=None, sock_connect=connect, sock_read=read))


def _method(data: bytes) -> str | None:
    with contextlib.suppress(jsonrpc.JSONDecodeError):
        msg = jsonrpc.loads(data)
        method = msg.get("method") if isinstance(msg, dict) else None
        if isinstance(method, str):
            return method
    return None
