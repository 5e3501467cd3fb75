"""This replica among those sharing a task store, on their bus: its lease, and the tasks
that other replicas run or left behind.

A task records the replica that runs its call. Read elsewhere, a running task whose
replica's lease has gone is failed on the spot (and a sweeper fails the rest: the engine
writes those ends); requests about a task whose call runs on another replica (a cancel,
input answers) are sent there on its control channel. Every change a replica writes is
announced on the events channel, so that watchers on other replicas (listen streams) hear
of it. With the memory store every task is this process's own: there is no bus, and none
of this exists.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from gateway.errors import StoreUnavailable
from gateway.observability import log
from gateway.tasks.generation import Generation
from gateway.tasks.model import CANCELLED_BY_CLIENT, Status, Task
from gateway.tasks.store import EVENTS, ReplicaBus, TaskStore

STRANDED = "the gateway replica running this task stopped"


Strand = Callable[[Task], Awaitable[Task]]  # the engine ends a task whose replica is gone


class Here(Protocol):
    """What this replica's side of the tasks offers the bus (tasks/local.py `Local`)."""

    def holds(self, task_id: str) -> bool:
        """Whether the task's call runs here."""

    def working(self, task_id: str) -> bool:
        """Whether the task's call runs here and no end is being written."""

    async def stop(self, task_id: str, status: Status, why: str) -> Task | None:
        """End the task whose call runs here."""

    def answer(self, task_id: str, responses: dict[str, Any]) -> bool:
        """Answers to the inputs of the task whose call runs here."""

    def watching(self, task_id: str) -> bool:
        """Whether someone here watches the task."""

    def watched(self) -> list[str]:
        """The ids of the tasks someone here watches."""

    def tell(self, task: Task) -> None:
        """A change made elsewhere, told to the task's watchers here."""


class Replicas:
    def __init__(self, bus: ReplicaBus, store: TaskStore, replica: str, url: str,
                 here: Here, *, strand: Strand) -> None:
        self.bus = bus
        self.store = store
        # The tasks whose calls run here, and their watchers; requests from other replicas
        # about those tasks are carried out there.
        self._here = here
        self.strand = strand  # the engine's: only it ends tasks (whose replica is gone)
        self.replica = replica
        self.url = url  # where the other replicas reach this one (replica.url)
        self._told: dict[str, float] = {}  # watched tasks run elsewhere: last change told
        # Monotonic times: other replicas are judged gone only from _judge_from, and only
        # until _fresh_until (while this replica's own beats get through).
        self._judge_from = 0.0
        self._fresh_until = 0.0
        self._beaten = False  # a beat got through since the last one that failed
        self._started = False
        self.generation = Generation(replica)  # the store's, and whether it has settled
        self._lease_ms = 10_000  # as the last beat held it
        self.wake: Callable[[], None] = _nothing  # the lease keeper's: beat now
        # Announcements of other kinds than task changes (a legacy session ended), heard
        # by whoever holds what they name (downstream/session_life.py).
        self._hearers: dict[str, list[Callable[[str], Awaitable[None]]]] = {}

    def defer_judgement(self, lease_ms: int) -> None:
        """The store was away, or lost the leases: every replica gets a full lease to
        hold its lease again (and write back what the store lost) before its tasks are
        taken for stranded; a live replica's result must not lose to "it stopped"."""
        self._judge_from = time.monotonic() + lease_ms / 1000

    def _judging(self) -> bool:
        """A replica whose own heartbeat is not getting through (the store hangs, or fails
        over) cannot tell a gone replica from one whose beats do not get through either."""
        return self._judge_from <= time.monotonic() < self._fresh_until

    async def unless_stranded(self, task: Task) -> Task:
        """`task` as read; failed first if the replica that ran it is gone."""
        if task.terminal or task.replica in ("", self.replica) or not self._judging() or \
                await self.bus.alive(task.replica):
            return task
        return await self.strand(task)

    # -- channels ---------------------------------------------------------------------------
    async def forward(self, task: Task, request: dict[str, Any]) -> None:
        """A request about a task another replica runs, sent to that replica."""
        await self.bus.publish(f"ctl:{task.replica}", {**request, "task": task.id})

    async def listen(self) -> None:
        """Until cancelled: changes made elsewhere, and requests for tasks run here. Each
        subscription made (again) wakes the lease keeper: a connection that came back may
        be to a store that restarted."""
        await self.bus.listen([EVENTS, f"ctl:{self.replica}"], self._heard,
                              lambda: self.wake())

    async def tell_ended(self, task: Task) -> None:
        """The end of a task whose record is not in the store (a keyed task whose call
        never started), told whole to watchers elsewhere, as an end is announced."""
        await self.bus.publish(EVENTS, {"task": task.id, "end": task.record(),
                                        "from": self.replica})

    def on_announced(self, kind: str, hear: Callable[[str], Awaitable[None]]) -> None:
        """`hear(key)` at each `announce(kind, key)` of any replica, this one's included."""
        self._hearers.setdefault(kind, []).append(hear)

    async def announce(self, kind: str, key: str) -> None:
        """Tell every replica now that `key` of `kind` changed. A replica that misses it
        (its connection was down) learns it later from the store's records, as it would
        without the announcement; StoreUnavailable when the store is down."""
        await self.bus.publish(EVENTS, {"op": kind, "key": key, "from": self.replica})

    async def _heard(self, channel: str, msg: dict[str, Any]) -> None:
        task_id = msg.get("task")
        if not isinstance(task_id, str):
            await self._announced(channel, msg)
            return
        if channel != EVENTS:
            await self._control(task_id, msg)
        elif msg.get("from") != self.replica and not self._here.holds(task_id) and \
                self._here.watching(task_id):
            with contextlib.suppress(StoreUnavailable):
                await self._read_again(task_id)

    async def _announced(self, channel: str, msg: dict[str, Any]) -> None:
        """An announcement of another kind than a task's change, to those who hear it."""
        key = msg.get("key")
        if channel != EVENTS or not isinstance(key, str):
            return
        for hear in self._hearers.get(str(msg.get("op")), []):
            await hear(key)

    async def poll(self) -> None:
        """The fallback for announcements lost while a connection was down: watched tasks
        that run elsewhere are read again (each heartbeat), and told if they changed."""
        self._told = {i: t for i, t in self._told.items() if self._here.watching(i)}
        for task_id in self._here.watched():
            if not self._here.holds(task_id):
                await self._read_again(task_id)

    async def _read_again(self, task_id: str) -> None:
        task = await self.store.get(task_id)
        if task is not None and task.updated_at > self._told.get(task_id, 0.0):
            self._told[task_id] = task.updated_at
            self._here.tell(task)

    async def recover(self) -> int:
        """At start: tasks a previous life of this replica left running are failed."""
        return await self._fail(await self.bus.stranded(self.replica), self.replica)

    async def _fail(self, ids: list[str], mine: str | None = None) -> int:
        """Each of `ids` whose record (sealed: vault.py) says it runs on a gone replica, or
        on `mine`, a previous life of this one. The run sets that listed them are the
        store's, which anyone with its password may write: a running task put in a gone
        replica's set is not failed for it."""
        failed = 0
        for task_id in ids:
            task = await self.store.get(task_id)
            if task is None or task.terminal or self._here.holds(task_id) or \
                    not await self._left(task, mine):
                continue
            failed += (await self.strand(task)).status is Status.FAILED
        return failed

    async def _left(self, task: Task, mine: str | None) -> bool:
        """Whether `task`'s record names `mine`, or (without it) a replica that is gone."""
        if mine is not None:
            return task.replica == mine
        return task.replica not in ("", self.replica) and not await self.bus.alive(task.replica)

    async def fail_stranded(self) -> int:
        """Tasks of replicas whose lease has gone are failed."""
        if not self._judging():
            return 0
        return await self._fail(await self.bus.stranded())

    async def beat(self, lease_ms: int) -> bool:
        """Renew this replica's lease (a shared store); False when the store did not hold
        it (a first beat, a lapse, or a store that lost its data: a new generation);
        StoreUnavailable when the store is down. After a beat that failed, or found the
        lease gone, others are not judged for a lease."""
        try:
            # A beat slower than a lease is no beat: others take this replica for gone.
            beat = await asyncio.wait_for(self.bus.beat(
                self.replica, lease_ms, self.url, self.generation.last), lease_ms / 1000)
        except Exception as exc:  # any failed beat: this replica cannot judge others
            self._beaten, self._fresh_until = False, 0.0
            if isinstance(exc, TimeoutError):
                raise StoreUnavailable("a heartbeat took longer than a lease") from exc
            raise
        now = time.monotonic()
        self._lease_ms = lease_ms
        new = self.generation.observe(beat, lease_ms)  # a store that lost its records
        if new:
            log.warning("store.generation_changed", replica=self.replica)
        held = beat.held and not new
        if self._started and not (held and self._beaten):
            self.defer_judgement(lease_ms)
        self._started = self._beaten = True
        self._fresh_until = now + lease_ms / 2000  # a beat and a half, a third apart
        return held

    # -- the store's generation (generation.py) ---------------------------------------------
    async def unsettled(self) -> bool:
        """Whether a task id not found now may be a live task that its replica has not
        written back yet: the store lost what it held lately (a new generation) and the
        write-back has not settled; or the store's generation, read now, is not the one
        the last beat saw (it lost everything since: settling starts, and the lease keeper
        beats at once). StoreUnavailable when the store does not answer."""
        if self.generation.settling():
            return True
        if not self.generation.differs(await self.bus.generation()):
            return False
        self.generation.lost(self._lease_ms)
        self.wake()
        return True

    async def rejoined(self, generation: str) -> None:
        """This replica has written back what it held into `generation`: the others stop
        waiting for it."""
        await self.bus.rejoined(self.replica, generation, self._lease_ms)
        self.generation.wrote_back(generation)

    async def leave(self) -> None:
        """A clean stop, once this replica's tasks are written: the lease goes at once."""
        await self.bus.leave(self.replica)
        await self.store.close()

    async def _control(self, task_id: str, msg: dict[str, Any]) -> None:
        """Another replica's request about a task whose call runs here."""
        if not self._here.working(task_id):
            return
        if msg.get("op") == "cancel":
            await self._here.stop(task_id, Status.CANCELLED,
                                  str(msg.get("why") or CANCELLED_BY_CLIENT))
        elif msg.get("op") == "answer" and isinstance(msg.get("responses"), dict):
            self._here.answer(task_id, msg["responses"])



def _nothing() -> None:
    pass
