"""Pusher: each task status the report tells it, queued for the operator's endpoints it
fires and, at its end, for the webhook its client asked for (client.py); delivered by a
few workers per operator's endpoint, so that a slow or dead receiver holds only its own,
and by CLIENT_WORKERS for every client's (a client's slow receiver delays other clients'
pushes, never an operator's, a call or a task). Calls and tasks never wait on it: `told`
only queues (docs/push.md). What is pending is pending.py's: this process's, or the shared
store's, which any replica delivers from.

Bounded (docs/limits.md): MAX_PENDING deliveries in all, MAX_PENDING_PER_OWNER of one
principal's tasks; past them a status is not pushed (counted as `dropped`, logged).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from gateway.errors import StoreUnavailable
from gateway.observability import log, owner_hash
from gateway.observability.metrics import Metrics
from gateway.push.endpoint import Delivery, Endpoint, Target
from gateway.push.pending import MemoryPending, Pending
from gateway.push.schedule import Answer, next_wait
from gateway.push.sender import Sender
from gateway.settings.schema import Webhook
from gateway.tasks.dialects.webhook import event, webhook_id
from gateway.tasks.model import Task

MAX_PENDING = 10_000
MAX_PENDING_PER_OWNER = 1_000
WORKERS = 4  # deliveries in flight to one operator's endpoint at most
CLIENT_WORKERS = 8  # deliveries in flight to clients' webhooks at most, all together
CLIENT_SLOTS = 2  # of them, those of one principal's tasks (fair share of the clients' lane)
STORE_DOWN = (StoreUnavailable, ConnectionError, OSError)


class Pusher:
    def __init__(self, webhooks: list[Webhook], metrics: Metrics,
                 pending: Pending | None = None, clock: Callable[[], float] = time.time
                 ) -> None:
        self.endpoints = [Endpoint(conf) for conf in webhooks]
        self.clients = Endpoint()  # the lane of clients' own webhooks
        self.pending = pending or MemoryPending(MAX_PENDING, MAX_PENDING_PER_OWNER, clock)
        self._metrics = metrics
        self._clock = clock
        self._loops: list[asyncio.Task[None]] = []
        self._jobs: set[asyncio.Task[Any]] = set()  # puts and attempts under way
        self._trying: dict[int, tuple[Endpoint, Delivery]] = {}  # attempts under way
        self._sender = Sender(clock)
        self._held = 0  # as last counted (a gauge)

    # -- from the engine's report -------------------------------------------------------------
    def told(self, task: Task, message: str | None) -> None:
        """`task`'s status, written: queued for every lane it fires (`message`: its status
        message as it may be shown). Never raises: it runs on a task's end path."""
        try:
            self._told(task, message)
        except Exception as exc:  # a push never costs a task its end
            log.error("webhook.attempt_failed", task=task.id[:8], error=repr(exc))

    def _told(self, task: Task, message: str | None) -> None:
        lanes: list[tuple[Endpoint, Target | None]] = [
            (e, None) for e in self.endpoints if e.wants(task)]
        if task.push is not None and task.terminal:  # its client's own, for its end
            hook = task.push
            lanes.append((self.clients, Target(hook["url"], hook["secret"],
                                               guarded=not hook.get("exempt"))))
        if not lanes:
            return
        now = self._clock()
        body, wid, owner = event(task, message, now), webhook_id(task.id, str(task.status)), \
            owner_hash(task.owner)
        for lane, target in lanes:
            self._spawn(self._put(lane, Delivery(now, 0, wid, body, owner, now,
                                                 target=target), task.id))

    async def _put(self, lane: Endpoint, delivery: Delivery, task_id: str) -> None:
        try:
            kept = await self.pending.put(lane.lane, delivery)
        except STORE_DOWN as exc:
            kept = False
            log.warning("webhook.store_unavailable", endpoint=lane.label, error=repr(exc))
        if not kept:
            self._metrics.webhook_delivered(lane.label, "dropped")
            log.warning("webhook.dropped", endpoint=lane.label, task=task_id[:8],
                        owner=delivery.owner)
            return
        lane.woken.set()

    # -- delivering ---------------------------------------------------------------------------
    async def start(self) -> None:
        await self._sender.start()
        self._loops = [asyncio.create_task(self._lane(e, WORKERS), name="webhooks")
                       for e in self.endpoints]
        self._loops.append(asyncio.create_task(self._lane(self.clients, CLIENT_WORKERS),
                                               name="webhooks"))

    async def close(self) -> None:
        """Stop; what was being tried is handed back, due now (to another replica with a
        shared store: a stopping gateway leaves its deliveries to the others)."""
        for loop in self._loops:
            loop.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)
        trying = list(self._trying.values())
        for job in list(self._jobs):
            job.cancel()
        await asyncio.gather(*self._jobs, return_exceptions=True)
        for endpoint, delivery in trying:
            delivery.due = self._clock()
            with contextlib.suppress(*STORE_DOWN):
                await self.pending.again(endpoint.lane, delivery)
        await self._sender.close()

    async def _lane(self, endpoint: Endpoint, workers: int) -> None:
        """Claim what is due for this lane, as workers are free; wait for more."""
        busy: set[asyncio.Task[None]] = set()
        owners: Counter[str] = Counter()  # deliveries in flight, by whose task
        while True:
            free = workers - len(busy)
            claimed: list[Delivery] = []
            if free > 0 and not endpoint.disabled:
                try:
                    claimed = await self.pending.claim(endpoint.lane, free)
                except STORE_DOWN as exc:
                    log.warning("webhook.store_unavailable", endpoint=endpoint.label,
                                error=repr(exc))
            for delivery in claimed:
                if endpoint.target is None and owners[delivery.owner] >= CLIENT_SLOTS:
                    # One principal's receivers take at most CLIENT_SLOTS of the clients'
                    # lane: the rest of its deliveries wait their turn (a second).
                    delivery.due = self._clock() + 1.0
                    await self.pending.again(endpoint.lane, delivery)
                    continue
                owners[delivery.owner] += 1
                job = self._spawn(self._deliver(endpoint, delivery))
                busy.add(job)
                job.add_done_callback(_freed(busy, endpoint, owners, delivery.owner))
            if claimed and len(claimed) == free:
                continue
            endpoint.woken.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(endpoint.woken.wait(),
                                       min(self.pending.wait_s(endpoint.lane), 60.0))

    async def _deliver(self, endpoint: Endpoint, delivery: Delivery) -> None:
        key = id(delivery)
        self._trying[key] = (endpoint, delivery)
        try:
            delivery.attempt += 1
            target = delivery.target or endpoint.target
            assert target is not None
            try:
                answer = await self._sender.post(target, delivery)
            except Exception as exc:  # a lane outlives any one delivery
                log.error("webhook.attempt_failed", endpoint=endpoint.label, error=repr(exc))
                answer = Answer("failed")
            del self._trying[key]
            await self._after(endpoint, delivery, answer)
        except STORE_DOWN as exc:  # its claim lapses: tried again then, here or elsewhere
            log.warning("webhook.store_unavailable", endpoint=endpoint.label, error=repr(exc))
        finally:
            self._trying.pop(key, None)

    async def _after(self, endpoint: Endpoint, delivery: Delivery, answer: Answer) -> None:
        now = self._clock()
        endpoint.last = (now, answer.outcome)
        if answer.outcome == "delivered":
            endpoint.delivered += 1
            self._metrics.webhook_delivered(endpoint.label, "delivered", now - delivery.since)
            await self.pending.done(endpoint.lane, delivery)
            return
        endpoint.failures += 1
        if answer.outcome == "gone" and delivery.target is None:
            await self._disable(endpoint, delivery)
            return
        if answer.outcome == "refused":
            log.warning("webhook.address_refused", audit=True, endpoint=endpoint.label,
                        webhook_id=delivery.id, reason="its host resolves to an address "
                        "that is not public, and no allowed prefix names it")
        # A lane disabled meanwhile (410 to another of its deliveries) keeps none.
        wait = None if answer.outcome in ("gone", "refused") or endpoint.disabled else \
            next_wait(delivery.attempt, answer)
        if wait is None:
            self._metrics.webhook_delivered(endpoint.label, answer.outcome
                                            if answer.outcome == "refused" else "abandoned")
            log.warning("webhook.abandoned", endpoint=endpoint.label, webhook_id=delivery.id,
                        attempts=delivery.attempt, status=answer.status)
            await self.pending.done(endpoint.lane, delivery)
            return
        self._metrics.webhook_delivered(endpoint.label, "failed")
        delivery.due = now + wait
        await self.pending.again(endpoint.lane, delivery)

    async def _disable(self, endpoint: Endpoint, delivery: Delivery) -> None:
        """410 Gone: the receiver says it wants no more (Standard Webhooks): none is sent
        to it until this gateway restarts; what was pending for it is given up."""
        endpoint.disabled = True
        self._metrics.webhook_delivered(endpoint.label, "gone")
        await self.pending.done(endpoint.lane, delivery)
        await self.pending.forget(endpoint.lane)  # due or not: none will be tried
        log.warning("webhook.disabled", audit=True, endpoint=endpoint.label,
                    reason="the receiver answered 410 Gone")

    def _spawn(self, job: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(job)
        self._jobs.add(task)
        task.add_done_callback(self._jobs.discard)
        return task

    # -- what operators see -------------------------------------------------------------------
    @property
    def held(self) -> int:
        """Deliveries not made yet (with a shared store: every replica's), as last counted
        (by `status`, which /readyz?detail and /metrics' scrapes ask)."""
        return self._held

    async def status(self) -> list[dict[str, Any]]:
        """Each lane: its label, whether it is disabled, its counts (pending: held in all
        for it, with a shared store every replica's) and its last attempt here."""
        out = []
        with contextlib.suppress(*STORE_DOWN):
            self._held = await self.pending.count()
        for e in [*self.endpoints, self.clients]:
            pending = None
            with contextlib.suppress(*STORE_DOWN):
                pending = await self.pending.count(e.lane)
            out.append({"endpoint": e.label, "disabled": e.disabled, "delivered": e.delivered,
                        "failures": e.failures, "pending": pending,
                        "last": None if e.last is None else {"at": e.last[0],
                                                             "outcome": e.last[1]}})
        return out


def _freed(busy: set[asyncio.Task[None]], endpoint: Endpoint, owners: Counter[str],
           owner: str) -> Callable[[asyncio.Task[None]], None]:
    """A lane's worker is free again: its loop may claim more."""
    def freed(job: asyncio.Task[None]) -> None:
        busy.discard(job)
        owners[owner] -= 1
        endpoint.woken.set()
    return freed


__all__ = ["MAX_PENDING", "MAX_PENDING_PER_OWNER", "Pusher"]
