"""The shared store's generations as one replica sees them: whether the store came back
without what it held, and until when a task id it cannot find may still be a live task that
its replica has not written back yet.

A generation is a random id written once into the store (SET NX, never expiring) by the
first beat that finds none: a store that comes back empty (restarted without persistence)
has none, so the next beat writes a new one and every replica that knew the old one sees
the change (`Beat.generation`). A change means the store lost the records; each replica
writes back what it holds (lease.py) and then says so in the store (`Beat.rejoined`).

Until that has settled, an id not found answers "unavailable, retry", never "not found"
(README, store incidents: "Task not found" is what a client gets for a task that will never
exist, and a poller gives up on it). Settled when this replica has written back, and every
other replica that held a lease before has written back too, or has not beaten in the new
generation by the end of its old lease (it is gone: the stranded-task rule fails its tasks
anyway); and in any case SETTLE_LEASES leases after the change was seen (a bounded grace:
a replica too slow to write back does not keep every unknown id unanswered).

Pure: no I/O; the clock is injectable.
"""

from __future__ import annotations

import math
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
        self._leases: dict[str, float] = {}  # replica -> when its lease ends, as last beaten
        self._waiting: dict[str, float] = {}  # replicas yet to write back -> wait until
        self._wrote_back = True  # this replica's own write-back, since the last change
        self._until = 0.0  # the end of the grace

    def observe(self, beat: Beat, lease_ms: int) -> bool:
        """A beat's answer; True when it shows a new generation (the store lost what it
        held: this replica's records are to be written back)."""
        now = self.clock()
        new = self.known is not None and beat.generation != self.known
        if new and self.known != UNKNOWN:
            self.lost(lease_ms)
        self.known = beat.generation
        self._leases = {r: now + left for r, left in beat.peers.items()}
        for peer in list(self._waiting):
            if peer in beat.rejoined:
                del self._waiting[peer]
            elif peer in beat.peers:  # alive in this generation: waited for, within the grace
                self._waiting[peer] = math.inf
        return new

    def lost(self, lease_ms: int) -> None:
        """The store lost what it held (seen by a beat, or by a miss that found another
        generation, or none): settling starts, waiting for the replicas alive before."""
        now = self.clock()
        self._waiting = {r: end for r, end in self._leases.items()
                         if r != self.replica and end > now}
        self._wrote_back = False
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
        return not self._wrote_back or any(end > now for end in self._waiting.values())

    def retry_after_s(self) -> float:
        """When to ask again: a second, or the rest of the grace if shorter."""
        return max(0.1, min(1.0, self._until - self.clock()))


__all__ = ["SETTLE_LEASES", "Generation"]
