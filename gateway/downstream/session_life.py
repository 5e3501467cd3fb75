"""A legacy session's life on this replica, apart from the requests it carries (legacy.py).

Made at initialize within its principal's share of the bounds (here, and across replicas
when they share a store: resume.py), attached to its upstream connection, found for each
request or adopted from another replica, renewed while used, and ended: deleted, evicted
to make room for its own principal, idle, or ended elsewhere (issue 29: bounds belong to
the principal; docs/architecture.md, "Where a task ends" for what its tasks do then).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from gateway import errors
from gateway.auth.principal import digest
from gateway.downstream.core_tasks import CoreTasks
from gateway.downstream.resume import ENDED, Record, Resumption, kept_client_info, record_key
from gateway.downstream.session import Session, SessionStore, idle, refusal
from gateway.downstream.session_calls import SessionCalls
from gateway.errors import StoreUnavailable, UpstreamError
from gateway.observability import log
from gateway.settings.schema import Settings
from gateway.upstream.isolation import Backend


class SessionLife:
    """One upstream's legacy sessions: made, found or adopted, renewed, ended."""

    def __init__(self, backend: Backend, sessions: SessionStore, conf: Settings,
                 tasks: CoreTasks, calls: SessionCalls, resume: Resumption | None) -> None:
        self.backend = backend
        self.sessions = sessions
        self.tasks = tasks
        self.calls = calls
        # Replicas sharing a store: sessions' records there, adopted on any replica.
        self.resume = resume
        self._adopting: dict[str, asyncio.Lock] = {}
        # Sessions held here whose upstream is not attached yet (`attach`): requests wait
        # for their adoption, and an end lets their upstream go once it is attached.
        self._attaching: set[Session] = set()
        self._keys: dict[str, str] = {}  # record key -> id, of the sessions held here
        self.replicas = tasks.engine.replicas
        if resume is not None and self.replicas is not None:
            self.replicas.on_announced(ENDED, self._ended_elsewhere)
        self._renewed = time.monotonic()
        self.by_principal = conf.auth.enabled  # with auth, core tasks are the principal's
        self.replay = (conf.limits.replay_events, conf.limits.replay_bytes)

    def new(self, version: str, capabilities: dict[str, Any], principal: str,
            client_info: Any, sid: str | None = None) -> Session:
        return Session(self.backend.home(), version, capabilities, *self.replay,
                       principal=principal, budget=self.sessions.replay, sid=sid,
                       client_info=kept_client_info(client_info),  # the rest is not kept
                       by_principal=self.by_principal)

    def record_of(self, session: Session) -> Record:
        return Record(session.principal, self.backend.name, session.version,
                      session.capabilities, session.client_info)

    def keepable(self, session: Session) -> bool:
        """Whether the session's record is within resume.MAX_RECORD_BYTES: the cap on what
        a session holds, here (the memory store) as in a shared store (issue 41)."""
        return self.record_of(session).fits()

    # -- made ------------------------------------------------------------------------------
    async def admit(self, session: Session) -> errors.TooManySessions | None:
        """Hold the new session here and record it in the shared store; the refusal when
        its principal holds its share (here, or across replicas) and none of its own
        sessions here is idle to make room (issue 29: never another principal's)."""
        try:
            evicted = self.sessions.add(session)
        except errors.TooManySessions as exc:
            return exc
        if evicted is not None:
            await self.end(evicted, "evicted")
        if self.resume is None:
            return None
        if await self._recorded(self.resume, session):
            self._keys[record_key(session.id)] = session.id
            return None
        self.sessions.pop(session.id)
        return refusal(True, self.sessions.per_principal, self.sessions.max_sessions)

    async def unadmit(self, session: Session) -> None:
        """A session whose client never got its id (its upstream failed it): gone here,
        and its record with it, so that it holds none of its principal's share across
        replicas (a few retries in an upstream outage would lock the principal out for
        a whole idle time)."""
        self.sessions.pop(session.id)
        if self.resume is not None:
            self._keys.pop(record_key(session.id), None)
            await self.resume.end(session.id, session.principal)

    async def _recorded(self, resume: Resumption, session: Session) -> bool:
        """Its record is kept, the principal's share across replicas allowing, after one of
        its idle sessions here ended to make room if need be."""
        record = self.record_of(session)
        if await resume.open(session.id, record):
            return True
        spare = self.sessions.idle_of(session.principal, but=session)
        if spare is None:
            return False
        await self.end(spare, "evicted")
        return await resume.open(session.id, record)

    async def attach(self, session: Session) -> dict[str, Any]:
        """Its upstream connection, and what the server said of itself when it was attached
        (UpstreamError: it holds no place here then). Ended meanwhile (evicted, deleted,
        ended elsewhere), it lets that connection go at once: `end` could not (isolation:
        client, the process would run on for good)."""
        self._attaching.add(session)
        try:
            init_result = await self.backend.attach(session, session.conn)
        except UpstreamError:
            self.sessions.pop(session.id)
            raise
        finally:
            self._attaching.discard(session)
        if session.closed:
            await self.backend.detach(session, session.conn)
        return init_result

    # -- found -----------------------------------------------------------------------------
    async def find(self, sid: str, principal: str) -> Session | None:
        """The session `sid` held here, or adopted from the shared store; None when unknown
        (another principal's included: it must look the same, docs/architecture.md,
        Tenancy). One being adopted here (its upstream not attached yet) is waited for."""
        session = self.sessions.get(sid, principal)
        if self.resume is not None and (session is None or session in self._attaching):
            session = await self.adopt(self.resume, sid, principal)
        return session

    async def adopt(self, resume: Resumption, sid: str, principal: str) -> Session | None:
        """The session `sid` of `principal` that another replica made (it stopped, died, or
        the balancer sent the client here), held here from now on; None when the store
        knows no such session of this principal. One adoption at a time per id: requests
        that come meanwhile wait for it."""
        lock = self._adopting.setdefault(sid, asyncio.Lock())
        try:
            async with lock:
                held = self.sessions.get(sid, principal)
                if held is not None:  # adopted by the request that held the lock
                    return held
                # Read even when another principal's session `sid` is held here: Bob on
                # Alice's id gets what an unknown id gets (a 503 too, the store down).
                record = await resume.find(sid, principal)
                # Adopted meanwhile by a request that came as the lock was let go (or
                # another principal's, held here: not found).
                if self.sessions.held(sid) is not None:
                    return self.sessions.get(sid, principal)
                return None if record is None else await self._adopted(sid, record)
        finally:
            if not lock.locked():
                self._adopting.pop(sid, None)

    async def _adopted(self, sid: str, record: Record) -> Session | None:
        session = self.new(record.version, record.capabilities, record.principal,
                           record.client_info, sid)
        evicted = self.sessions.add(session)  # TooManySessions: 503, the client retries
        if evicted is not None:
            await self.end(evicted, "evicted")
        await self.attach(session)
        if session.closed:  # ended meanwhile (deleted, here or on another replica)
            return None
        self._keys[record_key(sid)] = sid
        log.info("session.adopted", session=session.owner[:12], protocol=session.version,
                 upstream=self.backend.name)
        self.backend.counters.sessions_adopted += 1
        return session

    # -- ended -----------------------------------------------------------------------------
    async def to_end(self, sid: str, principal: str) -> Session | Record | None:
        """What a DELETE of `sid` by `principal` ends: the session held here (once its
        adoption here, if one runs, is done), or its record when another replica holds it
        (or one gone did); None when unknown (another principal's included)."""
        session = self.sessions.get(sid, principal)
        if self.resume is None or (session is not None and session not in self._attaching):
            return session
        if session is not None:  # being adopted here: ended after
            return await self.adopt(self.resume, sid, principal)
        # Another principal's session held here is looked up too: it looks unknown.
        record = await self.resume.find(sid, principal)
        if record is not None and self.sessions.held(sid) is None:
            return record
        return self.sessions.get(sid, principal)  # adopted here meanwhile

    async def end_elsewhere(self, sid: str, principal: str) -> None:
        """DELETE of a session whose record `to_end` found, not held here."""
        if self.resume is not None:
            await self._end_everywhere(self.resume, sid, principal)
        log.info("session.ended", session=digest("session", sid)[:12], why="deleted",
                 upstream=self.backend.name)

    async def _end_everywhere(self, resume: Resumption, sid: str, principal: str) -> None:
        """Its record goes (no replica adopts it or writes it back), and every replica
        holding a copy is told to end it now rather than at its next renewal."""
        await resume.end(sid, principal)
        if self.replicas is not None:
            # The store down: the copies end at their next renewal instead.
            with contextlib.suppress(StoreUnavailable):
                await self.replicas.announce(ENDED, record_key(sid))

    async def _ended_elsewhere(self, key: str) -> None:
        """Another replica ended the session whose record key is `key` (DELETE, eviction)."""
        sid = self._keys.get(key)
        session = None if sid is None else self.sessions.held(sid)
        if session is not None:
            await self.end(session, "ended elsewhere")

    async def end(self, session: Session, why: str) -> None:
        """End `session`: cancel its calls upstream, release its process, close its streams.
        Deleted or evicted, it ends everywhere; idle here, its record expires by itself
        unless another replica serves it meanwhile."""
        self.sessions.pop(session.id)
        if self.resume is not None:
            self._keys.pop(record_key(session.id), None)
            if why in ("deleted", "evicted"):
                await self._end_everywhere(self.resume, session.id, session.principal)
        session.closed = True
        await self.tasks.end(session)
        self.calls.end(session)
        if session not in self._attaching:  # attaching, `attach` lets its upstream go
            session.unsubscribe_all()
            await self.backend.detach(session, session.conn)
        session.close_streams()
        log.info("session.ended", session=session.owner[:12], why=why, upstream=self.backend.name)

    async def expire(self) -> None:
        for session in self.sessions.expired():
            await self.end(session, "idle")
        if self.resume is not None:
            await self._renew(self.resume)

    async def _renew(self, resume: Resumption) -> None:
        """The records of the sessions used since the last renewal (or whose work runs)
        live on; those ended on another replica meanwhile (DELETE) end here too."""
        since, self._renewed = self._renewed, time.monotonic()
        used = {s.id: s for s in self.sessions.all() if s.last_seen >= since or not idle(s)}
        for sid in await resume.renew([(s.id, self.record_of(s)) for s in used.values()]):
            await self.end(used[sid], "ended elsewhere")
