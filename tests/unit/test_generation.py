"""The store's generations as one replica sees them (tasks/generation.py), with a fake
clock: a store that came back without its records makes ids not found answer "retry" until
every replica has beaten since and written back (or the grace has passed), and never for a
store that kept them."""

from __future__ import annotations

from gateway.tasks.generation import SETTLE_LEASES, Generation
from gateway.tasks.store import Beat

LEASE_MS = 3000  # a beat every second
BEAT_AND_A_HALF = 1.5


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def beat(generation: str, peers: set[str], rejoined: set[str] | None = None) -> Beat:
    return Beat(True, generation, frozenset(peers), frozenset(rejoined or ()))


def started(clock: Clock) -> Generation:
    """Replica b, which knows generation g1."""
    gen = Generation("b", clock)
    assert not gen.observe(beat("g1", {"a", "b"}, {"a", "b"}), LEASE_MS)
    return gen


def test_a_first_beat_and_a_store_that_kept_its_records_settle_nothing() -> None:
    clock = Clock()
    gen = started(clock)
    assert not gen.settling()
    clock.now += 0.3
    assert not gen.observe(beat("g1", {"a", "b", "c"}), LEASE_MS)  # c just started
    assert not gen.settling() and not gen.differs("g1")


def test_a_new_generation_settles_once_every_replica_beating_wrote_back() -> None:
    clock = Clock()
    gen = started(clock)
    assert gen.observe(beat("g2", {"b"}), LEASE_MS)  # the store lost what it held
    assert gen.settling()
    gen.wrote_back("g2")  # this replica's own records
    clock.now += 0.5
    gen.observe(beat("g2", {"a", "b", "c"}, {"b"}), LEASE_MS)
    assert gen.settling()  # a and c beat in g2, and have not written back yet
    gen.observe(beat("g2", {"a", "b", "c"}, {"a", "b"}), LEASE_MS)
    assert gen.settling()
    gen.observe(beat("g2", {"a", "b", "c"}, {"a", "b", "c"}), LEASE_MS)
    assert gen.settling()  # a replica yet to beat since the change may still come
    clock.now += BEAT_AND_A_HALF
    assert not gen.settling()  # by now every live replica has beaten since


def test_own_write_back_is_waited_for_too() -> None:
    clock = Clock()
    gen = started(clock)
    assert gen.observe(beat("g2", {"b"}), LEASE_MS)
    clock.now += BEAT_AND_A_HALF
    assert gen.settling()
    gen.wrote_back("g1")  # into the generation before: does not count
    assert gen.settling()
    gen.wrote_back("g2")
    assert not gen.settling()


def test_a_replica_that_stops_beating_is_not_waited_for() -> None:
    """A replica gone leaves the store's members at the end of its lease."""
    clock = Clock()
    gen = started(clock)
    gen.observe(beat("g2", {"a", "b"}), LEASE_MS)
    gen.wrote_back("g2")
    clock.now += BEAT_AND_A_HALF
    assert gen.settling()
    gen.observe(beat("g2", {"b"}), LEASE_MS)
    assert not gen.settling()


def test_a_replica_slow_to_write_back_is_waited_for_only_through_the_grace() -> None:
    clock = Clock()
    gen = started(clock)
    gen.observe(beat("g2", {"a", "b"}), LEASE_MS)  # a beats in g2, writes nothing back
    gen.wrote_back("g2")
    clock.now += BEAT_AND_A_HALF
    assert gen.settling()
    assert 0.1 <= gen.retry_after_s() <= 1.0
    clock.now = 100.0 + SETTLE_LEASES * LEASE_MS / 1000
    assert not gen.settling()  # bounded: unknown ids read "not found" again


def test_a_miss_that_reads_another_generation_starts_settling_before_any_beat() -> None:
    """Between the store's return and this replica's next beat, an id not found is
    checked against the store's generation, which a restart wiped (None) or replaced."""
    clock = Clock()
    gen = started(clock)
    assert not gen.differs("g1")
    assert gen.differs(None) and gen.differs("g2")
    gen.lost(LEASE_MS)
    assert gen.settling()
    assert gen.observe(beat("g2", {"a", "b"}), LEASE_MS)  # the next beat: a change, once
    gen.wrote_back("g2")
    gen.observe(beat("g2", {"a", "b"}, {"a", "b"}), LEASE_MS)
    clock.now += BEAT_AND_A_HALF
    assert not gen.settling()


def test_a_replica_that_never_beat_knows_no_generation_to_lose() -> None:
    gen = Generation("b", Clock())
    assert not gen.differs(None) and not gen.differs("g1")
    assert not gen.observe(beat("g1", {"b"}), LEASE_MS)
    assert not gen.settling()
