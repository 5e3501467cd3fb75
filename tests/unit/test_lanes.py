"""Concurrency limits and their fair queues (gateway/queues.py), with a fake clock."""

from __future__ import annotations

import pytest

from gateway.errors import QueueFull
from gateway.observability.metrics import Metrics
from gateway.queues import Limit, Queues, Ticket
from gateway.tasks.policy import queued_poll_ms


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def told(ticket: Ticket) -> list[int | None]:
    heard: list[int | None] = []
    ticket.on_move = heard.append
    return heard


def test_calls_beyond_the_limit_wait_and_run_in_turn() -> None:
    queues = Queues()
    limit = Limit("main", "render*", 1, 10)
    first = queues.ticket("a", limit)
    assert first is not None and not first.queued
    second = queues.ticket("a", limit)
    assert second is not None and second.queued and second.ahead == 0
    heard = told(second)
    first.release()
    assert not second.queued and heard == [None]
    assert queues.depths() == {("main", "render*"): 0}


def test_one_owners_burst_does_not_starve_anothers_single_call() -> None:
    queues = Queues()
    limit = Limit("main", "*", 1, 100)
    running = queues.ticket("burst", limit)
    waiting = {f"burst{i}": queues.ticket("burst", limit) for i in range(5)}
    waiting["single"] = queues.ticket("single", limit)
    # The lane takes owners in turn: the burst's first call, then the single one.
    assert {name: t.ahead for name, t in waiting.items() if t} == {
        "burst0": 0, "single": 1, "burst1": 2, "burst2": 3, "burst3": 4, "burst4": 5}
    order: list[str] = []
    for name, ticket in waiting.items():
        assert ticket is not None
        ticket.on_move = lambda ahead, name=name: None if ahead is not None else order.append(name)
    assert running is not None
    running.release()
    while len(order) < len(waiting):
        ran = waiting[order[-1]]
        assert ran is not None
        ran.release()
    assert order == ["burst0", "single", "burst1", "burst2", "burst3", "burst4"]


def test_the_place_is_told_as_the_queue_moves_and_a_cancelled_call_leaves() -> None:
    queues = Queues()
    limit = Limit("main", "t", 1, 10)
    running = queues.ticket("a", limit)
    waiting = [queues.ticket(owner, limit) for owner in "bcd"]
    last = waiting[2]
    assert last is not None and running is not None
    heard = told(last)
    assert waiting[0] is not None
    waiting[0].release()  # cancelled while queued: never runs
    assert heard == [1] and queues.depths()[("main", "t")] == 2
    running.release()
    assert heard == [1, 0]


def test_a_full_queue_refuses_at_once_naming_the_limit() -> None:
    queues = Queues()
    limit = Limit("main", "render*", 1, 2)
    tickets = [queues.ticket("a", limit) for _ in range(3)]
    assert all(t is not None for t in tickets)
    with pytest.raises(QueueFull) as caught:
        queues.ticket("b", limit)
    err = caught.value
    assert "at most 1 calls of 'render*' run at once" in err.message
    assert err.data["maxQueue"] == 2 and err.data["retryAfterMs"] >= 1
    assert err.to_message(7)["error"]["code"] == -32000 and err.http_status == 503


def test_a_call_under_both_limits_waits_for_its_tool_then_its_server() -> None:
    queues = Queues()
    tool, server = Limit("main", "render", 1, 10), Limit("main", "*", 2, 10)
    other = queues.ticket("a", None, server)
    rendering = queues.ticket("a", tool, server)
    assert other is not None and rendering is not None and not rendering.queued
    third = queues.ticket("b", tool, server)  # waits for the tool's lane
    assert third is not None and third.lane is queues.lane(tool)
    fourth = queues.ticket("c", None, server)  # the server is full: waits there
    assert fourth is not None and fourth.lane is queues.lane(server)
    rendering.release()  # its tool slot goes to `third`; its server slot to `fourth`,
    assert not fourth.queued and third.lane is queues.lane(server)  # there first
    other.release()
    assert not third.queued


def test_no_limit_no_ticket_and_the_expected_wait_follows_run_times() -> None:
    clock = Clock()
    queues = Queues(clock=clock)
    assert queues.ticket("a", None, None) is None
    limit = Limit("main", "t", 2, 10)
    for _ in range(2):
        t = queues.ticket("a", limit)
        assert t is not None
        clock.now += 4
        t.release()
    lane = queues.lane(limit)
    assert lane is not None and lane.expected_wait_s(3) == pytest.approx(8.0)


def test_queue_wait_is_reported_when_a_call_leaves_the_queue() -> None:
    clock = Clock()
    waited: list[tuple[str, str, float]] = []
    queues = Queues(lambda u, label, s: waited.append((u, label, s)), clock)
    limit = Limit("main", "t", 1, 10)
    running = queues.ticket("a", limit)
    queues.ticket("b", limit)
    clock.now += 3
    assert running is not None
    running.release()
    assert waited == [("main", "t", 3.0)]


def test_a_queued_task_is_polled_as_its_expected_wait_says() -> None:
    """Half the expected wait, never sooner than configured, at most 30 s (issue 21)."""
    assert queued_poll_ms(500, None) == 500  # nothing ran yet: as configured
    assert queued_poll_ms(500, 0.2) == 500
    assert queued_poll_ms(500, 4.0) == 2000
    assert queued_poll_ms(500, 600.0) == 30_000


def test_lanes_of_idle_tool_names_are_forgotten_and_a_server_lane_stands_apart(
        monkeypatch) -> None:
    """Tool names come from clients: beyond MAX_LANES, lanes with nothing running or
    waiting are forgotten (busy ones stay); a pattern "*" is not the server's own limit."""
    monkeypatch.setattr("gateway.queues.MAX_LANES", 3)
    queues = Queues()
    busy = queues.ticket("a", Limit("main", "busy", 1, 5))
    for name in ("x", "y"):
        done = queues.ticket("a", Limit("main", name, 1, 5))
        assert done is not None
        done.release()
    queues.ticket("a", Limit("main", "new", 1, 5))
    assert busy is not None and {k[1] for k in queues.lanes} == {"busy", "new"}
    server, pattern = Limit("main", "*", 1, 5, server=True), Limit("main", "*", 3, 5)
    assert queues.lane(server) is not queues.lane(pattern)


def test_queue_metrics_name_limits_by_bounded_labels() -> None:
    metrics = Metrics(lambda _u, tool: tool == "listed", named={"render*"})
    assert [metrics.lane("main", label) for label in ("*", "render*", "listed", "made-up")] == [
        "*", "render*", "listed", "other"]


def test_one_owner_leaves_a_quarter_of_the_queue_to_the_others() -> None:
    """Before: one principal's burst filled the queue, and another's single call was
    refused (a review with one valid token)."""
    queues = Queues()
    limit = Limit("main", "sleep", 1, 8)
    running = queues.ticket("bob", limit)
    bobs = [queues.ticket("bob", limit) for _ in range(6)]  # 8 - 8 // 4 = 6 may wait
    assert running is not None and all(t is not None and t.queued for t in bobs)
    with pytest.raises(QueueFull):
        queues.ticket("bob", limit)
    alices = [queues.ticket("alice", limit) for _ in range(2)]  # the quarter kept for others
    assert all(t is not None and t.queued for t in alices)
    with pytest.raises(QueueFull):
        queues.ticket("carol", limit)  # the queue itself is full now


def test_max_queue_zero_runs_what_fits_and_lets_none_wait() -> None:
    """Issue 48: `max_queue` is how many may wait; 0 refused every call, the first too."""
    queues = Queues()
    limit = Limit("main", "render*", 2, 0)
    first, second = queues.ticket("a", limit), queues.ticket("b", limit)
    assert first is not None and not first.queued
    assert second is not None and not second.queued
    with pytest.raises(QueueFull):
        queues.ticket("c", limit)
    first.release()
    third = queues.ticket("c", limit)
    assert third is not None and not third.queued
