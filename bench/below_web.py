"""Spikes of issue 54: ways of serving the gateway's POST /mcp below aiohttp's web layer, as
protocol factories for bench/inproc.py (which drives them side by side with today's).

- `lean`: aiohttp's low-level Server over a handler that sends POST <mcp path> straight to
  its endpoint (no router resolve, no signals: the guard's on_prepare applied by the
  request's own prepare hook), every other request to the app's own handler.
- `null-web`, `null-raw`, `null-lean`: what aiohttp's server path costs for a handler that
  does nothing, against a protocol of one's own on aiohttp's C parser that writes a canned
  answer (the most a protocol of our own could save), and against serving.py's.
- `sub`, `raw`: aiohttp's RequestHandler with a lean `_handle_request`; a protocol of its
  own on the C parser (the plain case alone), as measured before serving.py was built.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from aiohttp import web
from aiohttp._http_parser import HttpRequestParser
from aiohttp.base_protocol import BaseProtocol
from aiohttp.helpers import rfc822_formatted_time
from aiohttp.http import SERVER_SOFTWARE
from aiohttp.http_writer import StreamWriter, _serialize_headers
from aiohttp.web_protocol import RequestHandler

from gateway.downstream import serving
from gateway.downstream.guard import Guard


def _guard_of(app: web.Application) -> Guard:
    for signal in app.on_response_prepare:
        owner = getattr(signal, "__self__", None)
        if isinstance(owner, Guard):
            return owner
    raise LookupError("no guard")


def _lean_request(guard: Guard) -> type[web.Request]:
    """A request whose preparation runs the guard's one signal inline when the lean path
    served it (no route matched), the app's signals otherwise."""
    class LeanRequest(web.Request):
        async def _prepare_hook(self, response: web.StreamResponse) -> None:
            if self._match_info is None:  # the lean path's: the one signal, inline
                await guard.on_prepare(self, response)
            else:
                await super()._prepare_hook(response)
    return LeanRequest


def _posts(app: web.Application) -> dict[str, Any]:
    """The MCP paths' POST handlers (the routes registered with no guard in front)."""
    posts = {}
    for resource in app.router.resources():
        for route in resource:
            if route.method == "POST" and getattr(route.handler, "__self__", None) is not None:
                posts[resource.canonical] = route.handler
    return posts


def lean_factory(app: web.Application) -> Any:
    guard, posts, fallback = _guard_of(app), _posts(app), app._handle
    LeanRequest = _lean_request(guard)

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        if request.method == "POST" and "Expect" not in request.headers:
            post = posts.get(request.rel_url.path_safe)
            if post is not None:
                return await post(request)  # type: ignore[no-any-return]
        return await fallback(request)  # type: ignore[arg-type]

    def make_request(*args: Any) -> web.Request:
        return app._make_request(*args, _cls=LeanRequest)  # type: ignore[call-arg]

    server = web.Server(handle, request_factory=make_request, loop=asyncio.get_running_loop(),
                        access_log=None, auto_decompress=False, handler_cancellation=True)
    return server


ANSWER = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")


def null_web_factory(app: web.Application) -> Any:
    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        await request.read()
        return web.Response(body=b"{}", content_type="application/json")
    return web.Server(handle, loop=asyncio.get_running_loop(), access_log=None)


class RawProtocol(BaseProtocol):
    def __init__(self) -> None:
        super().__init__(asyncio.get_running_loop())
        self.parser: Any = None

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self.parser = HttpRequestParser(self, asyncio.get_running_loop(), 2 ** 16,
                                        max_line_size=8190, max_field_size=8190)

    def data_received(self, data: bytes) -> None:
        messages, _, _ = self.parser.feed_data(data)
        for _message, payload in messages:
            asyncio.get_running_loop().create_task(self.answer(payload))

    async def answer(self, payload: Any) -> None:
        await payload.read()
        self.transport.write(ANSWER)  # type: ignore[union-attr]


def null_raw_factory(app: web.Application) -> Any:
    return RawProtocol


class RawGateway(BaseProtocol):
    """Spike B: a protocol of its own on aiohttp's C parser. One task a connection serves
    its requests in order (no task a request); POST <mcp path> goes to its endpoint, all
    else to the app's handler; a whole `web.Response` is written here in one write (status
    line, headers, body), anything else (a stream) through aiohttp's writer as usual."""

    def __init__(self, loop: asyncio.AbstractEventLoop, lean: Lean) -> None:
        super().__init__(loop)
        self.lean = lean
        self.parser: Any = None
        self.messages: deque[Any] = deque()
        self.waiter: asyncio.Future[None] | None = None
        self.task: asyncio.Task[None] | None = None
        self.ssl_context = None
        self.peername: Any = None
        self.sockname: Any = None
        self.max_field_size = 8190
        self.max_headers = 128

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self.peername = transport.get_extra_info("peername")
        self.sockname = transport.get_extra_info("sockname")
        self.ssl_context = transport.get_extra_info("sslcontext")
        self.parser = HttpRequestParser(self, self._loop, 2 ** 16, max_line_size=8190,
                                        max_field_size=8190, auto_decompress=False)
        self.task = self._loop.create_task(self.serve())

    def connection_lost(self, exc: BaseException | None) -> None:
        super().connection_lost(exc)
        if self.task is not None:
            self.task.cancel()

    def data_received(self, data: bytes) -> None:
        messages, _, _ = self.parser.feed_data(data)
        if messages:
            self.messages.extend(messages)
            if self.waiter is not None and not self.waiter.done():
                self.waiter.set_result(None)

    async def serve(self) -> None:
        lean, loop = self.lean, self._loop
        while True:
            if not self.messages:
                self.waiter = loop.create_future()
                await self.waiter
                self.waiter = None
            message, payload = self.messages.popleft()
            writer = StreamWriter(self, loop)
            request = lean.request_class(message, payload, self, writer, self.task, loop,
                                         client_max_size=lean.max_body)
            post = lean.posts.get(message.path) if message.method == "POST" else None
            if post is not None:
                resp = await post(request)
            else:
                resp = await lean.fallback(request)
            if type(resp) is web.Response and resp._payload_writer is None:
                await self.write_whole(request, resp)
            else:
                await resp.prepare(request)
                await resp.write_eof()
            if not resp.keep_alive:
                self.transport.close()  # type: ignore[union-attr]
                return

    async def write_whole(self, request: web.BaseRequest, resp: web.Response) -> None:
        """What prepare and write_eof do for a whole body, in one write."""
        headers = resp._headers
        body = resp._body or b""
        assert isinstance(body, bytes)
        headers["Content-Length"] = str(len(body))
        if body and "Content-Type" not in headers:
            headers["Content-Type"] = "application/octet-stream"
        headers["Date"] = rfc822_formatted_time()
        headers.setdefault("Server", SERVER_SOFTWARE)
        resp._keep_alive = keep_alive = request.keep_alive
        if not keep_alive:
            headers["Connection"] = "close"
        resp._req = request
        await self.lean.guard.on_prepare(request, resp)  # type: ignore[arg-type]
        head = _serialize_headers(f"HTTP/1.1 {resp._status} {resp._reason}", headers)
        self.transport.write(head + body)  # type: ignore[union-attr]
        resp._eof_sent = True
        resp._payload_writer = request._payload_writer


class Lean:
    """What the spikes' servers need of the app."""

    def __init__(self, app: web.Application) -> None:
        self.guard, self.posts, self.fallback = _guard_of(app), _posts(app), app._handle
        self.max_body = app._client_max_size
        self.request_class = _lean_request(self.guard)


def raw_factory(app: web.Application) -> Any:
    lean = Lean(app)
    loop = asyncio.get_running_loop()
    return lambda: RawGateway(loop, lean)


class SubHandler(RequestHandler):
    """Spike C: aiohttp's own connection handling (keep-alive, pipelining, errors,
    shutdown, cancellation) kept whole; only a POST to an MCP path is dispatched straight to
    its endpoint and a whole answer written in one go (RawGateway.write_whole)."""

    lean: Lean

    async def _handle_request(self, request: Any, start_time: Any, request_handler: Any
                              ) -> Any:
        lean = self.lean
        post = lean.posts.get(request._message.path) if request._method == "POST" else None
        if post is None or "Expect" in request._headers:
            return await super()._handle_request(request, start_time, request_handler)
        self._request_in_progress = True
        try:
            try:
                self._current_request = request
                resp = await post(request)
            finally:
                self._current_request = None
            if type(resp) is web.Response and resp._payload_writer is None:
                await RawGateway.write_whole(self, request, resp)  # type: ignore[arg-type]
                return resp, False
            return await self.finish_response(request, resp, start_time)
        finally:
            self._request_in_progress = False
            if self._handler_waiter is not None:
                self._handler_waiter.set_result(None)


class SubServer(web.Server):
    def __init__(self, lean: Lean, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lean = lean

    def __call__(self) -> RequestHandler:
        handler = SubHandler(self, loop=self._loop, **self._kwargs)
        handler.lean = self.lean
        return handler


def sub_factory(app: web.Application) -> Any:
    lean = Lean(app)

    def make_request(*args: Any) -> web.Request:
        return app._make_request(*args, _cls=lean.request_class)  # type: ignore[call-arg]
    return SubServer(lean, app._handle, request_factory=make_request,
                     loop=asyncio.get_running_loop(), access_log=None, auto_decompress=False,
                     handler_cancellation=True)


def null_lean_factory(app: web.Application) -> Any:
    """serving.py's connections in front of a do-nothing POST /mcp (what they cost
    themselves, against `null-web` and `null-raw`)."""
    async def handle(request: web.Request) -> web.StreamResponse:
        await request.read()
        return web.Response(body=b"{}", content_type="application/json")
    null = web.Application()
    null.router.add_post("/mcp", handle)
    serving.serve_lean(null, serving.Lean({"/mcp": handle}, 1 << 20))
    return null._make_handler(loop=asyncio.get_running_loop(), access_log=None)
