"""Legacy sessions that outlive their replica (issue 35): each session's record in the shared
store, so that a replica asked about a session it does not hold adopts it.

A record names the session by a digest of its id (the id is a bearer capability: the store
never holds it) and holds what a replica needs to serve it: its principal, upstream,
negotiated version, the client's capabilities and the part of its info kept (`kept_client_info`).
It expires at the session's idle
expiry: every reap, each replica renews the records of the sessions it saw used (or whose
work still runs), so a record lives at least `session_idle_ms` after its last use and at
most RENEW_SLACK_S more. A record is adopted only by the principal that made the session
(docs/architecture.md, Tenancy: another credential presenting the id gets what an unknown id gets).

What is local stays local: an adopted session starts with fresh streams (a GET stream or
replay of the old replica is gone; spec 2025-06-18, Resumability: the server MAY replay, a
fresh stream is a valid answer), and a server request the old replica was waiting on is
answered nowhere: its call failed with that replica.

With one process (the memory store) there are no records: nobody else could adopt them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from gateway.auth.principal import digest
from gateway.downstream.session import made_here
from gateway.errors import StoreUnavailable
from gateway.observability import log

ENDED = "session-ended"  # announced to every replica with the ended session's record key
# A session's record as JSON, at most, in the shared store and in a replica's memory alike
# (issue 41: 60 sessions of 3 MiB of capabilities each held 200 MiB): the store is every
# tenant's, and each renewal sends the record again. Clients' capabilities and info take a
# few hundred bytes.
MAX_RECORD_BYTES = 8 * 1024
# What a session keeps of its client's `clientInfo` (spec: Implementation): what logs read.
# Anything else a client puts there (icons, a description, a website) is dropped at once.
CLIENT_INFO_KEPT = ("name", "title", "version")
MAX_INFO_CHARS = 256  # each of those, at most (longer is cut)
RENEW_SLACK_S = 70.0  # more than two reaps (app.REAP_EVERY_S): renewals never come late


class SessionRecords(Protocol):
    """Where records live (tasks/store/redis_sessions.py); records are opaque bytes there."""

    async def open(self, key: str, group: str, record: bytes, ttl_ms: int, limit: int
                   ) -> bool:
        """Keep a new record; False (nothing kept) when `group` holds `limit` already."""

    async def read(self, key: str) -> bytes | None:
        """The record under `key`; None when there is none (or it failed its seal)."""

    async def renew(self, held: list[tuple[str, str, bytes]], ttl_ms: int) -> list[str]:
        """Renew (key, group, record) entries; the keys of sessions ended meanwhile."""

    async def end(self, key: str, group: str, remember_ms: int) -> None:
        """The session ended everywhere."""


@dataclass(frozen=True, slots=True)
class Record:
    """What a replica needs to serve a session it did not make."""

    principal: str
    upstream: str
    version: str
    capabilities: dict[str, Any]
    client_info: Any = None

    def dump(self) -> bytes:
        return orjson.dumps({"principal": self.principal, "upstream": self.upstream,
                             "version": self.version, "capabilities": self.capabilities,
                             "clientInfo": self.client_info})

    def fits(self) -> bool:
        """Whether this record is within MAX_RECORD_BYTES as JSON: a session is made only
        then, whichever store holds it (issue 41: the same cap everywhere)."""
        return len(self.dump()) <= MAX_RECORD_BYTES

    @classmethod
    def load(cls, data: bytes) -> Record | None:
        try:
            held = orjson.loads(data)
            return cls(str(held["principal"]), str(held["upstream"]), str(held["version"]),
                       dict(held["capabilities"]), held.get("clientInfo"))
        except (ValueError, KeyError, TypeError):
            return None


def kept_client_info(info: Any) -> dict[str, str] | None:
    """What a session keeps of its client's `clientInfo`: CLIENT_INFO_KEPT, strings only,
    each cut to MAX_INFO_CHARS; None when none is there."""
    if not isinstance(info, dict):
        return None
    kept = {k: v[:MAX_INFO_CHARS] for k in CLIENT_INFO_KEPT if isinstance(v := info.get(k), str)}
    return kept or None


def record_key(session_id: str) -> str:
    """What names a session in the store: a digest of its id (not the digest its core tasks
    are owned by, so the store's keys do not tie a record to its tasks)."""
    return digest("session-record", session_id)


class Resumption:
    """One upstream's session records: made at initialize, read to adopt, renewed while
    used, ended by DELETE (everywhere: no replica writes an ended record back)."""

    def __init__(self, records: SessionRecords, upstream: str, idle_s: float,
                 per_principal: int) -> None:
        self.records = records
        self.upstream = upstream
        self.ttl_ms = int((idle_s + RENEW_SLACK_S) * 1000)
        self.per_principal = per_principal

    def group(self, principal: str) -> str:
        return f"{self.upstream}:{principal}"  # a principal is hex, or "anonymous"

    async def open(self, session_id: str, record: Record) -> bool:
        """Keep the new session's record; False when its principal holds
        `max_sessions_per_principal` sessions across replicas. A store that does not
        answer keeps nothing: the session works here, and the next renewal writes it."""
        try:
            return await self.records.open(record_key(session_id),
                                           self.group(record.principal), record.dump(),
                                           self.ttl_ms, self.per_principal)
        except StoreUnavailable as exc:
            log.warning("session.record_unwritten", upstream=self.upstream, error=str(exc))
            return True

    async def find(self, session_id: str, principal: str) -> Record | None:
        """The record of a session of `principal` on this upstream; None for an unknown,
        ended or expired id, and for another principal's (which must look the same). An
        id of a shape no replica makes costs the store nothing."""
        if not made_here(session_id):
            return None
        data = await self.records.read(record_key(session_id))
        record = None if data is None else Record.load(data)
        if record is None or record.upstream != self.upstream:
            return None
        if record.principal != principal:
            log.warning("session.not_adopted", audit=True, why="principal",
                        upstream=self.upstream)
            return None
        return record

    async def renew(self, held: list[tuple[str, Record]]) -> list[str]:
        """The records of sessions used lately live on; the ids of those ended elsewhere
        (DELETE on another replica), which end here too."""
        by_key = {record_key(sid): sid for sid, _ in held}
        try:
            gone = await self.records.renew(
                [(record_key(sid), self.group(r.principal), r.dump()) for sid, r in held],
                self.ttl_ms)
        except StoreUnavailable:
            return []  # the next reap tries again (records live RENEW_SLACK_S longer)
        return [by_key[key] for key in gone]

    async def end(self, session_id: str, principal: str) -> None:
        """The session ended for its client: everywhere, and for good."""
        try:
            await self.records.end(record_key(session_id), self.group(principal),
                                   self.ttl_ms)
        except StoreUnavailable as exc:  # its record expires by itself
            log.warning("session.record_unended", upstream=self.upstream, error=str(exc))


__all__ = ["CLIENT_INFO_KEPT", "ENDED", "MAX_RECORD_BYTES", "RENEW_SLACK_S", "Record", "Resumption",
           "SessionRecords", "kept_client_info", "record_key"]
