"""The shared store's generations as one replica sees them: whether the store came back
without what it held, and until when a task id it cannot find may still be a live task that
its replica has not written back yet.

A generation is a random id written once into the store (SET NX, never expiring) by the
first beat that finds none: a store that comes back empty (restarted without persistence)
has none, so the next beat writes a new one and every replica that knew the old one sees
the change (`Beat.generation`). A change means the store lost the records; each replica
writes back what it holds (lease.py) and then says so in the store (`Beat.rejoined`; so
does a replica at its start, with nothing to write back).

Until that has settled, an id not found answers "unavailable, retry", never "not found"
(docs/replicas.md: "Task not found" is what a client gets for a task that will never
exist, and a poller gives up on it). Settled once a beat and a half has passed since the
change was seen (every replica alive beats at least every third of a lease, so by then each
has beaten in the new generation: `Beat.peers`), and every replica beating in it has
written back; and in any case SETTLE_LEASES leases after the change was seen (a bounded
grace: a replica too slow to write back does not keep every unknown id unanswered). A
replica that stops beating leaves `peers` at the end of its lease.

Pure: no I/O; the clock is injectable.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gateway.tasks.store import Beat

SETTLE_LEASES = 2  # the grace, in leases, after which unknown ids read "not found" again
UNKNOWN = ""  # the generation after a miss showed a new one, before a beat names it


class Generation:
    def __init__(self, replica: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.replica = replica
        self.clock = clock
        self.known: str | None = None  # None: no beat has reached the store yet
        self.last = ""  # the generation the last beat read (never UNKNOWN), told to the next
        self._pending: frozenset[str] = frozenset()  # beating, not written back
        self._wrote_back = True  # this replica's own write-back, since the last change
        self._floor = 0.0  # until every live replica has beaten since the change
        self._until = 0.0  # the end of the grace

    def observe(self, beat: Beat, lease_ms: int) -> bool:
        """A beat's answer; True when it shows a new generation (the store lost what it
        held: this replica's records are to be written back)."""
        new = self.known is not None and beat.generation != self.known
        if new and self.known != UNKNOWN:
            self.lost(lease_ms)
        self.known = self.last = beat.generation
        self._pending = beat.peers - beat.rejoined - {self.replica}
        return new

    def lost(self, lease_ms: int) -> None:
        """The store lost what it held (seen by a beat, or by a miss that read another
        generation, or none): settling starts."""
        now = self.clock()
        self._wrote_back = False
        self._floor = now + 1.5 * lease_ms / 3000
        self._until = now + SETTLE_LEASES * lease_ms / 1000
        if self.known is not None:
            self.known = UNKNOWN

    def differs(self, generation: str | None) -> bool:
        """Whether the store's generation, as read now, is not the one this replica knows
        (None: the store has none, so it lost everything since the last beat)."""
        return self.known is not None and generation != self.known

    def wrote_back(self, generation: str) -> None:
        """This replica wrote back what it holds into `generation`."""
        if generation == self.known:
            self._wrote_back = True

    def settling(self) -> bool:
        """Whether an id not found may still be a live task about to be written back."""
        now = self.clock()
        if now >= self._until:
            return False
        return now < self._floor or not self._wrote_back or bool(self._pending)

    def retry_after_s(self) -> float:
        """When to ask again: a second, or the rest of the grace if shorter."""
        return max(0.1, min(1.0, self._until - self.clock()))


__all__ = ["SETTLE_LEASES", "Generation"]
