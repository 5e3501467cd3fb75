"""Correlation of one upstream link shared by many downstream callers: pure, no I/O.

It owns id rewriting: every forwarded request gets a fresh upstream id, and progress tokens
are rewritten the same way, so calls from different clients never collide. Like h11, it
takes what arrived and returns what happened (events: `Deliver` to the `Sink` of the call a
message belongs to or to an `Owner` when it belongs to no call, `Ask` a client a server
request, `Answer` the upstream, `Refused`); the connection acts on them. It never writes,
and never calls into a sink or an owner.

A server-to-client request from a legacy upstream names no call: where such a message may
go (never guessed) is targeting.py's to say (docs/architecture.md, Tenancy).
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.errors import AnswersOverBudget, UpstreamError
from gateway.observability import log, tracing
from gateway.observability.counters import Counters
from gateway.protocol import jsonrpc, mcp
from gateway.protocol.jsonrpc import Message, RequestId
from gateway.queues import Ticket
from gateway.upstream.audience import DEFAULT_LEVEL, Audience
from gateway.upstream.targeting import Targeting, related_task
from gateway.upstream.task_owners import TaskOwners

TASK_ENDS = frozenset({"tasks/result", "tasks/cancel"})  # answers after which a task is over
TERMINAL = frozenset({"completed", "failed", "cancelled"})


class Sink(Protocol):
    """Receives what belongs to one call: related messages, then exactly one response."""

    @property
    def takes_mrtr(self) -> bool:
        """Whether a modern-only upstream's input_required may reach it as it is."""

    def on_message(self, msg: Message) -> None: ...

    def on_response(self, msg: Message) -> None: ...

    def on_refused(self, capability: str) -> None:
        """The gateway refused one of the server's requests for this call: its client did
        not declare `capability`."""


class Owner(Protocol):
    """A downstream party that calls belong to, or that hears broadcasts."""

    key: str
    principal: str  # whose (docs/architecture.md, Tenancy): what it hears is kept to them
    capabilities: dict[str, Any]  # what its client declared (sent on to modern servers)
    level: str | None  # the log level it asked for (sent on to modern servers)
    modern: bool  # a modern client: results keep `resultType`

    def accepts(self, method: str) -> bool:
        """Whether this owner declared the capability a server-to-client request needs."""

    def deliver(self, msg: Message) -> None:
        """A message for this owner that belongs to no live call (the GET stream)."""

    def expect_reply(self, asked_id: str, host: Host) -> None:
        """Remember that the answer to request `asked_id` goes back to `host`."""

    def is_subscribed(self, uri: str) -> bool: ...


class Host(Protocol):
    """The connection a call runs on, as a call's holder sees it."""

    name: str

    def cancel(self, call: Call, reason: str) -> None: ...

    def reply(self, asked_id: RequestId, msg: Message, owner: Owner | None) -> bool: ...


class Call:
    """A request forwarded upstream and not yet answered.

    It alone writes its fields (docs/architecture.md: a record that changes has one owner).
    Its routing (the sink that hears it, the client's id its answer goes back under,
    whether it is parked) changes by its verbs alone: a holder hands its call on with
    `redirect`, `park` and `unpark`; its upstream id and the upstream task it names change
    only when its correlator sends it on as a new request (`go_on_as`). Everyone reads them
    through properties. The rest is fixed when it is opened."""

    __slots__ = ("_adopted", "_client_id", "_failure", "_resend", "_sink", "_task_of",
                 "_upstream_id", "_upstream_task", "_waiting", "conn", "follow_task", "owner",
                 "progress_token", "span", "ticket")

    def __init__(self, upstream_id: int, client_id: RequestId, owner: Owner | None,
                 sink: Sink, conn: Host, *, progress_token: RequestId | None = None,
                 task_of: tuple[str, bool] | None = None, span: Any = None,
                 follow_task: bool = False, ticket: Ticket | None = None) -> None:
        self._upstream_id = upstream_id
        self._client_id = client_id
        self.owner = owner  # None: the gateway's own request (initialize, subscriptions)
        self._sink = sink
        self.conn = conn
        self.progress_token = progress_token  # the client's, put back on its progress
        # Parked: waiting between two HTTP requests for its client's input (MRTR). Its tool
        # is blocked on the answers it asked for, so routing leaves it out while others run.
        self._waiting = False
        # A modern-only upstream may answer input_required: the request, kept to send again.
        self._resend: tuple[str, dict[str, Any]] | None = None
        # Sent as a task of the upstream's own (native_tasks.py): its id once created.
        self.follow_task = follow_task
        self._upstream_task: str | None = None
        # tasks/* naming a task of the upstream's own: its id, and whether the answer ends it.
        self._task_of = task_of
        self.span = span  # its trace span, when the request that made it is traced
        # Its place under a concurrency limit (queues.py): sent once it may run, and its
        # slot given back when it ends.
        self.ticket = ticket
        self._failure: UpstreamError | None = None  # why the transport failed it, if it did
        self._adopted = False  # a task's: its owner's leaving does not cancel it

    @property
    def upstream_id(self) -> int:
        return self._upstream_id

    @property
    def client_id(self) -> RequestId:
        return self._client_id

    @property
    def sink(self) -> Sink:
        return self._sink

    @property
    def waiting(self) -> bool:
        return self._waiting

    @property
    def resend(self) -> tuple[str, dict[str, Any]] | None:
        return self._resend

    @property
    def task_of(self) -> tuple[str, bool] | None:
        """The upstream's own task its request names, and whether its answer ends it."""
        return self._task_of

    @property
    def upstream_task(self) -> str | None:
        return self._upstream_task

    @property
    def failure(self) -> UpstreamError | None:
        """The transport's error that ended the call, when one did (not a server's answer)."""
        return self._failure

    # -- who hears it ----------------------------------------------------------------------
    def redirect(self, sink: Sink, client_id: RequestId | None = None) -> None:
        """From now on `sink` hears the call (a task's run once adopted, a retry's
        exchange); its answer goes back under `client_id`, when given (a modern client's
        retry carries an id of its own)."""
        self._sink = sink
        if client_id is not None:
            self._client_id = client_id

    def adopt(self, sink: Sink) -> None:
        """A task's run takes the call for good: it hears it from now on, and the call
        outlives its owner (a legacy session ending does not cancel it: the task, which
        its principal's other sessions reach, ends it)."""
        self._sink, self._adopted = sink, True

    @property
    def adopted(self) -> bool:
        return self._adopted

    def park(self, sink: Sink) -> None:
        """The call waits for its client's input, held by `sink` meanwhile (MRTR, or a
        server's input requests sent on as a round): routing leaves it out while others
        run (targeting.py), its tool being blocked on the answers it asked for."""
        self._sink, self._waiting = sink, True

    def unpark(self) -> None:
        """Its client answered: it takes part in routing again."""
        self._waiting = False

    def go_on_as(self, upstream_id: int, task_of: tuple[str, bool] | None) -> None:
        """Sent on as a new request under `upstream_id` (its correlator's ids:
        `Correlator.renumber`), naming the upstream task `task_of`, if any; no longer
        parked."""
        self._upstream_id, self._task_of, self._waiting = upstream_id, task_of, False

    def keep_for_resend(self, method: str, params: dict[str, Any]) -> None:
        """Keep the request to send again after an input_required round (wire.py)."""
        self._resend = (method, params)

    def follows(self, task_id: str) -> None:
        """The upstream made its own task `task_id` of this call (native_tasks.py)."""
        self._upstream_task = task_id

    def answer(self, msg: Message) -> None:
        """The call's answer, or the error that ends it, to its sink (ending its span)."""
        if self.span is not None:  # traced: rare, so untraced answers pay one test
            self.end_trace(tracing.error_type(msg))
        if self.ticket is not None:
            self.ticket.release()
        self._sink.on_response(msg)

    def fail(self, error: UpstreamError | AnswersOverBudget) -> None:
        """End the call with the transport's `error` (kept: `failure`, when the upstream
        failed it; AnswersOverBudget: its answer, read in part, was dropped)."""
        self._failure = error if isinstance(error, UpstreamError) else None
        self.answer(error.to_message(self._client_id))

    def when_running(self, run: Callable[[], None]) -> None:
        """`run()` once the call is sent: at once, unless it waits in a queue."""
        if self.ticket is None:
            run()
        else:
            self.ticket.when_running(run)

    def end_trace(self, error_type: str | None) -> None:
        """End the call's span; `error_type` (semconv error.type) when it failed."""
        if self.span is not None:
            tracing.end(self.span, error_type)
            self.span = None

    # -- what the task engine needs of a call besides (tasks/run.py: UpstreamCall) ---------
    @property
    def upstream(self) -> str:
        return self.conn.name

    def cancel(self, why: str) -> None:
        self.conn.cancel(self, why)

    def reply(self, asked_id: RequestId, msg: Message) -> None:
        """Answer a server request this call made, as its owner (a task's run answers
        for its client)."""
        self.conn.reply(asked_id, msg, self.owner)


@dataclass(slots=True)
class Deliver:
    """`msg` is for a call's sink (`on_message`) or an owner's stream (`deliver`)."""

    to: Call | Owner
    msg: Message


@dataclass(slots=True)
class Ask:
    """A server request for `owner`'s client, under the id its answer comes back with."""

    to: Call | Owner
    owner: Owner
    msg: Message


@dataclass(slots=True)
class Answer:
    """What the upstream is owed: the reply to one of its requests, or a refusal."""

    msg: Message


@dataclass(slots=True)
class Refused:
    """The server asked `call`'s client for a capability it did not declare."""

    call: Call
    capability: str


Event = Deliver | Ask | Answer | Refused


class Asked:
    """The server's requests out to clients, under ids of the gateway's own: for each, the
    server's id its answer goes back under and the owner asked, whose answer alone is taken
    (docs/architecture.md, Tenancy)."""

    def __init__(self) -> None:
        self._by_id: dict[str, tuple[RequestId, Owner]] = {}

    def ask(self, upstream_id: RequestId, owner: Owner) -> str:
        """The id the server's request `upstream_id` goes to `owner` under."""
        asked_id = new_asked_id()
        self._by_id[asked_id] = (upstream_id, owner)
        return asked_id

    def answered(self, asked_id: RequestId, owner: Owner | None) -> RequestId | None:
        """The server's id of request `asked_id`, now `owner` answered it (forgotten then);
        None when nothing asked it, or another owner was asked (whose request stays open
        for its own answer)."""
        if not isinstance(asked_id, str):
            return None  # the gateway asks under ids of its own, strings (`new_asked_id`)
        entry = self._by_id.get(asked_id)
        if entry is None or entry[1] is not owner:
            return None
        del self._by_id[asked_id]
        return entry[0]

    def forget(self, owner: Owner) -> list[RequestId]:
        """`owner` is gone: the server's ids of what it was asked (forgotten)."""
        theirs = [asked_id for asked_id, (_, o) in self._by_id.items() if o is owner]
        return [self._by_id.pop(asked_id)[0] for asked_id in theirs]

    def withdrawn(self, upstream_id: object) -> tuple[str, Owner] | None:
        """The server cancelled its request `upstream_id`: the id and the owner it was
        asked under (forgotten), if it was."""
        for asked_id, (orig, owner) in self._by_id.items():
            if orig == upstream_id:
                del self._by_id[asked_id]
                return asked_id, owner
        return None

    def clear(self) -> None:
        self._by_id.clear()


class Correlator:
    """Calls in flight on one link, and the server's requests and notifications routed to
    the call or owner they belong to (never guessed), or to its audience. The audience and
    the owners of the upstream's own tasks are its peers, the connection's (`Connection`):
    it reads them to route and tells them what the server's answers say."""

    def __init__(self, host: Host, counters: Counters, audience: Audience[Owner],
                 tasks: TaskOwners[Owner]) -> None:
        self.host = host
        self.counters = counters
        self.audience = audience
        self.tasks = tasks  # the upstream's own tasks: whose
        self._ids = itertools.count(1)
        self.in_flight: dict[int, Call] = {}
        self._asked = Asked()  # the server's requests out to clients
        self.targeting: Targeting[Call, Owner] = Targeting(self.in_flight, audience, tasks)

    # -- downstream -> upstream ------------------------------------------------------------
    def open(self, msg: Message, owner: Owner | None, sink: Sink, follow_task: bool = False,
             ticket: Ticket | None = None) -> Call:
        """A call for request `msg`: its id and progress token rewritten (not sent yet)."""
        uid, client_id, token = next(self._ids), msg["id"], None
        params = msg.get("params")
        if isinstance(params, dict):
            meta = params.get("_meta")
            if isinstance(meta, dict) and "progressToken" in meta:
                # Tokens from different clients may be equal; the upstream id is unique here.
                token = meta["progressToken"]
                params["_meta"] = {**meta, "progressToken": uid}
        msg["id"] = uid
        traced = tracing.active() if owner is not None else None
        span = None if traced is None else traced.upstream_call(self.host.name, msg)
        return Call(uid, client_id, owner, sink, self.host, progress_token=token,
                    task_of=_task_of(msg["method"], params), span=span,
                    follow_task=follow_task, ticket=ticket)

    def renumber(self, call: Call, method: str, params: dict[str, Any]) -> int:
        """A new upstream id for a call that goes on with another request."""
        self.in_flight.pop(call.upstream_id, None)
        uid = next(self._ids)
        call.go_on_as(uid, _task_of(method, params))
        meta = params.get("_meta")
        if call.progress_token is not None and isinstance(meta, dict):
            params["_meta"] = {**meta, "progressToken": uid}
        return uid

    def sent(self, call: Call) -> None:
        """A call's request is on its way: in flight from now."""
        self.in_flight[call.upstream_id] = call

    def hold_call(self, call: Call) -> None:
        """Keep an answered call as the caller's while its client supplies input."""
        call.park(call.sink)
        self.in_flight[call.upstream_id] = call

    def drop(self, call: Call) -> bool:
        """Forget a call (it was cancelled or failed); False if it was gone already."""
        return self.in_flight.pop(call.upstream_id, None) is not None

    def reply(self, asked_id: RequestId, msg: Message, owner: Owner | None) -> Answer | None:
        """`owner`'s answer to a server-to-client request, back under the original id;
        None when nothing asked it, or it was asked of another owner (whose request stays
        open for its own answer)."""
        upstream_id = self._asked.answered(asked_id, owner)
        if upstream_id is None:
            return None
        msg["id"] = upstream_id
        return Answer(msg)

    def detach(self, owner: Owner) -> list[Event]:
        """`owner` is gone: what the server asked it is refused."""
        return [_refusal(upstream_id, "client session ended")
                for upstream_id in self._asked.forget(owner)]

    def calls_of(self, owner: Owner) -> list[Call]:
        """`owner`'s calls in flight but those a task adopted."""
        return [c for c in self.in_flight.values() if c.owner is owner and not c.adopted]

    def clients_calls(self) -> list[Call]:
        """The calls in flight that belong to a client (not the gateway's own)."""
        return [c for c in self.in_flight.values() if c.owner is not None]

    def lose(self, keep: Collection[Call] = ()) -> list[Call]:
        """The link died or is going away: every call in flight is returned (to fail), but
        those in `keep` (to be sent again), and what the server asked is forgotten."""
        lost = {uid: c for uid, c in self.in_flight.items() if c not in keep}
        for uid in lost:  # in place: targeting reads this very dict
            del self.in_flight[uid]
        self._asked.clear()
        self.tasks.clear()  # the server's own tasks went with it; a new one reuses their ids
        return list(lost.values())

    # -- upstream -> downstream ------------------------------------------------------------
    def response(self, msg: Message) -> Call | None:
        """The call a response answers (no longer in flight), or None when it was cancelled
        or failed already: its caller has been answered. A task of the upstream's own that
        it creates is noted as its caller's; one that it ends, as over."""
        call = self.in_flight.pop(msg["id"], None)
        if call is None or call.owner is None:
            return call
        principal = call.owner.principal
        self.audience.answered(principal)
        result = msg.get("result")
        self.tasks.note(result, principal, call.owner)
        if call.task_of is not None:
            task_id, ends = call.task_of
            if ends or (isinstance(result, dict) and result.get("status") in TERMINAL):
                self.tasks.ended(task_id)
        return call

    def progress(self, params: dict[str, Any]) -> Call | None:
        """The call a progress notification is for (its token put back), if any."""
        call = self.in_flight.get(params.get("progressToken"))  # type: ignore[arg-type]
        if call is None or call.progress_token is None:
            return None
        params["progressToken"] = call.progress_token
        return call

    def notification(self, msg: Message, via: Call | None = None) -> list[Event]:
        """A notification that is not progress: broadcast, or to the one owner it can be
        for (the call on whose stream it came, if any)."""
        method, params = msg["method"], msg.get("params")
        if method.endswith("/list_changed"):
            return self._broadcast(msg, lambda _owner: True)
        if method == mcp.RESOURCE_UPDATED and isinstance(params, dict):
            uri = params.get("uri")
            return self._broadcast(
                msg, lambda owner: isinstance(uri, str) and owner.is_subscribed(uri))
        if method == mcp.CANCELLED and isinstance(params, dict):
            return self._forward_cancel(msg, params)
        # logging and anything else: to the one owner it can belong to
        ended = self._ended(via)
        target = self._target(msg, via, ended, self.targeting.for_notification)
        if target is not None:
            owner = target.owner if isinstance(target, Call) else target
            return [Deliver(target, msg)] if owner is None or self._wanted(msg, owner) else []
        # Belonging to no call, it may concern anyone's work: only when one principal hears
        # this upstream may it go to all (docs/architecture.md, Tenancy); else nowhere.
        if not ended and not self.clients_calls() and len(self.audience.present()) <= 1:
            return self._broadcast(msg, lambda owner: self._wanted(msg, owner))
        self.counters.upstream_unroutable_notifications += 1
        return []

    def server_request(self, msg: Message, via: Call | None = None) -> list[Event]:
        """A server's request of a client: to the call on whose stream it came (exact),
        else to the one call or owner it can belong to (never guessed)."""
        method = msg["method"]
        if method == mcp.PING:
            return [Answer(jsonrpc.result(msg["id"], {}))]
        ended = self._ended(via)
        target = self._target(msg, via, ended, self.targeting.for_request)
        owner = target.owner if isinstance(target, Call) else target
        if target is None or owner is None:  # (targets are clients' calls: owner is set)
            return [self._unroutable(msg, ended)]
        if not owner.accepts(method):
            return self._undeclared(msg, target)
        msg["id"] = self._asked.ask(msg["id"], owner)
        return [Ask(target, owner, msg)]

    def _unroutable(self, msg: Message, ended: bool = False) -> Answer:
        """The refusal of a request no client is chosen for: answered, so that the server's
        handler (and its POST's stream) ends."""
        method = msg["method"]
        if ended:
            log.info("upstream.request_unroutable", upstream=self.host.name, method=method,
                     reason="its call ended")
            return _refusal(msg["id"], "the call this request came with has ended")
        if not self.audience.owners and not self.clients_calls():  # the gateway's own only
            if method == mcp.ROOTS_LIST:  # asked at start: no client, no root (not a fault)
                return Answer(jsonrpc.result(msg["id"], {"roots": []}))
            log.info("upstream.request_unroutable", upstream=self.host.name, method=method,
                     reason="no client connected")
            return _refusal(msg["id"], "no client is connected to the gateway")
        log.warning("upstream.request_unroutable", upstream=self.host.name, method=method,
                    reason="several owners",
                    owners=len({c.owner.key for c in self.in_flight.values() if c.owner}))
        return _refusal(msg["id"], "the gateway cannot tell which client this request is for;"
                        " use isolation: client or call")

    def _undeclared(self, msg: Message, target: Call | Owner) -> list[Event]:
        method = msg["method"]
        cap = mcp.CLIENT_CAPABILITY_FOR.get(method)
        why = (f"the client did not declare the '{cap}' capability" if cap else
               f"the gateway does not relay '{method}' to this client")
        refusal: list[Event] = [_refusal(msg["id"], why, jsonrpc.METHOD_NOT_FOUND)]
        if cap and isinstance(target, Call):
            return [*refusal, Refused(target, cap)]
        return refusal

    def _forward_cancel(self, msg: Message, params: dict[str, Any]) -> list[Event]:
        withdrawn = self._asked.withdrawn(params.get("requestId"))
        if withdrawn is None:
            return []
        params["requestId"], owner = withdrawn  # the id its client was asked under
        return [Deliver(owner, msg)]

    def _wanted(self, msg: Message, owner: Owner) -> bool:
        return _wanted(msg, owner, self.audience.levels_set)

    def _broadcast(self, msg: Message, want: Callable[[Owner], bool]) -> list[Event]:
        return [Deliver(owner, msg) for owner in self.audience.hearing(want)]

    def _ended(self, via: Call | None) -> bool:
        """Whether a message came on the stream of a call no longer in flight (it failed,
        timed out or was cancelled, its POST still open): that call's, nobody else's."""
        return via is not None and self.in_flight.get(via.upstream_id) is not via

    def _target(self, msg: Message, via: Call | None, ended: bool,
                guess: Callable[[Message], Call | Owner | None]) -> Call | Owner | None:
        """Where a message goes. One that names a task the gateway saw made is its
        principal's alone (spec tasks 2025-11-25: a task's messages may come on any SSE
        stream, another principal's call's included; a server's own task outlives the call
        that made it): the call on whose stream it came when that call is its principal's,
        else the task's owner (`labelled`), else nobody. Any other: the call on whose stream
        it came, while in flight (an ended call's: nobody's), else `guess`."""
        task_id = related_task(msg)
        record = self.tasks.record(task_id) if task_id is not None else None
        came = None if ended else self._came_with(via)
        if record is None:
            return came or (None if ended else guess(msg))
        if came is not None and came.owner is not None and \
                came.owner.principal == record.principal:
            return came
        return self.targeting.labelled(msg)

    def _came_with(self, via: Call | None) -> Call | None:
        """The call a message's stream belongs to, while it is a client's and in flight."""
        if via is None or via.owner is None or self.in_flight.get(via.upstream_id) is not via:
            return None
        return via


def new_asked_id() -> str:
    """An id for a server's request of a client. Random (96 bits): unique across upstreams
    and their processes, so a session that talks to several (isolation: call, or two
    upstreams) never confuses two of them, and no caller can guess another's
    (docs/architecture.md, Tenancy: an answer is accepted only from the principal asked)."""
    return f"gw-{secrets.token_urlsafe(12)}"


def _wanted(msg: Message, owner: Owner, levels_set: bool) -> bool:
    """A log message reaches an owner at or above the level it asked (spec 2025-06-18
    logging: the server sends messages at that level and above). The server is set to the
    most verbose level any owner asked, so the others are filtered here; an owner that asked
    none hears DEFAULT_LEVEL and above once the server was set for anyone (what it heard
    before, the server's own default, is gone then), and everything before."""
    if msg["method"] != mcp.LOG_MESSAGE or (owner.level is None and not levels_set):
        return True
    params = msg.get("params")
    level = params.get("level") if isinstance(params, dict) else None
    return level not in mcp.LOG_LEVELS or \
        mcp.LOG_LEVELS.index(level) >= mcp.LOG_LEVELS.index(owner.level or DEFAULT_LEVEL)


def _task_of(method: str, params: Any) -> tuple[str, bool] | None:
    """The upstream task a tasks/* request names, and whether its answer ends the task."""
    if not method.startswith("tasks/") or not isinstance(params, dict):
        return None
    task_id = params.get("taskId")
    return (task_id, method in TASK_ENDS) if isinstance(task_id, str) else None


def _refusal(upstream_id: RequestId, why: str, code: int = jsonrpc.INTERNAL_ERROR) -> Answer:
    return Answer(jsonrpc.error(upstream_id, code, why))

