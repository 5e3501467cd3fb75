"""Where a message of no call goes on one upstream link (upstream/targeting.py, pure): its
task's owner when it names one, the one owner it can only be for otherwise, and nobody
rather than a guess (docs/architecture.md, Tenancy)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.protocol import jsonrpc, mcp
from gateway.protocol.jsonrpc import Message
from gateway.upstream.targeting import Targeting, related_task
from gateway.upstream.task_owners import TaskOwners


@dataclass(frozen=True)
class Owner:
    key: str  # the session (or caller)
    principal: str


@dataclass
class Call:
    owner: Owner | None
    waiting: bool = False  # parked for its client's input


@dataclass
class Audience:
    owners: Mapping[str, Owner] = field(default_factory=dict)
    answered_lately: set[str] = field(default_factory=set)  # principals

    def only_owner(self) -> Owner | None:
        return next(iter(self.owners.values())) if len(self.owners) == 1 else None

    def recent(self) -> set[str]:
        return self.answered_lately


ALICE, ALICE_2, BOB = Owner("s1", "alice"), Owner("s2", "alice"), Owner("s3", "bob")


def link(*calls: Call, attached: tuple[Owner, ...] = (), tasks: dict[str, Owner] | None = None,
         recent: set[str] | None = None) -> Targeting[Call, Owner]:
    owners: TaskOwners[Owner] = TaskOwners(clock=lambda: 100.0)
    for task_id, owner in (tasks or {}).items():
        owners.note({"task": {"taskId": task_id, "ttl": 60_000}}, owner.principal, owner)
    audience = Audience({o.key: o for o in attached}, recent or set())
    return Targeting(dict(enumerate(calls)), audience, owners)


def notification(task_id: Any = None) -> Message:
    params: dict[str, Any] = {"level": "info", "data": "said"}
    if task_id is not None:
        params["_meta"] = {mcp.RELATED_TASK: {"taskId": task_id}}
    return jsonrpc.notification(mcp.LOG_MESSAGE, params)


def request(task_id: Any = None) -> Message:
    msg = jsonrpc.request(9, "elicitation/create", {"message": "name?"})
    if task_id is not None:
        msg["params"]["_meta"] = {mcp.RELATED_TASK: {"taskId": task_id}}
    return msg


def test_a_related_task_is_read_only_when_its_id_is_a_string() -> None:
    assert related_task(notification("t1")) == "t1"
    for odd in (7, ["t1"], {"id": "t1"}):
        assert related_task(notification(odd)) is None
    assert related_task(notification()) is None
    assert related_task({"jsonrpc": "2.0", "method": "x", "params": {"_meta": "no"}}) is None
    assert related_task({"jsonrpc": "2.0", "method": "x"}) is None


def test_a_message_naming_its_task_goes_to_that_owners_oldest_running_call() -> None:
    parked, running, later = Call(ALICE, waiting=True), Call(ALICE), Call(ALICE)
    targeting = link(Call(BOB), parked, running, later, tasks={"t1": ALICE})
    assert targeting.for_notification(notification("t1")) is running
    assert targeting.for_request(request("t1")) is running
    # Only parked calls of the owner: the oldest of them.
    assert link(parked, Call(BOB), tasks={"t1": ALICE}).labelled(notification("t1")) is parked


def test_a_named_task_with_no_call_here_goes_to_its_session_while_attached() -> None:
    assert link(tasks={"t1": ALICE}, attached=(ALICE, BOB)).labelled(notification("t1")) \
        is ALICE
    assert link(tasks={"t1": ALICE}, attached=(BOB,)).labelled(notification("t1")) is None


def test_a_request_naming_a_task_the_gateway_did_not_see_created_goes_nowhere() -> None:
    """Even with one owner in flight: the server names a task, and not one of hers."""
    assert link(Call(ALICE)).for_request(request("unknown")) is None


def test_a_notification_naming_an_unknown_task_goes_where_an_unlabelled_one_would() -> None:
    first = Call(ALICE)
    assert link(first, Call(ALICE)).for_notification(notification("unknown")) is first


def test_a_message_naming_nothing_goes_to_the_one_owner_in_flight_oldest_call_first() -> None:
    first, second = Call(ALICE), Call(ALICE)
    assert link(first, second).for_notification(notification()) is first
    assert link(first, second).for_request(request()) is first


def test_across_owners_nothing_is_guessed() -> None:
    """Two sessions of one principal are two owners: never guessed between either."""
    for other in (BOB, ALICE_2):
        targeting = link(Call(ALICE), Call(other))
        assert targeting.for_notification(notification()) is None
        assert targeting.for_request(request()) is None


def test_calls_parked_for_input_are_left_out_while_another_runs() -> None:
    """A parked call's tool waits for the answers it asked for: it is not the one talking."""
    running = Call(BOB)
    assert link(Call(ALICE, waiting=True), running).for_request(request()) is running
    parked = Call(ALICE, waiting=True)
    assert link(parked, Call(BOB, waiting=True)).for_request(request()) is None
    assert link(parked, Call(ALICE, waiting=True)).for_request(request()) is parked


def test_with_nothing_in_flight_only_a_sole_attached_owner_hears_it() -> None:
    assert link(attached=(ALICE,)).for_notification(notification()) is ALICE
    assert link(attached=(ALICE, BOB)).for_notification(notification()) is None
    assert link().for_notification(notification()) is None
    assert link(Call(None), attached=(ALICE,)).for_notification(notification()) is ALICE


def test_another_principals_live_task_or_late_answer_keeps_it_from_the_sole_owner() -> None:
    """A task of Bob's still at work, or a call of his answered moments ago, may be what
    said it: Alice does not get it."""
    mine = Call(ALICE)
    assert link(mine, tasks={"b1": BOB}).for_notification(notification()) is None
    assert link(mine, tasks={"b1": BOB}).for_request(request()) is None
    assert link(mine, recent={"bob"}).for_notification(notification()) is None
    # Her own live task, or her own late answers, change nothing.
    assert link(mine, tasks={"a1": ALICE}, recent={"alice"}).for_notification(
        notification()) is mine
