"""The gateway's HTTP connections (issue 54): a POST to an MCP path is served below aiohttp's
web layer; everything else the way aiohttp serves it.

A connection is aiohttp's own protocol (`RequestHandler`: its C parser, limits, keep-alive,
pipelining, errors, graceful shutdown, handler cancellation) with its loop of requests
redone here: a POST to an MCP path (spelled as registered, no `Expect` nor `Upgrade`) is served
in the connection's task, without a task of its own, the app's router, its signal or
aiohttp's response preparation: the endpoint's handler is called directly, and a whole
answer is written in one write, the app's response signal (the guard's `on_prepare`:
CORS, challenges) applied inline; a stream is prepared and written by aiohttp as before.
Every other request (GET streams, DELETE, operators' pages, probes, a request aiohttp
could not parse) is served as aiohttp serves it: the app's handler in a task of its own.

That loop and `_linger` follow aiohttp 3.14's `RequestHandler.start` step for step; they
touch its private parts, as does `serve_lean` (the app's server factory). Measured in
docs/performance.md (Where the time goes): ~15% fewer instructions an echo.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import hdrs, web
from aiohttp.helpers import ceil_timeout, rfc822_formatted_time
from aiohttp.http import SERVER_SOFTWARE, HttpVersion10, HttpVersion11
from aiohttp.http_writer import StreamWriter, _serialize_headers
from aiohttp.web_log import AccessLogger
from aiohttp.web_protocol import _PAYLOAD_ACCESS_ERROR, ERROR, RequestHandler, _ErrInfo
from multidict import CIMultiDict

from gateway.downstream.boundary import Handler

Prepare = Callable[[web.Request, web.StreamResponse], Awaitable[object]]  # a signal's receiver
# Up to this size a whole answer is written at once (sse.py BUFFERED: bigger ones are
# streamed by the handler under the slow-reader rule, and never reach the one write).
WHOLE_MAX = 1 << 16
AIOHTTP = "3.14."  # the aiohttp whose RequestHandler this module follows (a test says)


class Lean:
    """What the lean path needs of the app: the MCP paths' POST handlers, the body limit,
    and the app's response signal (`prepared`: read once the app is frozen)."""

    def __init__(self, posts: dict[str, Handler], max_body: int) -> None:
        self.posts = posts
        self.max_body = max_body
        self.prepare: Prepare = _nothing

    def prepared(self, app: web.Application) -> None:
        """The app's on_response_prepare, called as aiohttp's signal would: its one
        receiver directly (the guard's on_prepare, today's only one), else each in turn."""
        receivers = tuple(app.on_response_prepare)
        if len(receivers) == 1:
            self.prepare = receivers[0]
        elif receivers:
            async def each(request: web.Request, response: web.StreamResponse) -> None:
                for receiver in receivers:
                    await receiver(request, response)
            self.prepare = each


async def _nothing(request: web.Request, response: web.StreamResponse) -> None:
    pass


class LeanRequest(web.Request):
    """A lean request: no route matched it, so a stream's preparation runs the app's one
    signal handler itself (aiohttp's runs the matched apps' signals)."""

    def get(self, key: Any, default: Any = None) -> Any:
        """The request's own state (PRINCIPAL, ACCEPTS, ...): one call, where the Mapping
        mixin's takes two and raises KeyError for a key not set."""
        return self._state.get(key, default)

    async def _prepare_hook(self, response: web.StreamResponse) -> None:
        assert isinstance(self._protocol, Connection)
        await self._protocol.lean.prepare(self, response)


def serve_lean(app: web.Application, lean: Lean) -> None:
    """Have every runner of `app` (web.run_app's, the tests') serve it with `Connection`s:
    aiohttp's runners get their server from the app's `_make_handler`, replaced here by
    the same construction with `LeanServer` (aiohttp 3.14's Application._make_handler).
    Another aiohttp than the one this module follows serves the app its own way."""
    def make_handler(*, loop: asyncio.AbstractEventLoop | None = None,
                     access_log_class: type[AccessLogger] = AccessLogger,
                     **kwargs: Any) -> web.Server:
        app._set_loop(loop)
        app.freeze()
        lean.prepared(app)
        kwargs["debug"] = app._debug
        kwargs["access_log_class"] = access_log_class
        kwargs.update(app._handler_args or {})
        return LeanServer(lean, app._handle, request_factory=app._make_request,
                          loop=app._loop, **kwargs)
    if aiohttp.__version__.startswith(AIOHTTP):
        # object's: an Application warns of custom attributes in aiohttp's debug mode
        object.__setattr__(app, "_make_handler", make_handler)


class LeanServer(web.Server):
    """aiohttp's low-level server (connections, shutdown), its protocol `Connection`."""

    def __init__(self, lean: Lean, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lean = lean

    def __call__(self) -> RequestHandler:
        return Connection(self.lean, self, loop=self._loop, **self._kwargs)


class Connection(RequestHandler):
    """One HTTP connection: aiohttp's protocol, its loop of requests this module's."""

    def __init__(self, lean: Lean, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lean = lean

    async def start(self) -> None:
        """aiohttp's loop of a connection, a request at a time, but for the lean path."""
        while not self._force_close:
            if not self._messages:
                try:
                    self._waiter = self._loop.create_future()
                    await self._waiter
                finally:
                    self._waiter = None
            message, payload = self._messages.popleft()
            self._consumed()
            if not await self._serve(message, payload):
                return
            if self._messages:  # pipelined requests: a turn of the loop between two, as
                # aiohttp's task a request gave. A refusal never suspends, so a client
                # pipelining thousands would otherwise hold the loop from every other one.
                await asyncio.sleep(0)

    def _lean_post(self, message: Any) -> Handler | None:
        """The endpoint of a POST to an MCP path; None for anything aiohttp must see to
        (a parse error; Expect; an Upgrade, whose declining re-reads what followed it)."""
        if isinstance(message, _ErrInfo) or message.method != hdrs.METH_POST or \
                message.upgrade:
            return None
        post = self.lean.posts.get(message.path)
        return None if post is None or hdrs.EXPECT in message.headers else post

    async def _serve(self, message: Any, payload: Any) -> bool:
        """One request, as aiohttp's loop serves one; whether the connection goes on."""
        writer = StreamWriter(self, self._loop)
        task = self._task_handler or asyncio.current_task()
        assert task is not None
        answering: Awaitable[tuple[web.StreamResponse, bool]]
        if (post := self._lean_post(message)) is not None:
            request: web.BaseRequest = LeanRequest(message, payload, self, writer, task,
                                                   self._loop, client_max_size=self.lean.max_body)
            answering = self._answer(request, post)  # type: ignore[arg-type]
        else:
            request, answering = self._routed(message, payload, writer, task)
        try:
            resp, reset = await answering
            if reset:
                self.log_debug("Ignored premature client disconnection 2")
                return self._closed()
            self._keepalive = bool(resp.keep_alive)
            if not payload.is_eof():
                await self._linger(payload)
            payload.set_exception(_PAYLOAD_ACCESS_ERROR)
        except asyncio.CancelledError:
            self.log_debug("Ignored premature client disconnection")
            self.force_close()
            raise
        except ConnectionError:
            self.log_debug("Ignored premature client disconnection")
            return self._closed()
        except Exception as exc:
            self.log_exception("Unhandled exception", exc_info=exc)
            self.force_close()
            return self._closed()
        finally:
            request._task = None  # type: ignore[assignment]  # aiohttp's: no cycle
            # A CancelledError's traceback keeps this frame, and the frame the Task: a
            # cycle holding the request (its body) until a full collection.
            del task
        return self._kept_alive()

    def _routed(self, message: Any, payload: Any, writer: StreamWriter, task: Any
                ) -> tuple[web.BaseRequest, Awaitable[tuple[web.StreamResponse, bool]]]:
        """Any other request: the app's handler (its router, signals, response
        preparation) in a task of its own, as aiohttp serves it."""
        handler = self._request_handler
        if isinstance(message, _ErrInfo):
            handler, message = self._make_error_handler(message), ERROR
        assert self._request_factory is not None and handler is not None
        request = self._request_factory(message, payload, self, writer, task)
        start = self._loop.time() if self._logging_enabled else None
        coro = self._handle_request(request, start, handler)
        if sys.version_info >= (3, 12):
            return request, asyncio.Task(coro, loop=self._loop, eager_start=True)
        return request, self._loop.create_task(coro)

    def _consumed(self) -> None:
        """A request taken from the queue: a parser slot freed, reading resumed."""
        if self._parser is not None:
            self._parser.message_consumed()
        if self._buffer_paused and len(self._messages) <= self._msg_queue_resume_size:
            self._resume_reading_if_drained()
        assert self._manager is not None
        self._manager.requests_count += 1

    async def _answer(self, request: LeanRequest, post: Handler
                      ) -> tuple[web.StreamResponse, bool]:
        """The handler's answer (or the one aiohttp gives for its fault), written; whether
        the client went away meanwhile (aiohttp's `_handle_request`, but for the one write;
        no `request._finish`: the endpoint never reads a form)."""
        start = self._loop.time() if self._logging_enabled else None
        self._request_in_progress = True
        try:
            self._current_request = request
            try:
                resp = await post(request)
            except web.HTTPException as exc:
                resp = exc
            except TimeoutError as exc:
                self.log_debug("Request handler timed out.", exc_info=exc)
                resp = self.handle_error(request, 504)
            except Exception as exc:  # a fault of the handler's (CancelledError is not one)
                resp = self.handle_error(request, 500, exc)
            finally:
                self._current_request = None
            if not whole(resp):
                return await self.finish_response(request, resp, start)
            gone = not await self._write_whole(request, resp)  # type: ignore[arg-type]
            if start is not None:
                self.log_access(request, resp, start)
            return resp, gone
        finally:
            self._request_in_progress = False
            if self._handler_waiter is not None:
                self._handler_waiter.set_result(None)

    async def _write_whole(self, request: LeanRequest, resp: web.Response) -> bool:
        """What Response.prepare and write_eof send for a whole body, in one write; False
        when the connection is gone (a POST's answer: never a body that must be empty)."""
        version, headers = request.version, head(request, resp)
        resp._req = request
        await self.lean.prepare(request, resp)  # the app's signal (the guard's on_prepare)
        transport = self.transport
        if transport is None or transport.is_closing():
            return False
        status = f"HTTP/{version.major}.{version.minor} {resp._status} {resp._reason}"
        transport.write(_serialize_headers(status, headers) + resp._body)  # type: ignore[operator]
        resp._payload_writer = request._payload_writer
        resp._eof_sent = True
        if self._paused:  # the client reads slower than it asks: wait for it, as aiohttp's
            # write_eof does, before the next pipelined request is read and answered
            try:
                await self._drain_helper()
            except ConnectionError:
                return False
        return True

    async def _linger(self, payload: Any) -> None:
        """A body the handler left unread is read and dropped for up to lingering_time, so
        the connection can be kept; else it is closed (aiohttp's)."""
        if not self._force_close and self._lingering_time:
            end_t = self._loop.time() + self._lingering_time
            try:
                while not payload.is_eof() and (now := self._loop.time()) < end_t:
                    async with ceil_timeout(end_t - now):
                        await payload.readany()
            except (TimeoutError, asyncio.CancelledError):
                if (task := asyncio.current_task()) and task.cancelling():
                    raise
        if not payload.is_eof() and not self._force_close:
            self.log_debug("Uncompleted request.")
            self.close()

    def _kept_alive(self) -> bool:
        """After an answer: the keep-alive timer (re)armed and True, or the connection
        closed (aiohttp's)."""
        if not self._keepalive or self._close or self._force_close:
            return self._closed()
        close_time = self._loop.time() + self._keepalive_timeout
        self._next_keepalive_close_time = close_time
        if self._keepalive_handle is None:
            self._keepalive_handle = self._loop.call_at(close_time, self._process_keepalive)
        return True

    def _closed(self) -> bool:
        """The end of the connection's loop: its transport closed unless forced already."""
        if not self._force_close:
            self._task_handler = None
            if self.transport is not None:
                self.transport.close()
        return False


def whole(resp: web.StreamResponse) -> bool:
    """A plain answer the one write can send: bytes, not prepared, nothing to encode."""
    return (type(resp) is web.Response and resp._payload_writer is None
            and type(resp._body) is bytes and len(resp._body) <= WHOLE_MAX
            and not resp._chunked and not resp._compression and not resp._cookies
            and resp._status >= 200 and resp._status not in (204, 304))


def head(request: web.BaseRequest, resp: web.Response) -> CIMultiDict[str]:
    """A whole answer's headers, as Response.prepare completes them."""
    headers = resp._headers
    body = resp._body
    assert isinstance(body, bytes)
    headers[hdrs.CONTENT_LENGTH] = str(len(body))
    if body:
        headers.setdefault(hdrs.CONTENT_TYPE, "application/octet-stream")
    if hdrs.DATE not in headers:
        headers[hdrs.DATE] = rfc822_formatted_time()
    headers.setdefault(hdrs.SERVER, SERVER_SOFTWARE)
    keep_alive = resp._keep_alive
    if keep_alive is None:
        keep_alive = resp._keep_alive = request.keep_alive
    if hdrs.CONNECTION not in headers:
        version = request.version
        if keep_alive and version == HttpVersion10:
            headers[hdrs.CONNECTION] = "keep-alive"
        elif not keep_alive and version == HttpVersion11:
            headers[hdrs.CONNECTION] = "close"
    return headers


__all__ = ["Connection", "Lean", "LeanRequest", "LeanServer", "serve_lean"]
