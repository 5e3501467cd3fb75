"""This replica's hold on a shared task store: the first beat (and the tasks a previous
life of this replica left running, failed), a heartbeat every third of `store.lease_ms`
(which also reads again the watched tasks that run elsewhere, in case an announcement was
lost), the replicas' channels listened to, the store's state as this replica sees it (logged
when it changes, shown by /readyz and /status), and the lease given up at a clean stop.
With the memory store there is nothing to hold.

Each beat that reaches the store drains the outbox (what the store did not take while it
was away), beside the heartbeat. A beat that finds this replica's lease gone, after the
first, means the store lost what it held (restarted empty, failed over to a replica that
lagged) or was away a whole lease; so may a store that was away at all: the replica writes
back what it holds (`Outbox.rejoin`: put where missing, so harmless where nothing was
lost). Replicas (replicas.py) judges no other replica gone for a lease after
such a beat, or one that failed, so that they may do the same.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from gateway.errors import StoreUnavailable
from gateway.observability import log
from gateway.tasks.engine import TaskEngine
from gateway.tasks.replicas import Replicas
from gateway.tasks.store.outbox import Outbox

STOP_FLUSH_S = 2.0  # at a clean stop, for what waits in the outbox
PROBE_S = 0.5  # beats at least this often while the store is away or settling


class Lease:
    def __init__(self, engine: TaskEngine, replicas: Replicas | None, backend: str,
                 lease_ms: int, outbox: Outbox | None = None) -> None:
        self.engine = engine
        self.replicas = replicas  # None: one process, nothing to hold
        self.backend = backend
        self.lease_ms = lease_ms
        self.outbox = outbox
        self.store_up = True
        self.error: str | None = None
        self._recovered = replicas is None
        self._tasks: list[asyncio.Task[None]] = []  # the heartbeat, the channels
        self._writing: asyncio.Task[None] | None = None  # the outbox drained, records back
        self._rejoin_due = False
        self._marked_due: str | None = None  # the generation written back into, to say so
        self._wake = asyncio.Event()  # beat now: the store may have come back

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {"backend": self.backend, "up": self.store_up,
                               "replica": self.engine.replica,
                               "requests": 0 if self.outbox is None else self.outbox.requests}
        if self.error is not None:
            out["error"] = self.error
        if self.outbox is not None:
            out["outbox"] = {"changes": len(self.outbox), "bytes": self.outbox.held_bytes()}
        return out

    async def start(self) -> None:
        replicas = self.replicas
        if replicas is None:
            return  # one process: nothing to hold
        replicas.wake = self._wake.set
        # A store down at start: pass-through serves, /readyz says so.
        await self._beat(replicas)
        self._tasks = [asyncio.create_task(self._keep(replicas)),
                       asyncio.create_task(replicas.listen())]

    async def _keep(self, replicas: Replicas) -> None:
        while True:
            await self._pause(replicas)
            try:
                await self._beat(replicas)
                if self.store_up:
                    with contextlib.suppress(StoreUnavailable):
                        await replicas.poll()
            except Exception as exc:  # the heartbeat must outlive any one failure
                log.error("replica.heartbeat_failed", error=repr(exc))

    async def _pause(self, replicas: Replicas) -> None:
        """Until the next beat: a third of a lease; PROBE_S while the store is away (so
        that its return is seen within a second) or settling after it lost what it held
        (so that the others' write-back is heard soon); at once when woken (a connection
        to the store made again, or a read that found another generation)."""
        period = self.lease_ms / 3000
        if not self.store_up or replicas.generation.settling():
            period = min(period, PROBE_S)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), period)
        self._wake.clear()

    async def _beat(self, replicas: Replicas) -> None:
        try:
            held = await replicas.beat(self.lease_ms)
            if not self._recovered:
                failed = await replicas.recover()
                self._recovered = True
                # Nothing to write back at a start; said so, so that none waits for it.
                self._marked_due = replicas.generation.known
                log.info("replica.recovered", replica=self.engine.replica, tasks_failed=failed)
            elif not held or not self.store_up:
                # After an outage too: a beat that failed may have set the lease again on
                # a store that had lost it (its write got there, its acknowledgement not).
                self._rejoin_due = True
            self._write_back(replicas)
        except StoreUnavailable as exc:
            if self.store_up:
                log.error("store.unavailable", backend=self.backend, error=exc.detail)
            self.store_up, self.error = False, exc.detail  # operators only: /readyz?detail, /status
            return
        if not self.store_up:
            log.info("store.available", backend=self.backend)
        self.store_up, self.error = True, None

    def _write_back(self, replicas: Replicas) -> None:
        """Beside the heartbeat, which must stay on time whatever there is to write."""
        if self.outbox is not None and (self._writing is None or self._writing.done()):
            self._writing = asyncio.create_task(self._write(self.outbox, replicas))

    async def _write(self, outbox: Outbox, replicas: Replicas) -> None:
        """The store lost this replica's lease, so perhaps its records too: they are
        written back; then what waits in the outbox; then, once all is written, the others
        are told (they answer ids they cannot find with "retry" until then). Tried again
        at the next beat while the store does not take it."""
        with contextlib.suppress(StoreUnavailable):
            if self._rejoin_due:
                self._rejoin_due = False
                try:
                    restored = await outbox.rejoin(self.engine.running(ending=False))
                except StoreUnavailable:
                    self._rejoin_due = True
                    raise
                self._marked_due = replicas.generation.known or None
                log.warning("store.rejoined", replica=self.engine.replica, restored=restored)
            await outbox.flush()
            if self._marked_due is not None:
                await replicas.rejoined(self._marked_due)
                self._marked_due = None

    async def stop(self) -> None:
        """After the tasks' ends are written: others need not wait for the lease to lapse."""
        ours = [*self._tasks, *([self._writing] if self._writing else [])]
        for task in ours:
            task.cancel()
        if ours:  # bounded: a stop never hangs on a loop slow to see its cancellation (seen
            # once in a full test run: the store's listener held the stop past a minute)
            await asyncio.wait(ours, timeout=STOP_FLUSH_S)
        if self.outbox is not None and len(self.outbox):  # the last chance to write them
            with contextlib.suppress(StoreUnavailable, TimeoutError):
                await asyncio.wait_for(self.outbox.flush(), STOP_FLUSH_S)
        if self.replicas is not None:  # bounded too: a store whose name no longer resolves
            # (its container stopped first) held idle replicas' stops 10-40 s in compose
            with contextlib.suppress(StoreUnavailable, TimeoutError):
                await asyncio.wait_for(self.replicas.leave(), STOP_FLUSH_S)
