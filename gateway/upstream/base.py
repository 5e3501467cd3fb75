"""One JSON-RPC connection to an upstream MCP server, shared by many downstream callers.

The connection owns id rewriting: every forwarded request gets a fresh upstream id, and
progress tokens are rewritten the same way, so calls from different clients never collide.
Messages coming back are correlated here and handed to the `Sink` of the call they belong to,
or to an `Owner` (a downstream session) when they belong to no call.

A server-to-client request from a legacy upstream names no call. DESIGN.md's rule: route it
to the one owner with calls in flight (its oldest call), or to the only attached owner when
nothing is in flight; otherwise never guess (that could leak one user's data to another):
answer the upstream with an error. Subclasses supply `_write` (the transport).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway import __version__
from gateway.errors import UpstreamError
from gateway.observability import log, metrics
from gateway.protocol import jsonrpc, mcp
from gateway.protocol.jsonrpc import Message
from gateway.upstream import modern, native_tasks
from gateway.upstream.modern import ModernUpstream

# Ids for server-to-client requests are unique across the whole process, so a session that
# talks to several processes (isolation: call) can never confuse two of them.
_asked_ids: Iterator[int] = itertools.count(1)


class Sink(Protocol):
    """Receives what belongs to one call: related messages, then exactly one response.

    A sink may also define `on_refused(capability)`: told when the gateway refused one of the
    server's requests because this call's client did not declare what it needs."""

    def on_message(self, msg: Message) -> None: ...

    def on_response(self, msg: Message) -> None: ...


class Owner(Protocol):
    """A downstream party (a session) that calls belong to."""

    key: str

    def accepts(self, method: str) -> bool:
        """Whether this owner declared the capability a server-to-client request needs."""

    def deliver(self, msg: Message) -> None:
        """A message for this owner that belongs to no live call (the GET stream)."""

    def expect_reply(self, asked_id: str, conn: Connection) -> None:
        """Remember that the answer to request `asked_id` goes back to `conn`."""

    def is_subscribed(self, uri: str) -> bool: ...


@dataclass(slots=True, eq=False)
class Call:
    """A request forwarded upstream and not yet answered."""

    upstream_id: int
    client_id: Any
    owner: Owner | None  # None: the gateway's own request (initialize)
    sink: Sink
    conn: Connection
    progress_token: Any = None
    # Parked: waiting between two HTTP requests for its client's input (MRTR). Its tool is
    # blocked on the answers it asked for, so routing leaves it out while others run.
    waiting: bool = False
    started: float = field(default_factory=time.monotonic)
    # A modern-only upstream may answer input_required: the request, kept to send again.
    resend: tuple[str, dict[str, Any]] | None = None
    # Sent as a task of the upstream's own (a tool it runs only as a task): its id once
    # created, after which the call waits on that task's tasks/result.
    follow_task: bool = False
    upstream_task: str | None = None

    # -- what the task engine needs of a call (tasks/engine.py: UpstreamCall) ---------------
    @property
    def upstream(self) -> str:
        return self.conn.name

    def cancel(self, why: str) -> None:
        self.conn.cancel(self, why)

    def reply(self, asked_id: Any, msg: Message) -> None:
        self.conn.reply(asked_id, msg)


class Connection:
    """Correlation state of one upstream connection; `_write` is the transport's."""

    def __init__(self, name: str, startup_timeout_s: float = 30.0) -> None:
        self.name = name
        self.startup_timeout_s = startup_timeout_s
        self.state = "starting"
        self.restarts = 0
        self._ready = asyncio.Event()
        self.init_result: dict[str, Any] | None = None
        self.owners: dict[str, Owner] = {}  # sessions: requests and broadcasts reach them
        self.watchers: dict[str, Owner] = {}  # listen streams: broadcasts only
        self.subscriptions: Counter[str] = Counter()  # resource URI -> holders
        self._ids = itertools.count(1)
        self._calls: dict[int, Call] = {}
        self._asked: dict[str, tuple[Any, Owner]] = {}  # our id -> (upstream's id, owner)
        self.modern: ModernUpstream | None = None  # set when the server is modern-only

    # -- transport hooks -------------------------------------------------------------------
    def _write(self, data: bytes, call: Call | None = None,
               headers: dict[str, str] | None = None) -> None:
        """Send one serialized message (the request of `call`, if given, with the client's
        `headers` that an HTTP upstream passes on); UpstreamError when the transport is
        down."""
        raise NotImplementedError

    @property
    def ready(self) -> bool:
        return self.init_result is not None

    async def wait_ready(self, timeout_s: float | None = None) -> None:
        """Wait until initialized; UpstreamError if that takes longer than `timeout_s`."""
        if self.ready:
            return
        try:
            await asyncio.wait_for(self._ready.wait(), timeout_s or self.startup_timeout_s)
        except TimeoutError:
            raise UpstreamError(self.name, f"upstream '{self.name}' is not ready ({self.state})",
                                "not_ready", state=self.state) from None

    def status(self) -> dict[str, Any]:
        return {"state": self.state, "ready": self.ready, "restarts": self.restarts,
                "in_flight": self.in_flight, "era": "legacy" if self.modern is None else "modern"}

    # -- the handshake (legacy era), the same over every transport --------------------------
    def _ask_initialize(self) -> asyncio.Future[Message]:
        """Send initialize at the newest legacy version, declaring elicitation, sampling and
        roots so the server may ask; the future resolves with its reply."""
        self.state = "initializing"
        self.init_result = None
        self.modern = None
        self._ready.clear()
        sink = FutureSink()
        self.request(jsonrpc.request(0, mcp.INITIALIZE, {
            "protocolVersion": mcp.LATEST_LEGACY,
            "capabilities": {"roots": {"listChanged": True}, "sampling": {}, "elicitation": {}},
            "clientInfo": {"name": "mcp-task-gateway", "version": __version__},
        }), None, sink)
        return sink.future

    def _initialized(self, reply: Message) -> dict[str, Any]:
        """Accept the server's initialize reply (a version we speak) and become ready."""
        result, error = reply.get("result"), reply.get("error")
        if isinstance(error, dict):  # an error answer, or the transport failed the request
            raise UpstreamError(self.name, f"initialize failed: {error.get('message')}",
                                "initialize")
        version = result.get("protocolVersion") if isinstance(result, dict) else None
        if version not in mcp.LEGACY_VERSIONS:
            raise UpstreamError(self.name, f"upstream '{self.name}' answered initialize with "
                                f"protocol version {version!r}, which the gateway does not "
                                "speak", "initialize")
        assert isinstance(result, dict)
        self._write(jsonrpc.dumps(jsonrpc.notification(mcp.INITIALIZED)))
        self.init_result, self.state = result, "ready"
        self._ready.set()
        for uri in self.subscriptions:  # a restarted server knows none of its watchers' URIs
            self.send_own(mcp.SUBSCRIBE, {"uri": uri})
        log.info("upstream.ready", upstream=self.name, protocol=result["protocolVersion"],
                 server=result.get("serverInfo", {}).get("name"))
        return result

    async def _handshake(self, wait: Callable[[asyncio.Future[Message]], Awaitable[Message]]
                         ) -> None:
        """initialize; if the server refuses it, the modern probe (spec 2026-07-28
        versioning: `server/discover`); UpstreamError when neither works."""
        reply = await wait(self._ask_initialize())
        if isinstance(reply.get("error"), dict) and await self._probe_modern(wait):
            return
        self._initialized(reply)

    async def _probe_modern(self, wait: Callable[[asyncio.Future[Message]],
                                                  Awaitable[Message]]) -> bool:
        self.modern = ModernUpstream(self)  # the probe already carries the modern envelope
        sink = FutureSink()
        self.request(jsonrpc.request(0, mcp.DISCOVER, {}), None, sink)
        result = (await wait(sink.future)).get("result")
        if not isinstance(result, dict) or modern.VERSION not in (
                result.get("supportedVersions") or ()):
            self.modern = None
            return False
        self.init_result, self.state = ModernUpstream.init_result(result), "ready"
        self._ready.set()
        self.modern.relisten()
        log.info("upstream.ready", upstream=self.name, protocol=modern.VERSION,
                 server=self.init_result["serverInfo"].get("name"))
        return True

    # -- downstream -> upstream ------------------------------------------------------------
    def request(self, msg: Message, owner: Owner | None, sink: Sink,
                headers: dict[str, str] | None = None, follow_task: bool = False) -> Call:
        """Forward request `msg`, which this consumes: its id and progress token are
        rewritten, and its params are let go once sent (they may be megabytes). `headers`
        are the client's that an HTTP upstream receives (`forward_headers`, Mcp-Param-*)."""
        if not self.ready and owner is not None:
            raise UpstreamError(self.name, f"upstream '{self.name}' is not connected", "down")
        uid = next(self._ids)
        call = Call(uid, msg["id"], owner, sink, self, follow_task=follow_task)
        params = msg.get("params")
        if isinstance(params, dict):
            meta = params.get("_meta")
            if isinstance(meta, dict) and "progressToken" in meta:
                # Tokens from different clients may be equal; the upstream id is unique here.
                call.progress_token = meta["progressToken"]
                params["_meta"] = {**meta, "progressToken": uid}
        msg["id"] = uid
        if self.modern is not None:
            headers = {**(headers or {}), **self.modern.envelope(msg, owner)}
            if msg["method"] in mcp.MRTR_METHODS:
                call.resend = (msg["method"], msg["params"])
        self._calls[uid] = call
        try:
            self._write(jsonrpc.dumps(msg), call, headers)
        except Exception:
            del self._calls[uid]
            raise
        msg.pop("params", None)
        return call

    def resend(self, call: Call, method: str, params: dict[str, Any]) -> None:
        """Continue `call` with a new request under a new id: a modern upstream's next MRTR
        round, or the tasks/result of the upstream's own task."""
        self._calls.pop(call.upstream_id, None)
        call.upstream_id = uid = next(self._ids)
        call.waiting = False
        meta = params.get("_meta")
        if call.progress_token is not None and isinstance(meta, dict):
            params["_meta"] = {**meta, "progressToken": uid}
        msg = jsonrpc.request(uid, method, params)
        headers = None
        if self.modern is not None:
            headers = self.modern.envelope(msg, call.owner)
            call.resend = (method, params)
        self._calls[uid] = call
        try:
            self._write(jsonrpc.dumps(msg), call, headers)
        except UpstreamError as exc:
            del self._calls[uid]
            call.sink.on_response(exc.to_message(call.client_id))

    def hold_call(self, call: Call) -> None:
        """Keep an answered call as the caller's while its client supplies input."""
        call.waiting = True
        self._calls[call.upstream_id] = call

    def drop_call(self, call: Call) -> None:
        self._calls.pop(call.upstream_id, None)

    @staticmethod
    def new_asked_id() -> str:
        return f"gw-{next(_asked_ids)}"

    def cancel(self, call: Call, reason: str) -> None:
        """spec (cancellation): tell the upstream; a late response is then dropped here."""
        if self.modern is not None:
            self.modern.forget(call)
        if call.upstream_task is not None and call.upstream_id in self._calls:
            self.send_own(*native_tasks.cancel_request(call.upstream_task))
        if self._calls.pop(call.upstream_id, None) is not None:
            self.notify(jsonrpc.notification(
                mcp.CANCELLED, {"requestId": call.upstream_id, "reason": reason}))

    def notify(self, msg: Message) -> None:
        if self.ready:
            self._send_quietly(msg)

    def reply(self, asked_id: str, msg: Message) -> bool:
        """Send a client's answer to a server-to-client request back under the original id."""
        if self.modern is not None and self.modern.reply(asked_id, msg):
            return True
        entry = self._asked.pop(asked_id, None)
        if entry is None:
            return False
        msg["id"] = entry[0]
        self._send_quietly(msg)
        return True

    def attach(self, owner: Owner) -> None:
        self.owners[owner.key] = owner

    def detach(self, owner: Owner) -> None:
        """Forget `owner`, cancelling whatever it still has in flight here."""
        self.owners.pop(owner.key, None)
        for call in [c for c in self._calls.values() if c.owner is owner]:
            self.cancel(call, "client session ended")
        for asked_id in [k for k, (_, o) in self._asked.items() if o is owner]:
            self._refuse(self._asked.pop(asked_id)[0], "client session ended")

    def watch(self, owner: Owner) -> None:
        self.watchers[owner.key] = owner

    def unwatch(self, owner: Owner) -> None:
        self.watchers.pop(owner.key, None)

    def hold(self, uri: str) -> bool:
        """Count one more holder of a resource subscription; True for the first, whose
        subscribe must reach the upstream (it keeps one subscription per URI for all). A
        modern-only upstream is told here, by its listen stream: False."""
        self.subscriptions[uri] += 1
        first = self.subscriptions[uri] == 1
        if first and self.modern is not None:
            self.modern.relisten()
            return False
        return first

    def release(self, uri: str) -> bool:
        """One holder fewer; True when it was the last, whose unsubscribe goes upstream."""
        if self.subscriptions[uri] > 1:
            self.subscriptions[uri] -= 1
            return False
        self.subscriptions.pop(uri, None)
        if self.modern is not None:
            self.modern.relisten()
            return False
        return True

    def send_own(self, method: str, params: dict[str, Any]) -> None:
        """A request of the gateway's own whose answer nobody waits for (subscriptions)."""
        if self.ready:
            with contextlib.suppress(UpstreamError):
                self.request(jsonrpc.request(0, method, params), None, IGNORE)

    def fail_all(self, error: UpstreamError) -> None:
        """Answer every call in flight with `error` (the upstream died or is going away)."""
        calls, self._calls = self._calls, {}
        self._asked.clear()
        if self.modern is not None:
            self.modern.rounds.clear()
        for call in calls.values():
            call.sink.on_response(error.to_message(call.client_id))

    @property
    def in_flight(self) -> int:
        return len(self._calls)

    # -- upstream -> downstream ------------------------------------------------------------
    def _on_line(self, line: bytes | memoryview) -> None:
        try:
            msg = jsonrpc.loads(line)
        except jsonrpc.JSONDecodeError:
            log.warning("upstream.bad_message", upstream=self.name, size=len(line))
            return
        if not isinstance(msg, dict):
            log.warning("upstream.bad_message", upstream=self.name, size=len(line))
            return
        if "method" in msg:
            if "id" in msg:
                self._on_server_request(msg)
            else:
                self._on_notification(msg)
        elif "id" in msg:
            self._on_response(msg)

    def _on_response(self, msg: Message) -> None:
        call = self._calls.pop(msg["id"], None)
        if call is None:
            return  # cancelled, or failed already: the caller has been answered
        if self.modern is not None and self.modern.handled(call, msg):
            return
        if call.follow_task and call.upstream_task is None and (
                task_id := native_tasks.created_task_id(msg)) is not None:
            # The caller sees one slow call: the task's tasks/result is its answer.
            call.upstream_task = task_id
            self.resend(call, *native_tasks.result_request(task_id))
            return
        msg["id"] = call.client_id
        call.sink.on_response(msg)

    def _on_notification(self, msg: Message) -> None:
        method = msg["method"]
        params = msg.get("params")
        if method == mcp.PROGRESS and isinstance(params, dict):
            call = self._calls.get(params.get("progressToken"))  # type: ignore[arg-type]
            if call is not None and call.progress_token is not None:
                params["progressToken"] = call.progress_token
                call.sink.on_message(msg)
            return
        if self.modern is not None and isinstance(params, dict):
            if method == mcp.ACKNOWLEDGED:
                return  # the gateway's own listen stream on the server is open
            self.modern.untag(params)
        if method.endswith("/list_changed"):
            self._broadcast(msg, lambda _owner: True)
        elif method == mcp.RESOURCE_UPDATED and isinstance(params, dict):
            uri = params.get("uri")
            self._broadcast(msg, lambda owner: owner.is_subscribed(uri))
        elif method == mcp.CANCELLED and isinstance(params, dict):
            self._forward_cancel(msg, params)
        else:  # logging and anything else: to the one owner it can belong to
            target = self._target()
            if target is not None:
                _deliver(target, msg)
            elif not self._calls:
                self._broadcast(msg, lambda _owner: True)
            else:
                metrics["upstream.unroutable_notifications"] += 1

    def _on_server_request(self, msg: Message) -> None:
        method = msg["method"]
        if method == mcp.PING:
            self._send_quietly(jsonrpc.result(msg["id"], {}))
            return
        target = self._target()
        if target is None and not self.owners and not self._calls:
            log.info("upstream.request_unroutable", upstream=self.name, method=method,
                     reason="no client connected")
            self._refuse(msg["id"], "no client is connected to the gateway")
            return
        if target is None:
            log.warning("upstream.request_unroutable", upstream=self.name, method=method,
                        reason="several owners",
                        owners=len({c.owner.key for c in self._calls.values() if c.owner}))
            self._refuse(msg["id"], "the gateway cannot tell which client this request is for;"
                         " use isolation: client or call")
            return
        owner = target.owner if isinstance(target, Call) else target
        assert owner is not None
        if not owner.accepts(method):
            cap = mcp.CLIENT_CAPABILITY_FOR.get(method)
            why = (f"the client did not declare the '{cap}' capability" if cap else
                   f"the gateway does not relay '{method}' to this client")
            self._refuse(msg["id"], why, jsonrpc.METHOD_NOT_FOUND)
            refused = getattr(target.sink, "on_refused", None) if isinstance(target, Call) \
                else None
            if cap and refused is not None:
                refused(cap)
            return
        asked_id = self.new_asked_id()
        self._asked[asked_id] = (msg["id"], owner)
        owner.expect_reply(asked_id, self)
        msg["id"] = asked_id
        _deliver(target, msg)

    def _forward_cancel(self, msg: Message, params: dict[str, Any]) -> None:
        for asked_id, (orig, owner) in self._asked.items():
            if orig == params.get("requestId"):
                del self._asked[asked_id]
                params["requestId"] = asked_id
                owner.deliver(msg)
                return

    def _target(self) -> Call | Owner | None:
        """The call (or owner) an unlabelled upstream message can only belong to, if any.

        Candidates are the calls in flight, oldest first; calls parked waiting for their
        client's input are left out while any other call runs (their tools are blocked on
        the answers they asked for). All candidates must share one owner (auth context or
        legacy session): across owners the gateway never guesses.
        """
        owned = [c for c in self._calls.values() if c.owner is not None]
        candidates = [c for c in owned if not c.waiting] or owned
        if candidates:
            key = candidates[0].owner.key  # type: ignore[union-attr]
            if any(c.owner.key != key for c in candidates):  # type: ignore[union-attr]
                return None
            return candidates[0]  # dicts keep insertion order: the owner's oldest call
        if len(self.owners) == 1:
            return next(iter(self.owners.values()))
        return None

    def _broadcast(self, msg: Message, want: Callable[[Owner], bool]) -> None:
        for owner in [*self.owners.values(), *self.watchers.values()]:
            if want(owner):
                owner.deliver(msg)

    def _refuse(self, upstream_id: Any, why: str, code: int = jsonrpc.INTERNAL_ERROR) -> None:
        self._send_quietly(jsonrpc.error(upstream_id, code, why))

    def _send_quietly(self, msg: Message) -> None:
        """Best effort: for messages whose loss only matters while the upstream is up."""
        with contextlib.suppress(UpstreamError):
            self._write(jsonrpc.dumps(msg))


def _deliver(target: Call | Owner, msg: Message) -> None:
    if isinstance(target, Call):
        target.sink.on_message(msg)
    else:
        target.deliver(msg)


class _Ignore:
    def on_message(self, msg: Message) -> None:
        pass

    def on_response(self, msg: Message) -> None:
        pass


IGNORE = _Ignore()  # a sink for answers nobody waits for


class FutureSink:
    """A sink for the gateway's own requests: the response resolves a future."""

    def __init__(self) -> None:
        self.future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()

    def on_message(self, msg: Message) -> None:
        pass

    def on_response(self, msg: Message) -> None:
        if not self.future.done():
            self.future.set_result(msg)
