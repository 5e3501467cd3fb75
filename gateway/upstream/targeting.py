"""Where a message that belongs to no call goes, on one upstream link: never guessed. Pure.

A server-to-client request or a notification from a legacy upstream may name no call. The
rule (docs/architecture.md, Tenancy; docs/security.md, Isolation): a message that
names its task (the related-task `_meta`) goes to that task's owner; one that names nothing
goes to the one owner with calls in flight (its oldest call), or to the only attached owner
when nothing is in flight; otherwise to nobody (a guess could leak one user's data to
another): the correlator answers the upstream with an error, or drops the line (counted).

Generic over the correlator's calls and owners (as task_owners.py is), so that this module
needs nothing of correlator.py's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Generic, Protocol, TypeVar

from gateway.protocol import mcp
from gateway.protocol.jsonrpc import Message
from gateway.upstream.task_owners import TaskOwners


class Party(Protocol):
    """What targeting reads of an owner (correlator.py: Owner)."""

    @property
    def key(self) -> str: ...

    @property
    def principal(self) -> str: ...


PartyT = TypeVar("PartyT", bound=Party)
PartyT_co = TypeVar("PartyT_co", bound=Party, covariant=True)


class Held(Protocol[PartyT_co]):
    """What targeting reads of a call in flight (correlator.py: Call)."""

    @property
    def owner(self) -> PartyT_co | None: ...

    @property
    def waiting(self) -> bool: ...


class Hearers(Protocol[PartyT_co]):
    """What targeting reads of who hears the link (correlator.py: Audience)."""

    @property
    def owners(self) -> Mapping[str, PartyT_co]: ...

    def only_owner(self) -> PartyT_co | None: ...

    def recent(self) -> set[str]: ...


CallT = TypeVar("CallT", bound=Held[Any])


class Targeting(Generic[CallT, PartyT]):
    """The call (or owner) a message of no call can only be for, if any. It reads the
    correlator's calls in flight (oldest first), audience and task owners; it keeps none."""

    def __init__(self, in_flight: Mapping[int, CallT], audience: Hearers[PartyT],
                 tasks: TaskOwners[PartyT]) -> None:
        self.in_flight = in_flight
        self.audience = audience
        self.tasks = tasks

    def for_notification(self, msg: Message) -> CallT | PartyT | None:
        """A notification's one target: its task's owner, else the one owner it can be for."""
        return self.labelled(msg) or self.unlabelled()

    def for_request(self, msg: Message) -> CallT | PartyT | None:
        """A server request's one target: its task's owner when it names a task (and none
        when the gateway did not see that task created), else the one owner it can be for,
        unless another principal's task is live (that task may be the one asking)."""
        if related_task(msg) is not None:
            return self.labelled(msg)
        sole = self._sole()
        if sole is None or self.tasks.others_live(sole[1].principal):
            return None
        return sole[0]

    def labelled(self, msg: Message) -> CallT | PartyT | None:
        """Where a message that names its task (the related-task `_meta`, spec tasks
        2025-11-25) goes: that task's owner, on its oldest call in flight here, else its
        session if still attached; None for a task the gateway did not see created."""
        task_id = related_task(msg)
        record = self.tasks.record(task_id) if task_id is not None else None
        if record is None:
            return None
        owner = record.owner
        calls = [c for c in self.in_flight.values() if c.owner is owner]
        if calls:
            return next((c for c in calls if not c.waiting), calls[0])
        return owner if self.audience.owners.get(owner.key) is owner else None

    def unlabelled(self) -> CallT | PartyT | None:
        """The one owner a message that names nothing can be for: `_sole`'s, unless
        another principal's work may have said it (a task of its still live, or a call of
        its answered moments ago: a late line)."""
        sole = self._sole()
        if sole is None:
            return None
        target, owner = sole
        if self.tasks.others_live(owner.principal) or self.audience.recent() - {owner.principal}:
            return None
        return target

    def _sole(self) -> tuple[CallT | PartyT, PartyT] | None:
        """The call (or owner) an unlabelled upstream message can only belong to, with its
        owner, if any.

        Candidates are the calls in flight, oldest first; calls parked waiting for their
        client's input are left out while any other call runs (their tools are blocked on
        the answers they asked for). All candidates must share one owner (auth context or
        legacy session): across owners the gateway never guesses.
        """
        owned = [(c, o) for c in self.in_flight.values() if (o := c.owner) is not None]
        candidates = [pair for pair in owned if not pair[0].waiting] or owned
        if candidates:
            first, owner = candidates[0]  # dicts keep insertion order: the owner's oldest call
            return (first, owner) if all(o.key == owner.key for _, o in candidates) else None
        only = self.audience.only_owner()
        return None if only is None else (only, only)


def related_task(msg: Message) -> str | None:
    """The task a message names (the related-task `_meta`), if any."""
    params = msg.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    related = meta.get(mcp.RELATED_TASK) if isinstance(meta, dict) else None
    task_id = related.get("taskId") if isinstance(related, dict) else None
    return task_id if isinstance(task_id, str) else None
