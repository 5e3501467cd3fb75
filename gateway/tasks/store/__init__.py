"""Where task records live: the `TaskStore` protocol every backend implements; and how
replicas sharing a store find each other: the `ReplicaBus` (a single process has none).

A store is pure storage (the MCP SDK's rule: no execution): it keeps copies of records, never
the engine's working objects, so the memory store and a shared one behave alike. It enforces
the bounds of `limits.*`, one contract for both:

- in all: tasks held (`max_tasks`), bytes of results and errors (`max_stored_bytes`);
- per principal (a task counts against `Task.counted_as`): its running tasks
  (`max_tasks_per_owner`), the tasks it holds, running and finished
  (`max_finished_tasks_per_owner`: a running task holds the place it will finish in), the
  bytes of its results (`max_stored_bytes_per_principal`);
- bytes of one result (`max_result_bytes`).

Where a creation or a result meets a bound, the principal's own finished tasks whose results
it has had (`read`) make room, the first read first; where they cannot, the creation is
refused (StoreFull) or the result (ResultTooLarge), and nothing is evicted. A running task,
a result nobody has read and another principal's task are never evicted: a returned handle
keeps its result until its ttl unless its owner has read it. An evicted id is unknown from
then on (not "expired": its ttl did not pass, and its owner has its result).

Status changes are compare-and-set against the transition table (model.py): a terminal
record stays terminal, whoever writes last. Whether a task has expired is the engine's
judgement (`Task.due`, by its clock): a store hands out what it holds, forgets finished tasks
past their ttl when the engine sweeps (or, on Redis, when the server drops the key
EXPIRED_MEMORY_S later), and never drops a running task (the engine ends it: cancels the
call, tells the watchers).

Replicas sharing a store each hold a lease on the bus (`beat`); a task records the replica
that runs it, and the running tasks of a replica whose lease has gone are `stranded`: the
engine fails them. Replicas tell each other of changes and requests through the bus's
channels (`publish`, `listen`). The memory store serves one process, whose tasks are all its
own: it has no bus.

    memory.py     the bounded embedded default (one process)
    shares.py     its per-principal counts (Redis keeps them in its scripts)
    redis.py      Redis or Valkey, shared by replicas
    redis_bus.py  their bus, over the same server
    outbox.py     in front of a shared store: what it did not take, kept
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from gateway.tasks.model import Task

if TYPE_CHECKING:
    from gateway.settings.schema import Limits

Handler = Callable[[str, dict[str, Any]], Awaitable[None]]  # channel, message
Bound = Literal["tasks", "running", "held", "share", "stored", "result"]  # StoreBounds.said
EVENTS = "events"  # the channel of task changes; each replica also has "ctl:<its id>"


@dataclass(frozen=True, slots=True)
class StoreBounds:
    """The bounds of `limits.*` a store enforces (the contract above), one value that
    either store takes whole. By default a principal may hold as many tasks as it may run,
    and its results may take the whole store's bytes."""

    max_tasks: int  # in all, running and finished
    max_per_owner: int  # a principal's running tasks (max_tasks_per_owner)
    max_result_bytes: int  # one result
    max_stored_bytes: int  # all results
    max_held_per_owner: int  # a principal's tasks, finished ones too
    max_bytes_per_owner: int  # a principal's results (max_stored_bytes_per_principal)

    @classmethod
    def given(cls, max_tasks: int, max_per_owner: int, max_result_bytes: int,
              max_stored_bytes: int, *, max_held_per_owner: int | None = None,
              max_bytes_per_owner: int | None = None) -> StoreBounds:
        return cls(max_tasks, max_per_owner, max_result_bytes, max_stored_bytes,
                   max_held_per_owner or max_per_owner, max_bytes_per_owner or max_stored_bytes)

    @classmethod
    def of(cls, limits: Limits) -> StoreBounds:
        """The bounds the settings' `limits` set."""
        return cls(limits.max_tasks, limits.max_tasks_per_owner, limits.max_result_bytes,
                   limits.max_stored_bytes, limits.max_finished_tasks_per_owner,
                   limits.max_stored_bytes_per_principal)

    def said(self, bound: Bound, size: int = 0) -> str:
        """Why a task (StoreFull) or a result (ResultTooLarge, `size` bytes) met `bound`,
        in the words both stores give."""
        match bound:
            case "tasks":
                return f"the gateway holds its maximum of {self.max_tasks} tasks"
            case "running":
                return f"this client holds its maximum of {self.max_per_owner} tasks running"
            case "held":
                return (f"this client holds its maximum of {self.max_held_per_owner} tasks, "
                        "none of them finished with its result read (a task whose result was "
                        "read makes room)")
            case "share":
                return (f"this client's share of the result storage "
                        f"({self.max_bytes_per_owner} bytes) is full")
            case "stored":
                return f"the gateway's result storage ({self.max_stored_bytes} bytes) is full"
            case "result":
                return (f"the result is {size} bytes; the gateway keeps at most "
                        f"{self.max_result_bytes} bytes per task")


class StoreFull(Exception):
    """No room for another task; the message says which bound was hit."""


class KeyBound(Exception):
    """A keyed task's key (`Task.key`) is bound to a task the store keeps: that one is the
    call's (tasks/keys.py), and no record was made."""

    def __init__(self, task_id: str) -> None:
        super().__init__(task_id)
        self.task_id = task_id


class ResultTooLarge(Exception):
    """A result or error over `max_result_bytes`, or beyond what all results may take."""


class TaskStore(Protocol):
    @property
    def requests(self) -> int:
        """Requests made to a store server so far (round trips; none for the memory
        store)."""

    async def create(self, task: Task) -> None:
        """Keep a new record, before anyone hears of its task, its principal's read tasks
        making room where they must; StoreFull when a bound is reached all the same (the
        message names it). A keyed task (`task.key`) binds its key in the same step;
        KeyBound (the task it names) when the key names a task still kept (not forgotten,
        its ttl not passed), checked before any bound. A key goes with its task: when the
        task is forgotten (evicted, swept, deleted) so is the key, and a record written
        back (`restore`, a snapshot) binds its key again where it is free."""

    async def get(self, task_id: str) -> Task | None:
        """A copy of the record as held, or None. Past its ttl too, for EXPIRED_MEMORY_S
        more (its result may be gone by then): the engine reads it as it lapsed, failed and
        saying so, so a client's poll loop ends on a terminal status."""

    async def owned_by(self, owner: str) -> list[Task]:
        """Copies of the owner's records, oldest first (past their ttl too, until
        forgotten)."""

    async def save(self, task: Task, *, keep: bool = True) -> bool:
        """Replace the record if the stored status may move to `task.status` (the same
        status included, for a new message or inputs); False when it may not (the stored
        one is terminal) or the record is gone. `keep=False`: a judgement made from a read
        (a replica gone), which a store with an outbox writes now or not at all, since the
        read may have been stale. ResultTooLarge when `task.size` bytes
        cannot be kept. A shared store announces the change to the other replicas (the
        events channel: `{"task": id, "from": replica}`, with the record where it is small:
        `live` or `end`) in the same round trip, as it announces a creation. Bytes over a
        bound are made room for as at creation."""

    async def read(self, task_id: str) -> None:
        """Its owner has had the result of `task_id`, finished (tasks/result answered, a
        tasks/get showed it): it may now leave before its ttl to make room for its
        principal's newer tasks, the first read first. Nothing for a running or unknown
        task; a shared store writes the mark once (at most a round trip a replica)."""

    async def restore(self, tasks: list[Task]) -> int:
        """Write `tasks` as they are where the store lacks them (a shared store that came
        back empty, or failed over to a replica that lagged), whatever the bounds: they were
        accepted already. How many it lacked (held ones, and those whose ttl passed, are
        left)."""

    def kept(self) -> list[Task]:
        """Copies of finished records this process keeps beside the store (read, written or
        announced lately), to write again where the store lost them."""

    async def delete(self, task_id: str) -> None:
        """Forget a record now (a task never handed out: its call could not be opened)."""

    async def sweep(self) -> int:
        """Finished tasks past their ttl leave the bounds (their records kept a while for
        `get`, without their results); how many went."""

    async def knows(self, task_id: str) -> bool:
        """Whether `task_id` is (or lately was) a task here, whoever owns it."""

    def holds(self, task_id: str) -> bool:
        """Whether a read of `task_id` is answered here with no round trip, from a record
        not forgotten since: every record of the memory store, a finished one a shared
        store keeps a copy of (a task evicted to make room is held by no one from then on:
        its kept answer goes with it, tasks/kept.py)."""

    def stored_bytes(self) -> int:
        """Bytes of results and errors held (for /readyz and metrics)."""

    async def close(self) -> None:
        """Let go of connections."""


@dataclass(frozen=True, slots=True)
class Beat:
    """What a beat learns of the store: whether this replica's lease was held, the store's
    generation (a random id written once: a store that came back empty has a new one), the
    replicas beating in this generation (until their lease ends) and those that wrote back
    what they hold into it (generation.py)."""

    held: bool
    generation: str
    peers: frozenset[str] = frozenset()
    rejoined: frozenset[str] = frozenset()


class ReplicaBus(Protocol):
    """Replicas sharing a store: their leases, the tasks a gone one left running, and the
    channels they tell each other on."""

    async def beat(self, replica: str, lease_ms: int, address: str = "", known: str = ""
                   ) -> Beat:
        """Hold (or renew) `replica`'s lease for `lease_ms`, telling where it is reached
        (for operators reading the store: no replica relays to an address read there, which
        anyone who can write to the store could change; issue 41);
        `held` False when the lease was not held (it lapsed, or the store lost it). The
        store's generation is written if it has none; where it is not `known` (the one
        this replica's last beat read), the store lost its records, and keyed creates wait
        until the replicas have written theirs back (generation.py)."""

    async def generation(self) -> str | None:
        """The store's generation as it is now (None: it has none, so it lost everything)."""

    async def rejoined(self, replica: str, generation: str, lease_ms: int) -> None:
        """`replica` has written back what it holds into `generation` (seen by the others'
        beats for a while)."""

    async def leave(self, replica: str) -> None:
        """Give the lease up (a clean stop, once its tasks are written)."""

    async def alive(self, replica: str) -> bool:
        """Whether `replica` holds its lease."""

    async def stranded(self, replica: str | None = None) -> list[str]:
        """Ids of tasks still running on `replica` (a previous life of this one, at start),
        or on any replica whose lease has gone."""

    async def publish(self, channel: str, message: dict[str, Any]) -> None:
        """Send `message` to every replica listening on `channel` (at most once: a replica
        that is not listening right then misses it)."""

    async def listen(self, channels: list[str], handler: Handler,
                     joined: Callable[[], None] | None = None) -> None:
        """Hand each message on `channels` to `handler`, until cancelled (reconnecting by
        itself); `joined()` at each subscription made again: the connection was lost, so
        the store may have restarted."""


__all__ = ["EVENTS", "Beat", "Handler", "KeyBound", "ReplicaBus", "ResultTooLarge",
           "StoreBounds", "StoreFull", "TaskStore"]
