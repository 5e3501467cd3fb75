"""A Streamable HTTP MCP server as an upstream: the gateway is a legacy-era client of it.

spec: mcp-base-2025-06-18.md, Streamable HTTP. The connection initializes once (newest legacy
version the server accepts) and keeps the `Mcp-Session-Id` it is given; every message is its
own POST, answered with JSON, an SSE stream, or 202; the server's own requests and
notifications arrive on a GET stream as well. All of it is fed to the same correlation as a
stdio upstream (`Connection._on_line`), so routing, tasks and MRTR do not care which
transport is behind a call. A POST that fails fails its call at once; a 404 means the server
dropped the session: calls in flight fail and the connection initializes again.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import aiohttp

from gateway.errors import UpstreamError
from gateway.observability import log
from gateway.protocol import jsonrpc, mcp
from gateway.settings import Upstream as UpstreamConf
from gateway.upstream.base import Connection

RETRY_S = 1.0  # between attempts to (re)initialize


class HttpUpstream(Connection):
    def __init__(self, name: str, conf: UpstreamConf, restart: bool = True) -> None:
        super().__init__(name, conf.startup_timeout_ms / 1000)
        assert conf.url is not None
        self.conf = conf
        self.url = conf.url
        self.restart = restart
        self.session_id: str | None = None
        self.version = mcp.LATEST_LEGACY
        self._http: aiohttp.ClientSession | None = None
        self._lost = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._task: asyncio.Task[None] | None = None

    # -- lifecycle (the same surface as StdioUpstream) ------------------------------------
    def start(self) -> None:
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.conf.startup_timeout_ms
                                        / 1000)
        self._http = aiohttp.ClientSession(timeout=timeout)
        self._task = asyncio.create_task(self._supervise(), name=f"upstream:{self.name}")

    def status(self) -> dict[str, Any]:
        return {**super().status(), "url": self.url}

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for task in list(self._tasks):
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
        self.session_id = None  # the POST of initialize gets a new one
        self._lost.clear()
        reply = await asyncio.wait_for(self._ask_initialize(), self.startup_timeout_s)
        self.version = self._initialized(reply)["protocolVersion"]

    def _on_lost(self) -> None:
        self.init_result, self.state = None, "restarting"
        self._ready.clear()
        log.warning("upstream.session_lost", upstream=self.name, in_flight=self.in_flight)
        self.fail_all(UpstreamError(self.name, f"upstream '{self.name}' ended its session",
                                    "session_lost"))

    # -- transport ----------------------------------------------------------------------------
    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": mcp.CT_JSON, "Accept": f"{mcp.CT_JSON}, {mcp.CT_SSE}"}
        if self.session_id is not None:
            headers[mcp.H_SESSION] = self.session_id
            headers[mcp.H_PROTOCOL] = self.version
        return headers

    def _write(self, data: bytes) -> None:
        if self._http is None or self._http.closed:
            raise UpstreamError(self.name, f"upstream '{self.name}' is not running", "down")
        task = asyncio.create_task(self._post(data))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _post(self, data: bytes) -> None:
        assert self._http is not None
        try:
            async with self._http.post(self.url, data=data, headers=self._headers()) as resp:
                if resp.status == 404 and self.session_id is not None:
                    self._lost.set()  # spec: 404 means the session is gone
                    return
                sid = resp.headers.get(mcp.H_SESSION)
                if sid and self.session_id is None:
                    self.session_id = sid
                if resp.status >= 400:
                    self._failed(data, f"HTTP {resp.status}")
                elif resp.content_type == mcp.CT_SSE:
                    await self._read_events(resp)
                elif resp.status != 202:
                    self._on_line(await resp.read())
        except (aiohttp.ClientError, TimeoutError) as exc:
            self._failed(data, f"connection failed: {exc}")

    async def _listen(self) -> None:
        """The GET stream: the server's messages that belong to no POST."""
        assert self._http is not None
        headers = {**self._headers(), "Accept": mcp.CT_SSE}
        while True:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with self._http.get(self.url, headers=headers) as resp:
                    if resp.status == 405:
                        return  # the server offers no GET stream (spec allows it)
                    if resp.status == 404:
                        self._lost.set()
                        return
                    if resp.status == 200:
                        await self._read_events(resp)
            await asyncio.sleep(RETRY_S)

    async def _read_events(self, resp: aiohttp.ClientResponse) -> None:
        data: list[bytes] = []
        async for raw in resp.content:
            line = raw.rstrip(b"\r\n")
            if not line:
                if data:
                    self._on_line(b"\n".join(data))
                    data = []
            elif line.startswith(b"data:"):
                data.append(line[5:].lstrip(b" "))

    def _failed(self, data: bytes, why: str) -> None:
        """A message that could not be delivered: if it was a request, its call fails now."""
        with contextlib.suppress(jsonrpc.JSONDecodeError):
            msg = jsonrpc.loads(data)
            call = self._calls.pop(msg.get("id"), None) if isinstance(msg, dict) else None
            if call is not None:
                call.sink.on_response(UpstreamError(
                    self.name, f"upstream '{self.name}': {why}", "connection",
                ).to_message(call.client_id))
