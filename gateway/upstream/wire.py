"""What differs between a legacy upstream and one that speaks only the modern revision
(2026-07-28): two small wire objects, so the connection never branches on the era.

`LegacyWire`: requests go as they are; the server asks with JSON-RPC requests, which the
correlator routes; resource subscriptions are resources/subscribe; cancellation is
notifications/cancelled.

`ModernWire`: the server is driven as a modern client. Found by the probe of spec 2026-07-28
versioning (Backward Compatibility): the server refused `initialize` and answers
`server/discover`. From then on every request carries the per-request envelope (`_meta`
protocol version and the caller's client capabilities) and, over HTTP, the `Mcp-Method` /
`Mcp-Name` headers. An `input_required` result goes as it is
to a caller that takes MRTR rounds (a modern client's request); for anyone else (a legacy
session, a task) each input request becomes an ordinary server-to-client request, and once
all are answered the original request is sent again with `inputResponses` and the server's
`requestState` (spec 2026-07-28 MRTR). Its change notifications come on one
`subscriptions/listen` stream the gateway keeps open on it, for everything its clients hold.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any, Final, Literal, Protocol

from gateway.protocol import jsonrpc, mcp
from gateway.protocol.jsonrpc import Message, RequestId
from gateway.upstream.audience import Audience
from gateway.upstream.correlator import Call, Host, Owner, Sink, new_asked_id

VERSION = mcp.MODERN_VERSIONS[0]
Era = Literal["legacy", "modern"]  # which revision a server speaks (/readyz `era`)
RELISTEN_S = 1.0  # before opening the listen stream again after the server ended it
RELISTEN_BATCH_S = 0.05  # subscription changes this close together: one new listen stream


class Round:
    """The answers a caller owes one `input_required` result."""

    __slots__ = ("answers", "call", "missing", "request", "state")

    def __init__(self, call: Call, request: tuple[str, dict[str, Any]], state: Any,
                 keys: set[str]) -> None:
        self.call = call
        self.request = request  # the call's request (method, params), to send again
        self.state = state
        self.missing = keys
        self.answers: dict[str, Any] = {}


class Driver(Host, Protocol):
    """What a modern wire needs of its connection."""

    audience: Audience[Owner]  # the subscriptions its listen stream carries

    @property
    def ready(self) -> bool: ...

    def request(self, msg: Message, owner: Owner | None, sink: Sink,
                headers: dict[str, str] | None = None, follow_task: bool = False) -> Call: ...

    def resend(self, call: Call, method: str, params: dict[str, Any]) -> None: ...

    def cancel(self, call: Call, reason: str) -> None: ...

    def drop(self, call: Call) -> bool: ...

    def await_input(self, call: Call) -> None: ...


class Wire(Protocol):
    """How a connection speaks to its server, whichever era the server is of: it holds
    one, and never branches on the era."""

    @property
    def era(self) -> Era: ...

    @property
    def cancels_by_closing(self) -> bool:
        """Whether closing a request's stream cancels it (else notifications/cancelled)."""

    def stamp(self, msg: Message, call: Call, headers: dict[str, str] | None
              ) -> dict[str, str] | None:
        """The headers `msg` goes with, after adding what this era's requests carry."""

    def answered(self, call: Call, msg: Message) -> bool:
        """Whether `msg` (a response to `call`) was taken care of here."""

    def reply(self, asked_id: RequestId, msg: Message, owner: Owner | None) -> bool:
        """Whether `owner`'s answer to a server request was taken care of here."""

    def forget(self, call: Call) -> None: ...

    def swallowed(self, params: dict[str, Any], method: str) -> bool:
        """Whether a notification from the server concerns only this wire."""

    def subscriptions_changed(self) -> bool:
        """Whether this wire takes resource subscriptions over (a listen stream)."""

    def up(self) -> None:
        """The server is initialized (or discovered)."""

    def reset(self) -> None:
        """The transport restarts."""

    def stop(self) -> None:
        """Replaced by another wire: let go of anything still open."""


class LegacyWire:
    era: Final[Era] = "legacy"
    cancels_by_closing = False  # spec 2025-06-18: a closed stream is no cancellation

    def stamp(self, msg: Message, call: Call, headers: dict[str, str] | None
              ) -> dict[str, str] | None:
        return headers

    def answered(self, call: Call, msg: Message) -> bool:
        return False

    def reply(self, asked_id: RequestId, msg: Message, owner: Owner | None) -> bool:
        return False

    def forget(self, call: Call) -> None:
        pass

    def swallowed(self, params: dict[str, Any], method: str) -> bool:
        return False

    def subscriptions_changed(self) -> bool:
        """False: the connection sends resources/(un)subscribe itself."""
        return False

    def up(self) -> None:
        pass

    def reset(self) -> None:
        pass

    def stop(self) -> None:
        pass


class ModernWire:
    """What a connection needs to speak to a modern-only server."""

    era: Final[Era] = "modern"
    # spec 2026-07-28 cancellation: over HTTP, closing the request's stream cancels it.
    cancels_by_closing = True

    def __init__(self, conn: Driver) -> None:
        self.conn = conn
        self.rounds: dict[str, tuple[Round, str]] = {}  # asked id -> (round, input key)
        self.listening: Call | None = None  # the gateway's own subscriptions/listen on it
        self.pending: asyncio.TimerHandle | None = None  # a re-listen about to happen
        self.stopped = False  # replaced by a new handshake

    def up(self) -> None:
        self.relisten()

    def reset(self) -> None:
        self.rounds.clear()

    def stop(self) -> None:
        self.stopped = True

    def subscriptions_changed(self) -> bool:
        """The listen stream carries what is held: True, nothing to send besides."""
        self.relisten()
        return True

    def swallowed(self, params: dict[str, Any], method: str) -> bool:
        """True for what only concerns the gateway's own listen stream; its notifications
        lose that stream's tag on the way."""
        if method == mcp.ACKNOWLEDGED:
            return True  # the gateway's own listen stream on the server is open
        self.untag(params)
        return False

    def stamp(self, msg: Message, call: Call, headers: dict[str, str] | None
              ) -> dict[str, str]:
        """The envelope of the request of `call`; the client's headers and those that
        mirror it. An MRTR request is kept to be sent again."""
        if msg["method"] in mcp.MRTR_METHODS:
            call.keep_for_resend(msg["method"], msg.setdefault("params", {}))
        return {**(headers or {}), **self.envelope(msg, call.owner)}

    # -- change notifications ---------------------------------------------------------------
    def relisten(self) -> None:
        """(Re)open, soon, the one `subscriptions/listen` stream the gateway keeps on the
        server (spec 2026-07-28 subscriptions: it replaces resources/subscribe and the GET
        stream): every list change, and resources/updated for each URI some client holds.
        What arrives on it is broadcast as a legacy server's notifications would be. Changes
        within RELISTEN_BATCH_S share one new stream."""
        if self.pending is None:
            self.pending = asyncio.get_running_loop().call_later(RELISTEN_BATCH_S, self._open)

    def _open(self) -> None:
        self.pending = None
        old, self.listening = self.listening, None
        if old is not None:
            self.conn.cancel(old, "the gateway's subscriptions changed")
        if not self.conn.ready or self.stopped:  # restarted since
            return
        params = {"notifications": {
            "toolsListChanged": True, "promptsListChanged": True, "resourcesListChanged": True,
            "resourceSubscriptions": self.conn.audience.held()}}
        self.listening = self.conn.request(jsonrpc.request(0, mcp.LISTEN, params), None,
                                           _Listening(self))

    @staticmethod
    def untag(params: dict[str, Any]) -> None:
        """A notification from the gateway's listen stream loses that stream's id: the
        gateway's clients are told by their own streams (listen tags its own)."""
        meta = params.get("_meta")
        if isinstance(meta, dict) and mcp.META_SUBSCRIPTION in meta:
            meta = {k: v for k, v in meta.items() if k != mcp.META_SUBSCRIPTION}
            if meta:
                params["_meta"] = meta
            else:
                del params["_meta"]

    def listen_ended(self, sink: _Listening, msg: Message) -> None:
        """The gateway's listen stream `sink` was answered: it ended. Opened again after
        RELISTEN_S, unless the server offers none (or a newer one replaced it)."""
        if self.listening is None or self.listening.sink is not sink:
            return  # an older stream, replaced already
        self.listening = None
        error = msg.get("error")
        if isinstance(error, dict) and error.get("code") == jsonrpc.METHOD_NOT_FOUND:
            return  # the server offers no change notifications
        asyncio.get_running_loop().call_later(RELISTEN_S, self.relisten)

    @staticmethod
    def init_result(discover: dict[str, Any]) -> dict[str, Any]:
        """The server's DiscoverResult in the shape of an initialize result, so both client
        eras are served from it as from a legacy server's."""
        meta = discover.get("_meta")
        info = meta.get(mcp.META_SERVER_INFO) if isinstance(meta, dict) else None
        out = {"protocolVersion": VERSION, "capabilities": discover.get("capabilities") or {},
               "serverInfo": info or discover.get("serverInfo") or {}}
        if "instructions" in discover:
            out["instructions"] = discover["instructions"]
        return out

    @staticmethod
    def envelope(msg: Message, owner: Owner | None) -> dict[str, str]:
        """Stamp the request's envelope (spec 2026-07-28 basic: General fields); the HTTP
        headers that mirror it (Streamable HTTP: Standard Headers) are returned."""
        params = msg.get("params")
        if not isinstance(params, dict):
            params = msg["params"] = {}
        meta = params.get("_meta")
        caps = owner.capabilities if owner is not None else {}
        meta = {**(meta if isinstance(meta, dict) else {}), mcp.META_VERSION: VERSION,
                # a 2025-11-25 session's `tasks` is legacy-only: not modern
                mcp.META_CAPABILITIES: {k: v for k, v in caps.items() if k != "tasks"}}
        if owner is not None and owner.level is not None:  # the caller's, per request here
            meta[mcp.META_LOG_LEVEL] = owner.level
        params["_meta"] = meta
        method = msg["method"]
        headers = {mcp.H_PROTOCOL: VERSION, mcp.H_METHOD: method}
        name = params.get(mcp.NAME_FIELD.get(method, ""))
        if isinstance(name, str):
            headers[mcp.H_NAME] = header_value(name)
        return headers

    # -- input_required -------------------------------------------------------------------
    def answered(self, call: Call, msg: Message) -> bool:
        """True when the response is not the caller's yet: its input requests went out as
        server-to-client requests (or failed the call). Results lose `resultType`, a
        field legacy clients do not know, when the caller is not modern."""
        result = msg.get("result")
        if not isinstance(result, dict):
            return False
        if result.get("resultType") != "input_required" or call.sink.takes_mrtr:
            if call.owner is not None and not call.owner.modern:
                result.pop("resultType", None)
            return False
        requests, resend = result.get("inputRequests"), call.resend
        if resend is None or not isinstance(requests, dict) or not requests:
            return False
        owner = call.owner
        refused = [r.get("method") for r in requests.values() if not isinstance(r, dict) or
                   owner is None or not owner.accepts(str(r.get("method")))]
        if refused or owner is None:  # the caller cannot answer: the call fails, saying why
            msg.pop("result")
            msg["error"] = {"code": jsonrpc.INTERNAL_ERROR, "message": (
                f"the server asks for input the client did not declare ({refused[0]})")}
            return False
        this = Round(call, resend, result.get("requestState"), set(requests))
        self.conn.await_input(call)
        for key, request in requests.items():
            asked_id = new_asked_id()
            self.rounds[asked_id] = (this, key)
            owner.expect_reply(asked_id, self.conn)
            ask_params = dict(request.get("params") or {})
            # The task's input keys mirror the server's own (a gateway hint, see mcp.py).
            ask_params["_meta"] = {**(ask_params.get("_meta") or {}), mcp.INPUT_KEY_HINT: key}
            call.sink.on_message(jsonrpc.request(asked_id, request["method"], ask_params))
        return True

    def reply(self, asked_id: RequestId, msg: Message, owner: Owner | None) -> bool:
        """A caller's answer to one of the round's requests; the last one sends the
        request again with every answer and the server's requestState. Only the call's
        owner answers it."""
        if not isinstance(asked_id, str):
            return False  # the gateway asks under ids of its own, strings
        entry = self.rounds.get(asked_id)
        if entry is None or entry[0].call.owner is not owner:
            return False
        del self.rounds[asked_id]
        this, key = entry
        result = msg.get("result")
        if not isinstance(result, dict):  # the client refused: so does the call
            self.forget(this.call)
            self.conn.drop(this.call)
            this.call.answer(jsonrpc.error(
                this.call.client_id, jsonrpc.INTERNAL_ERROR,
                f"the client did not answer the server's input request {key!r}",
                msg.get("error")))
            return True
        this.answers[key] = result
        this.missing.discard(key)
        if not this.missing:
            method, sent = this.request
            params = {k: v for k, v in sent.items()
                      if k not in ("inputResponses", "requestState")}
            params["inputResponses"] = this.answers
            if this.state is not None:
                params["requestState"] = this.state
            self.conn.resend(this.call, method, params)
        return True

    def forget(self, call: Call) -> None:
        """The call ended (cancelled, failed): its open round goes too."""
        for asked_id in [a for a, (r, _) in self.rounds.items() if r.call is call]:
            del self.rounds[asked_id]


def header_value(value: str) -> str:
    """spec 2026-07-28 Streamable HTTP, Value Encoding: plain when safe, else the Base64
    sentinel form."""
    safe = value.isascii() and value == value.strip() and value.isprintable() and not (
        value.startswith("=?base64?") and value.endswith("?="))
    return value if safe else f"=?base64?{base64.b64encode(value.encode()).decode()}?="


class _Listening:
    """The sink of the gateway's own listen request: its notifications are not routed to
    it (they are broadcast); only its end matters."""

    takes_mrtr = False

    def __init__(self, owner: ModernWire) -> None:
        self.owner = owner

    def on_refused(self, capability: str) -> None:
        pass

    def on_message(self, msg: Message) -> None:
        pass

    def on_response(self, msg: Message) -> None:
        self.owner.listen_ended(self, msg)
