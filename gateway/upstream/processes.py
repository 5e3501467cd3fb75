"""The budget of server processes that isolated upstreams (`isolation: client` or `call`)
start: `limits.max_processes` for every isolated upstream of this gateway together, and
`limits.max_processes_per_principal` of them for one principal (issue 41, item 2).

A process is taken before it starts and given back once it is closed:
- `isolation: client`: a legacy session's own process (its principal's), and a modern
  principal's own process;
- `isolation: call`: each warm process of the pool counts against the overall bound from
  its start (owned by no principal: `POOL`), and a call that takes one holds a place of its
  principal's share while it runs.
An upstream's primary (control) process is not counted: one per upstream, whoever calls.

At the bound a newcomer waits in a fair queue (queues.py: owners served in turn, one each),
first for its principal's share, then for the overall bound, at most `process_wait_ms`;
then it is refused with `TooManyProcesses`, naming the bound it waited for. A principal's
waiting newcomer never takes a process of another principal: places are only given back
by their holders (a session ended, idle or deleted; a call done).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from gateway.errors import QueueFull, TooManyProcesses
from gateway.observability.counters import Counters
from gateway.queues import Limit, Queues, Ticket
from gateway.settings.schema import Limits

POOL = "pool"  # the owner of `isolation: call`'s warm processes in the overall lane
# Newcomers that may wait at once, per lane (beyond, refused at once). Each also holds a
# session or a call slot, bounded per principal elsewhere: this only keeps the lane finite.
MAX_WAITING = 1000


@dataclass(frozen=True, slots=True)
class Bounds:
    """`max_processes`; the share of one principal (None: no share, no auth: every client
    is the one anonymous principal); how long a newcomer waits at a bound; how long a
    process may idle."""

    overall: int
    per_principal: int | None
    wait_s: float
    idle_s: float  # an isolated process idle this long goes (isolation.py `reap`)

    @classmethod
    def of(cls, limits: Limits, by_principal: bool) -> Bounds:
        """The bounds `limits` sets; shares only when clients are told apart (auth)."""
        return cls(limits.max_processes,
                   limits.max_processes_per_principal if by_principal else None,
                   limits.process_wait_ms / 1000, limits.process_idle_ms / 1000)


class Processes:
    """Places for isolated server processes, overall and per principal (one per gateway,
    shared by its isolated upstreams)."""

    def __init__(self, bounds: Bounds | None = None, counters: Counters | None = None) -> None:
        self.bounds = bounds or Bounds.of(Limits(), by_principal=True)
        self.counters = counters if counters is not None else Counters()
        # Its own queues: waiting for a process is not a tool call's queue (metrics).
        self.queues = Queues()
        self.overall = Limit("", "*", self.bounds.overall, MAX_WAITING, server=True)

    def _share(self, principal: str) -> Limit | None:
        per = self.bounds.per_principal
        return None if per is None else Limit("", principal, per, MAX_WAITING)

    async def take(self, upstream: str, principal: str) -> Ticket:
        """A place for one process of `principal` (overall, and of its share), once there
        is one; TooManyProcesses when none came within the wait."""
        return await self._take(upstream, principal, (self._share(principal), self.overall))

    async def share(self, upstream: str, principal: str) -> Ticket | None:
        """A place of `principal`'s share only (a call on a warm process, which holds its
        place overall already); None without shares."""
        limit = self._share(principal)
        return None if limit is None else await self._take(upstream, principal, (limit,))

    async def pooled(self, upstream: str) -> Ticket:
        """A place overall for a warm process: waits as long as it takes (its refill is
        cancelled when the upstream closes)."""
        return await self._take(upstream, POOL, (self.overall,), bounded=False)

    async def _take(self, upstream: str, owner: str, limits: tuple[Limit | None, ...],
                    bounded: bool = True) -> Ticket:
        try:
            ticket = self.queues.ticket(owner, *limits)
        except QueueFull:
            raise self.refusal(upstream, limits[-1]) from None
        if ticket is None:  # the overall limit is always given: a fault of the gateway's
            raise RuntimeError("a process place asked for with no limit")
        running: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def run() -> None:
            if not running.done():  # not timed out meanwhile
                running.set_result(None)
        ticket.when_running(run)
        try:  # asyncio.wait, not wait_for: see isolation.PerCall._take_warm
            await asyncio.wait({running}, timeout=self.bounds.wait_s if bounded else None)
            if not running.done():  # its place goes below, once
                lane = ticket.lane
                raise self.refusal(upstream, None if lane is None else lane.limit)
        except BaseException:
            ticket.release()
            raise
        return ticket

    def refusal(self, upstream: str, limit: Limit | None) -> TooManyProcesses:
        self.counters.reject("processes")
        wait = f"waited {self.bounds.wait_s:g} s; "
        if limit is not None and limit is not self.overall and not limit.server:
            return TooManyProcesses(
                upstream, f"Too many server processes for this client: at most "
                f"{limit.max_concurrency} at once (limits.max_processes_per_principal); "
                f"{wait}end a session (DELETE) or retry later",
                bound="max_processes_per_principal", maxProcesses=limit.max_concurrency)
        return TooManyProcesses(
            upstream, f"Too many server processes: the gateway runs its maximum of "
            f"{self.bounds.overall} (limits.max_processes); {wait}retry later",
            bound="max_processes", maxProcesses=self.bounds.overall)

    def status(self) -> dict[str, int | None]:
        lane = self.queues.lanes.get(("", "*", True))
        return {"max_processes": self.bounds.overall,
                "max_processes_per_principal": self.bounds.per_principal,
                "running": 0 if lane is None else lane.running,
                "waiting": 0 if lane is None else lane.depth}
