"""Concurrency limits with fair queues: how many tool calls run at once on a server
(`upstreams.<name>.max_concurrency`) and of a tool (`tasks.tools.<pattern>.max_concurrency`),
and the calls beyond that, waiting their turn.

A call beyond a limit waits in that limit's `Lane`, fair across owners: the lane serves its
owners in turn, one call each, so one owner's burst never starves another's single call.
Each waiting call's `Ticket` knows how many will be served before it, and is told whenever
that changes; a full lane (`max_queue` waiting) refuses at once with `QueueFull`, naming the
limit, and so does a lane where the owner already holds its share: all but a quarter of
`max_queue`, kept for the others (one owner's burst never fills the queue against them;
docs/architecture.md, Tenancy). A call under both limits waits for its tool's lane, then for its
server's.

Per replica: replicas count their own calls (docs/upstreams.md, Concurrency limits). Pure:
no I/O; the clock is injectable.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.errors import QueueFull
from gateway.observability.counters import Counters

HOLD_WEIGHT = 0.2  # of the newest call in a lane's average time to run
MAX_LANES = 4096  # beyond, idle lanes are forgotten (a lane per tool name, from clients)


@dataclass(frozen=True, slots=True)
class Limit:
    """One limit: `label` names it for metrics and errors (a tool pattern, or "*")."""

    upstream: str
    label: str
    max_concurrency: int
    max_queue: int
    server: bool = False  # the server's own limit, apart from a tool pattern named "*"
    # What errors call it where clients know it by another name (a renamed tool's own
    # limit: docs/tools.md); the lane is the same whatever it is called.
    shown: str = field(default="", compare=False)


Waited = Callable[[str, str, float], None]  # (upstream, label, seconds queued)


class Lane:
    """The calls running under one limit, and those waiting for it, owner by owner."""

    def __init__(self, limit: Limit, waited: Waited, clock: Callable[[], float]) -> None:
        self.limit = limit
        self.running = 0
        self.depth = 0
        # Owner -> its waiting tickets, oldest first. The dict's order is the turn: an owner
        # served goes to the back (re-inserted) while it has more waiting.
        self.waiting: dict[str, deque[Ticket]] = {}
        self.hold_s: float | None = None  # how long a call runs here, on average
        self._waited = waited
        self._clock = clock

    @property
    def busy(self) -> bool:
        """Whether a call coming now would wait (every slot taken, or others waiting)."""
        return self.running >= self.limit.max_concurrency or self.depth > 0

    @property
    def full(self) -> bool:
        return self.depth >= self.limit.max_queue and self.running >= self.limit.max_concurrency

    def over_share(self, owner: str) -> bool:
        """Whether `owner` holds all it may of this lane's waiting places: a quarter of them
        stays for other owners."""
        share = self.limit.max_queue - self.limit.max_queue // 4
        return len(self.waiting.get(owner, ())) >= share

    def expected_wait_s(self, ahead: int) -> float | None:
        """How long a call with `ahead` before it may wait (None: nothing has run yet)."""
        if self.hold_s is None:
            return None
        return (ahead + 1) * self.hold_s / self.limit.max_concurrency

    def enter(self, ticket: Ticket) -> bool:
        """True when `ticket` runs at once; else it waits its turn."""
        if self.running < self.limit.max_concurrency and not self.depth:
            self.running += 1
            return True
        self.waiting.setdefault(ticket.owner, deque()).append(ticket)
        self.depth += 1
        self._moved()
        return False

    def leave(self, ticket: Ticket) -> None:
        """`ticket` waits no more (cancelled): the others move up."""
        queue = self.waiting.get(ticket.owner)
        if queue is None or ticket not in queue:
            return
        queue.remove(ticket)
        if not queue:
            del self.waiting[ticket.owner]
        self.depth -= 1
        self._moved()

    def done(self, ran_s: float | None) -> None:
        """A call that held a slot here ended (having run `ran_s`; None: it never ran, as it
        left while waiting for another lane): the next one in turn runs."""
        self.running -= 1
        if ran_s is not None:
            self.hold_s = ran_s if self.hold_s is None else (
                (1 - HOLD_WEIGHT) * self.hold_s + HOLD_WEIGHT * ran_s)
        granted: list[Ticket] = []
        while self.running < self.limit.max_concurrency and self.waiting:
            owner = next(iter(self.waiting))
            queue = self.waiting.pop(owner)
            granted.append(queue.popleft())
            if queue:
                self.waiting[owner] = queue  # to the back of the turn
            self.depth -= 1
            self.running += 1
        if granted:
            self._moved()
        now = self._clock()
        for ticket in granted:
            self._waited(self.limit.upstream, self.limit.label, now - ticket.since)
            ticket.granted()

    def ahead(self) -> dict[Ticket, int]:
        """How many calls will run before each waiting one: the lane serves owner by owner,
        one call each round, in turn order; each waiting call is visited once."""
        found: dict[Ticket, int] = {}
        active, depth = list(self.waiting.values()), 0
        while active:
            for queue in active:
                found[queue[depth]] = len(found)
            depth += 1
            active = [queue for queue in active if len(queue) > depth]
        return found

    def _moved(self) -> None:
        for ticket, ahead in self.ahead().items():
            ticket.moved(self, ahead)


class Ticket:
    """One call's place under its limits: waiting in a lane, or running (holding a slot in
    each). What waits for it to run is given to `when_running`; `on_move(ahead)` hears how
    many are before it as that changes, and `on_move(None)` once it runs."""

    __slots__ = ("_at", "_clock", "_started", "_then", "ahead", "lanes", "on_move", "owner",
                 "since")

    def __init__(self, lanes: list[Lane], owner: str, clock: Callable[[], float]) -> None:
        self.lanes = lanes
        self.owner = owner
        self.on_move: Callable[[int | None], None] | None = None
        self._then: list[Callable[[], None]] = []
        self.ahead: int | None = None  # None: not waiting
        self._clock = clock
        self.since = clock()
        self._started: float | None = None  # when it began to run
        self._at = 0  # the lane it waits for (len(lanes): it runs; -1: released)
        self._enter()

    @property
    def queued(self) -> bool:
        return 0 <= self._at < len(self.lanes)

    @property
    def lane(self) -> Lane | None:
        """The lane it waits in."""
        return self.lanes[self._at] if self.queued else None

    def expected_wait_s(self) -> float | None:
        """How long it may still wait, from how long calls ran lately (None: not known)."""
        lane = self.lane
        return None if lane is None or self.ahead is None else lane.expected_wait_s(self.ahead)

    def granted(self) -> None:
        """The lane it waited in gave it a slot: on to the next lane, or run."""
        self._at += 1
        self.ahead = None
        self._enter()

    def _enter(self) -> None:
        while self._at < len(self.lanes):
            if not self.lanes[self._at].enter(self):
                return  # waits there (the lane told it its place)
            self._at += 1
        self._started = self._clock()
        then, self._then = self._then, []
        for run in then:
            run()
        if self.on_move is not None:
            self.on_move(None)

    def when_running(self, run: Callable[[], None]) -> None:
        """`run()` now if the call may run, else as soon as it may (never if it leaves)."""
        if self.queued:
            self._then.append(run)
        elif self._at >= 0:
            run()

    def moved(self, lane: Lane, ahead: int) -> None:
        if lane is not self.lane or ahead == self.ahead:
            return
        self.ahead = ahead
        if self.on_move is not None:
            self.on_move(ahead)

    def release(self) -> None:
        """The call ended, or left the queue: every slot it holds goes (once)."""
        if self._at < 0:
            return
        held = self.lanes[:self._at]
        if self.queued:
            self.lanes[self._at].leave(self)
        ran_s = None if self._started is None else self._clock() - self._started
        self._at, self.ahead, self.on_move, self._then = -1, None, None, []
        for lane in held:
            lane.done(ran_s)


class Queues:
    """Every lane of this replica, found by upstream and tool."""

    def __init__(self, waited: Waited = lambda _u, _l, _s: None,
                 clock: Callable[[], float] = time.monotonic,
                 counters: Counters | None = None) -> None:
        self.lanes: dict[tuple[str, str, bool], Lane] = {}
        self._waited = waited
        self._clock = clock
        self.counters = counters if counters is not None else Counters()

    def lane(self, limit: Limit | None) -> Lane | None:
        if limit is None:
            return None
        key = (limit.upstream, limit.label, limit.server)
        lane = self.lanes.get(key)
        if lane is None:
            if len(self.lanes) >= MAX_LANES:  # tool names come from clients: idle lanes go
                self.lanes = {k: v for k, v in self.lanes.items() if v.running or v.depth}
            lane = self.lanes[key] = Lane(limit, self._waited, self._clock)
        return lane

    def ticket(self, owner: str, *limits: Limit | None) -> Ticket | None:
        """A place under `limits` (the tool's, then the server's) for a call of `owner`;
        None when no limit applies; QueueFull when a lane it must wait in is full."""
        lanes = [lane for limit in limits if (lane := self.lane(limit)) is not None]
        if not lanes:
            return None
        for lane in lanes:  # only a call that would wait is refused (max_queue 0: none wait)
            if lane.busy and (lane.full or lane.over_share(owner)):
                self.counters.reject("queue_full")
                raise _full(lane.limit, lane.expected_wait_s(lane.depth))
        return Ticket(lanes, owner, self._clock)

    def depths(self) -> dict[tuple[str, str], int]:
        """(upstream, label) -> calls waiting: mcp_gateway_queue_depth."""
        depths: Counter[tuple[str, str]] = Counter()
        for lane in self.lanes.values():
            depths[lane.limit.upstream, lane.limit.label] += lane.depth
        return dict(depths)

    def status(self) -> list[dict[str, object]]:
        """For the status page: each lane's limit, running and waiting calls."""
        return [{"upstream": lane.limit.upstream, "tool": lane.limit.label,
                 "max_concurrency": lane.limit.max_concurrency,
                 "max_queue": lane.limit.max_queue, "running": lane.running,
                 "waiting": lane.depth,
                 "owners_waiting": len(lane.waiting)} for lane in self.lanes.values()]


def _full(limit: Limit, wait_s: float | None) -> QueueFull:
    label = limit.shown or limit.label
    what = "calls" if label == "*" else f"calls of '{label}'"
    return QueueFull(f"Queue full: at most {limit.max_concurrency} {what} run at once on "
                     f"upstream '{limit.upstream}' and {limit.max_queue} wait; retry later",
                     {"reason": "queue_full", "upstream": limit.upstream, "tool": label,
                      "maxConcurrency": limit.max_concurrency, "maxQueue": limit.max_queue,
                      "retryAfterMs": max(1, round((wait_s or 1.0) * 1000))})
