"""The `limits:` section: the bounds that keep one client, or many, from exhausting the
gateway: tasks, bytes, sessions, replays, parked calls, rates, processes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from annotated_types import Ge

from gateway.settings.schema.base import _Model, doc


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits(_Model):
    """Bounds that keep one client, or many, from exhausting the gateway; docs/limits.md
    says what happens at each."""

    max_tasks: Annotated[int, Ge(1)] = field(default=10_000,
        metadata=doc("tasks kept at once, running and finished, all owners"))
    max_tasks_per_owner: Annotated[int, Ge(1)] = field(default=100,
        metadata=doc("running tasks at once for one principal (all its legacy sessions "
            "together); a new one is refused"))
    max_finished_tasks_per_owner: Annotated[int, Ge(1)] = field(default=1000,
        metadata=doc("tasks kept at once for one principal, finished and running (a "
            "running one keeps the place it will finish in); beyond it tasks whose results "
            "it read make room, the first read first, else a new task is refused"))
    max_result_bytes: Annotated[int, Ge(1)] = field(default=10 * 1024 * 1024,
        metadata=doc("a bigger result fails its task"))
    max_stored_bytes_per_principal: Annotated[int, Ge(1)] = field(default=64 * 1024 * 1024,
        metadata=doc("bytes of results kept at once for one principal; beyond it results "
            "it read make room, the first read first, else a new task is refused (and a "
            "result that still does not fit fails its task)"))
    max_stored_bytes: Annotated[int, Ge(1)] = field(default=256 * 1024 * 1024,
        metadata=doc("bytes of results kept at once, all tasks"))
    max_body_bytes: Annotated[int, Ge(1024)] = field(default=4 * 1024 * 1024,
        metadata=doc("a bigger POST body is refused (413)"))
    body_timeout_ms: Annotated[int, Ge(100)] = field(default=30_000,
        metadata=doc("a POST body not whole this long after its headers is refused (408) "
            "and its connection closed"))
    max_message_bytes: Annotated[int, Ge(1024)] = field(default=64 * 1024 * 1024,
        metadata=doc("one upstream line (a bigger one restarts that server) or HTTP "
            "answer: a JSON body or an SSE event's data (a bigger one fails its call)"))
    # 128 MiB: two answers of max_message_bytes waiting for one principal's readers; 512
    # MiB: four principals at their share, beside the result store's 256 MiB, within a
    # 1 GiB container.
    max_inflight_bytes_per_principal: Annotated[int, Ge(1024)] = field(
        default=128 * 1024 * 1024,
        metadata=doc("bytes of answers held for one principal's clients, not yet written to "
            "them (an HTTP server's from its first byte read); an answer past it fails its "
            "call (one answer always goes through)"))
    max_inflight_bytes: Annotated[int, Ge(1024)] = field(default=512 * 1024 * 1024,
        metadata=doc("and for all clients; past it, an answer of a principal over its fair "
            "share fails its call"))
    max_sessions: Annotated[int, Ge(1)] = field(default=1000,
        metadata=doc("legacy sessions at once per upstream; the newcomer's principal's least "
            "recently used idle one makes room, else it is refused"))
    max_sessions_per_principal: Annotated[int, Ge(1)] = field(default=100,
        metadata=doc("legacy sessions at once per upstream for one principal; its least "
            "recently used idle one makes room, else it is refused"))
    session_idle_ms: Annotated[int, Ge(1000)] = field(default=3_600_000,
        metadata=doc("a legacy session idle this long ends"))
    replay_events: Annotated[int, Ge(0)] = field(default=256,
        metadata=doc("SSE events kept per stream for resume"))
    replay_bytes: Annotated[int, Ge(1024)] = field(default=16 * 1024 * 1024,
        metadata=doc("and bytes kept per stream"))
    replay_budget_bytes: Annotated[int, Ge(1024)] = field(default=256 * 1024 * 1024,
        metadata=doc("bytes kept for resume by every legacy session's streams together; "
            "over it, the oldest replay of the same principal goes first"))
    replay_bytes_per_principal: Annotated[int, Ge(1024)] = field(default=64 * 1024 * 1024,
        metadata=doc("of them for one principal's streams; over it, its own oldest replay goes"))
    replay_linger_ms: Annotated[int, Ge(0)] = field(default=60_000,
        metadata=doc("an answered stream's events are kept this long for a resume, then dropped"))
    slow_reader_ms: Annotated[int, Ge(100)] = field(default=30_000,
        metadata=doc("a write waits this long at most"))
    max_parked: Annotated[int, Ge(1)] = field(default=1000,
        metadata=doc("calls waiting for a modern client's input, per upstream"))
    max_parked_per_principal: Annotated[int, Ge(1)] = field(default=100,
        metadata=doc("of them for one principal; beyond it that principal's oldest is "
            "cancelled"))
    park_timeout_ms: Annotated[int, Ge(100)] = field(default=300_000,
        metadata=doc("then the parked call is cancelled"))
    max_listeners_per_owner: Annotated[int, Ge(1)] = field(default=16,
        metadata=doc("subscriptions/listen streams per principal"))
    max_listeners: Annotated[int, Ge(1)] = field(default=1000,
        metadata=doc("subscriptions/listen streams per upstream, all principals"))
    # Per principal (auth context: a legacy session's are its principal's, issue 29), token
    # buckets; a rate of 0 means no limit. The `_per_owner` names stay for compatibility.
    task_requests_per_s: Annotated[float, Ge(0)] = field(default=200,
        metadata=doc("tasks/* requests a second, per principal (0: no limit)"))
    task_requests_burst: Annotated[int, Ge(1)] = field(default=400,
        metadata=doc("and in a burst"))
    task_creations_per_s: Annotated[float, Ge(0)] = field(default=100,
        metadata=doc("new tasks a second, per principal (0: no limit)"))
    task_creations_burst: Annotated[int, Ge(1)] = field(default=200,
        metadata=doc("and in a burst"))
    max_calls_per_owner: Annotated[int, Ge(1)] = field(default=256,
        metadata=doc("calls in flight per principal, a running task's call included"))
    # Issue 41: a stdio server process costs tens of MiB (21 MiB each measured for the test
    # server, more for node ones); 64 of them stay within a small host's memory, and give 8
    # principals their whole share at once.
    max_processes: Annotated[int, Ge(1)] = field(default=64,
        metadata=doc("server processes that isolated upstreams (isolation: client or call) "
            "run at once, all together, each warm process of a pool included (not an "
            "upstream's one primary process); a newcomer at the bound waits, then is refused"))
    max_processes_per_principal: Annotated[int, Ge(1)] = field(default=8,
        metadata=doc("of them for one principal's sessions and calls (without auth every "
            "client is one principal: only max_processes applies); its newcomer waits for "
            "one of its own to end, then is refused, never taking another's"))
    process_wait_ms: Annotated[int, Ge(0)] = field(default=10_000,
        metadata=doc("how long a new session or call waits, in a queue fair across "
            "principals, for a process at those bounds before it is refused"))
    process_idle_ms: Annotated[int, Ge(1000)] = field(default=300_000,
        metadata=doc("an isolated process idle this long goes: a legacy session's (no call "
            "or task running) ends with its session, a modern principal's is closed (the "
            "next request starts one); the warm pool stays"))
