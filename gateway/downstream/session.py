"""Legacy-era sessions: what one `initialize` created, and the bounded store that holds them.

A session is the `Owner` of its calls on the upstream connection: it says which
server-to-client requests its client declared, receives messages that belong to no live call
on its GET stream, and remembers where the answers to server requests go back to. Its
running core tasks are tied to it (`SessionTask`): their input requests and status reach
its streams, and a waiting tasks/result gets the end.
"""

from __future__ import annotations

import re
import secrets
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from typing import Any

from gateway.answer_bytes import Hold
from gateway.auth.principal import digest
from gateway.downstream.exchange import Exchange
from gateway.downstream.replay import ReplayBudget
from gateway.downstream.sse import REPLAY_BYTES, Stream
from gateway.errors import TooManySessions
from gateway.protocol import jsonrpc, mcp
from gateway.protocol.jsonrpc import Message, RequestId
from gateway.tasks.dialects import core
from gateway.tasks.engine import TaskEngine
from gateway.tasks.model import Task
from gateway.upstream.connection import Connection
from gateway.upstream.correlator import Host

Edit = Callable[[Message], Message]  # a change to an answer on its way back to the client
MAX_OPEN_REPLIES = 256  # server-to-client requests a session may leave unanswered
MAX_STREAMS = 64  # POST streams kept for resumption per session
ID_BYTES = 32  # a session id's random bytes
_ID_SHAPE = re.compile(r"[A-Za-z0-9_-]{43}")  # token_urlsafe(ID_BYTES): 43 characters


def made_here(sid: str) -> bool:
    """Whether `sid` has the shape of the ids this gateway makes (an id of another shape
    was never a session here, nor on any replica)."""
    return _ID_SHAPE.fullmatch(sid) is not None


class Session:
    modern = False  # a modern-only upstream's input_required becomes server requests here

    def __init__(self, conn: Connection, version: str, capabilities: dict[str, Any],
                 replay: int, replay_bytes: int = REPLAY_BYTES, principal: str = "anonymous",
                 budget: ReplayBudget | None = None, sid: str | None = None,
                 client_info: Any = None, by_principal: bool = False) -> None:
        # spec (Session Management): "globally unique and cryptographically secure", visible
        # ASCII only. 256 random bits, URL-safe base64. `sid`: a session another replica
        # made, adopted here (resume.py).
        self.id = sid or secrets.token_urlsafe(ID_BYTES)
        self.key = self.id
        # What logs name it by, and (without auth) what its core tasks belong to: a digest,
        # because the id is a bearer secret (the store and the logs must not hold it).
        self.owner = digest("session", self.id)
        self.principal = principal  # the auth context that created it; no other may use it
        # Whose its core tasks are: with auth the principal's (spec 2025-11-25, tasks bind
        # to the authorization context, and to the session only where there is none), so
        # every session of the principal, on any replica, reaches them (issue 35).
        self.task_owner = principal if by_principal else self.owner
        self.version = version
        self.capabilities = capabilities
        self.client_info = client_info  # initialize's clientInfo (what its record keeps)
        # Its streams' ids are this process's alone: a Last-Event-ID from another replica's
        # copy of the session finds no stream here (a fresh one), never another stream.
        self._tag = secrets.token_hex(3)
        # The upstream connection that serves it (isolation.py `home`), attached to once
        # the session is admitted.
        self.conn = conn
        self.calls: dict[RequestId, SessionExchange] = {}  # in flight, by the client's id
        self.replies: OrderedDict[str, Host] = OrderedDict()  # asked id -> who asked
        self.subscriptions: set[str] = set()
        self.tasks: dict[str, SessionTask] = {}  # its running core tasks, by id
        self.level: str | None = None  # logging/setLevel, kept for a modern-only upstream
        self.replay = (replay, replay_bytes)  # what each of its streams keeps
        self.budget = budget  # what all sessions' streams keep together
        self.get_stream = self._counted(Stream(f"{self._tag}.0", *self.replay))
        self.streams: OrderedDict[str, Stream] = OrderedDict()  # least recently used first
        self._stream_no = 0
        self.last_seen = time.monotonic()
        self.closed = False

    # -- Owner -----------------------------------------------------------------------------
    def accepts(self, method: str) -> bool:
        cap = mcp.CLIENT_CAPABILITY_FOR.get(method)
        return cap is None or cap in self.capabilities

    def deliver(self, msg: Message) -> None:
        self.get_stream.push(jsonrpc.dumps(msg))

    def expect_reply(self, asked_id: str, host: Host) -> None:
        self.replies[asked_id] = host
        while len(self.replies) > MAX_OPEN_REPLIES:
            self.replies.popitem(last=False)

    def is_subscribed(self, uri: str) -> bool:
        return uri in self.subscriptions

    def set_level(self, level: str) -> None:
        """logging/setLevel: kept for a modern-only upstream (sent with each request), and
        a legacy server set for all its owners (Connection.sync_level)."""
        self.level = level
        self.conn.sync_level()

    # -- resource subscriptions: the upstream holds one per URI for all its holders
    #    (Connection.hold, release), so only a first subscribe and a last unsubscribe of
    #    one reach it ---------------------------------------------------------------------
    def subscribe(self, uri: str) -> bool:
        """Hold `uri`; True when the subscribe must reach the upstream, False when the
        gateway answers it (held already, by this session or upstream)."""
        if uri in self.subscriptions:
            return False
        self.subscriptions.add(uri)
        return self.conn.hold(uri)

    def subscribed(self, uri: str, took: bool) -> None:
        """The upstream answered the subscribe of `uri`: held if it took it, else let go
        (the session holds nothing the server does not)."""
        if took:
            self.conn.audience.confirm(uri)
        else:
            self.subscriptions.discard(uri)
            self.conn.release(uri)

    def unsubscribe(self, uri: str) -> bool:
        """Let `uri` go; True when the unsubscribe must reach the upstream (its last
        holder). Nothing of this session's to end: False (another's stays held upstream)."""
        if uri not in self.subscriptions:
            return False
        self.subscriptions.discard(uri)
        return self.conn.release(uri)

    def unsubscribe_all(self) -> None:
        """The session ended: what it held is let go, the upstream told of each URI it was
        the last holder of."""
        for uri in self.subscriptions:
            if self.conn.release(uri):
                self.conn.send_own(mcp.UNSUBSCRIBE, {"uri": uri})

    # -- streams ---------------------------------------------------------------------------
    def new_stream(self) -> Stream:
        self._stream_no += 1
        stream = self._counted(Stream(f"{self._tag}.{self._stream_no}", *self.replay))
        self.streams[stream.key] = stream
        while len(self.streams) > MAX_STREAMS:  # the least recently used can resume no more
            _, old = self.streams.popitem(last=False)
            if self.budget is not None:
                self.budget.forget(old)
        return stream

    def _counted(self, stream: Stream) -> Stream:
        # A session's streams resume with Last-Event-ID; primed for the versions that expect it.
        stream.resumable = self.version in mcp.PRIMED_VERSIONS
        if self.budget is not None:
            self.budget.enter(stream, self.principal)
        return stream

    def find_stream(self, key: str) -> Stream | None:
        if key == self.get_stream.key:
            return self.get_stream
        stream = self.streams.get(key)
        if stream is not None:
            self.streams.move_to_end(key)
        return stream

    def close_streams(self) -> None:
        """The session ended: its streams end, and their bytes leave the replay budget."""
        for stream in (self.get_stream, *self.streams.values()):
            stream.close()
            if self.budget is not None:
                self.budget.forget(stream)


class SessionExchange(Exchange):
    """A legacy request: streams are the session's (resumable), and a server request for a
    client that accepts no SSE goes to the session's GET stream instead."""

    __slots__ = ("edit", "session")

    def __init__(self, session: Session, request_id: RequestId, sse_ok: bool, hold: Hold,
                 edit: Edit | None = None) -> None:
        super().__init__(request_id, sse_ok, session.new_stream, {mcp.H_SESSION: session.id},
                         hold)
        self.session = session
        self.edit = edit  # applied to the answer, the server's or the gateway's

    def answer(self, msg: Message, status: int = 200) -> None:
        super().answer(msg if self.edit is None else self.edit(msg), status)

    def seen_as(self) -> dict[str, str]:
        return {"session": self.session.owner[:12]}

    def unstreamable(self, msg: Message) -> None:
        if "id" in msg:
            self.session.deliver(msg)


class SessionTask:
    """Ties one running task to its session until the task ends."""

    __slots__ = ("engine", "held", "last_status", "notify", "relay_progress", "session",
                 "task", "waiters")

    def __init__(self, engine: TaskEngine, session: Session, task: Task,
                 relay_progress: bool, notify: bool = True) -> None:
        self.engine = engine
        self.notify = notify  # its status changes, told (not for a keyed plain call's task)
        self.session = session
        self.task = task
        self.relay_progress = relay_progress  # the client asked for progress on its call
        self.waiters: list[SessionExchange] = []  # open tasks/result requests
        self.held: list[Message] = []  # input requests no open stream could take yet
        self.last_status = task.status

    def relay(self, msg: Message) -> None:
        """The engine's relay: the task's input requests and progress, to the client."""
        if "id" in msg:
            msg = core.related(msg, self.task)
            if not self.waiters and self.session.get_stream.writer is None:
                self.held.append(msg)  # a request must reach a reader; progress may wait
                return
        elif not self.relay_progress:
            return
        if self.waiters:
            self.waiters[-1].on_message(msg)
        else:
            self.session.deliver(msg)

    def changed(self, task: Task) -> None:
        """The engine's watcher: push status changes; answer waiting tasks/result calls."""
        if task.status is not self.last_status:
            self.last_status = task.status
            if self.notify:
                self.session.deliver(core.status_notification(task))
        if task.terminal:
            waiters, self.waiters = self.waiters, []
            for ex in waiters:
                ex.on_response(core.final(task, ex.request_id))
            self.held.clear()
            self.session.tasks.pop(task.id, None)
            self.engine.unwatch(task.id, self.changed)

    def flush(self) -> None:
        for msg in self.held:
            self.session.deliver(msg)
        self.held.clear()


class SessionStore:
    """Live sessions, bounded by count (in all, and per principal) and by idle time.

    At a bound the newcomer's own principal makes room: its least recently used idle session
    (no call in flight, no running task) ends; when it has none, the newcomer is refused.
    Another principal's session is never ended for it, nor a session whose work runs
    (issue 29: quotas and bounds belong to the principal).
    """

    def __init__(self, max_sessions: int, idle_s: float, per_principal: int | None = None,
                 replay: ReplayBudget | None = None) -> None:
        self.replay = replay  # the bytes its sessions' streams keep, shared with others
        self.max_sessions = max_sessions
        self.per_principal = per_principal or max_sessions
        self.idle_s = idle_s
        self._by_id: OrderedDict[str, Session] = OrderedDict()
        self._held: Counter[str] = Counter()  # sessions per principal

    def __len__(self) -> int:
        return len(self._by_id)

    def held_by(self, principal: str) -> int:
        """How many sessions `principal` holds here."""
        return self._held[principal]

    def get(self, sid: str, principal: str) -> Session | None:
        """`principal`'s session `sid`, used now; None when none is held here, and when it
        is another principal's: left untouched, so that Bob presenting Alice's id neither
        keeps her session alive (nor its record renewed) nor moves it in the eviction
        order, as an unknown id would not (docs/architecture.md, Tenancy)."""
        session = self._by_id.get(sid)
        if session is None or session.principal != principal:
            return None
        session.last_seen = time.monotonic()
        self._by_id.move_to_end(sid)
        return session

    def held(self, sid: str) -> Session | None:
        """The session `sid` held here, whoever's it is, untouched."""
        return self._by_id.get(sid)

    def add(self, session: Session) -> Session | None:
        """Store `session`; returns a session of its principal evicted to make room, or
        raises TooManySessions."""
        principal = session.principal
        over = self._held[principal] >= self.per_principal
        evicted = None
        if over or len(self._by_id) >= self.max_sessions:
            evicted = next((s for s in self._by_id.values()
                            if s.principal == principal and idle(s)), None)
            if evicted is None:
                raise refusal(over, self.per_principal, self.max_sessions)
            self.pop(evicted.id)
        self._by_id[session.id] = session
        self._held[principal] += 1
        return evicted

    def pop(self, sid: str) -> Session | None:
        session = self._by_id.pop(sid, None)
        if session is not None:
            self._held[session.principal] -= 1
            if self._held[session.principal] <= 0:
                del self._held[session.principal]
        return session

    def expired(self) -> list[Session]:
        """Remove and return the sessions idle for longer than the limit (a session whose
        call or task still runs is not idle)."""
        cutoff = time.monotonic() - self.idle_s
        old = [s for s in self._by_id.values() if s.last_seen < cutoff and idle(s)]
        for s in old:
            self.pop(s.id)
        return old

    def all(self) -> list[Session]:
        return list(self._by_id.values())

    def idle_of(self, principal: str, but: Session) -> Session | None:
        """`principal`'s least recently used idle session here other than `but`."""
        return next((s for s in self._by_id.values()
                     if s.principal == principal and s is not but and idle(s)), None)


def idle(session: Session) -> bool:
    """Nothing of its client's runs: ending it cancels no work."""
    return not session.calls and not session.tasks


def refusal(over: bool, per_principal: int, max_sessions: int) -> TooManySessions:
    if over:
        return TooManySessions(
            f"Too many sessions for this client: at most {per_principal} at once, none idle; "
            "end one (DELETE) or try again later", {"maxSessions": per_principal})
    return TooManySessions("Too many sessions: the gateway holds its maximum and none of this "
                           "client's is idle; try again later", {"maxSessions": max_sessions})
