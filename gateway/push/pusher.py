"""Pusher: each task status the report tells it, queued for the operator's endpoints it
fires and, at its end, for the webhook its client asked for (client.py); delivered by a
few workers per operator's endpoint, so that a slow or dead receiver holds only its own,
and by CLIENT_WORKERS for every client's (a client's slow receiver delays other clients'
pushes, never an operator's, a call or a task). Calls and tasks never wait on it: `told`
only queues (docs/push.md).

Bounded (docs/limits.md): MAX_PENDING deliveries in all, MAX_PENDING_PER_OWNER of one
principal's tasks; past them a status is not pushed (counted as `dropped`, logged). With
the memory store the pending deliveries are this process's: a stop loses those not yet
delivered (the receiver still has tasks/get).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from gateway.observability import log, owner_hash
from gateway.observability.metrics import Metrics
from gateway.push.endpoint import Delivery, Endpoint, Target
from gateway.push.payload import event, webhook_id
from gateway.push.schedule import Answer, next_wait
from gateway.push.sender import Sender
from gateway.settings.schema import Webhook
from gateway.tasks.model import Task

MAX_PENDING = 10_000
MAX_PENDING_PER_OWNER = 1_000
WORKERS = 4  # deliveries in flight to one operator's endpoint at most
CLIENT_WORKERS = 8  # deliveries in flight to clients' webhooks at most, all together


class Pusher:
    def __init__(self, webhooks: list[Webhook], metrics: Metrics,
                 clock: Callable[[], float] = time.time) -> None:
        self.endpoints = [Endpoint(conf) for conf in webhooks]
        self.clients = Endpoint()  # the lane of clients' own webhooks
        self._metrics = metrics
        self._clock = clock
        self._owners: Counter[str] = Counter()  # pending deliveries by whose task
        self._pending = 0
        self._workers: list[asyncio.Task[None]] = []
        self._sender = Sender(clock)

    # -- from the engine's report -------------------------------------------------------------
    def told(self, task: Task, message: str | None) -> None:
        """`task`'s status, written: queued for every endpoint it fires (`message`: its
        status message as it may be shown)."""
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
            if self._pending >= MAX_PENDING or self._owners[owner] >= MAX_PENDING_PER_OWNER:
                self._metrics.webhook_delivered(lane.label, "dropped")
                log.warning("webhook.dropped", endpoint=lane.label, task=task.id[:8],
                            owner=owner, pending=self._pending)
                continue
            self._pending += 1
            self._owners[owner] += 1
            lane.queue(Delivery(now, 0, wid, body, owner, now, target=target))

    # -- delivering ---------------------------------------------------------------------------
    async def start(self) -> None:
        await self._sender.start()
        lanes = [(e, WORKERS) for e in self.endpoints] + [(self.clients, CLIENT_WORKERS)]
        self._workers = [asyncio.create_task(self._work(lane), name="webhook")
                         for lane, workers in lanes for _ in range(workers)]

    async def close(self) -> None:
        for worker in self._workers:
            worker.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        await self._sender.close()

    async def _work(self, endpoint: Endpoint) -> None:
        while True:
            delivery = await endpoint.next_due(self._clock)
            try:
                answer = await self._attempt(endpoint, delivery)
            except Exception as exc:  # a worker outlives any one delivery
                log.error("webhook.attempt_failed", endpoint=endpoint.label, error=repr(exc))
                answer = Answer("failed")
            self._after(endpoint, delivery, answer)

    async def _attempt(self, endpoint: Endpoint, delivery: Delivery) -> Answer:
        delivery.attempt += 1
        target = delivery.target or endpoint.target
        assert target is not None
        return await self._sender.post(target, delivery)

    def _after(self, endpoint: Endpoint, delivery: Delivery, answer: Answer) -> None:
        now = self._clock()
        endpoint.last = (now, answer.outcome)
        if answer.outcome == "delivered":
            endpoint.delivered += 1
            self._metrics.webhook_delivered(endpoint.label, "delivered", now - delivery.since)
            self._done(delivery)
            return
        endpoint.failures += 1
        if answer.outcome == "gone" and delivery.target is None:
            self._disable(endpoint, delivery)
            return
        wait = None if answer.outcome in ("gone", "refused") else \
            next_wait(delivery.attempt, answer)
        if answer.outcome == "refused":
            log.warning("webhook.address_refused", audit=True, endpoint=endpoint.label,
                        webhook_id=delivery.id, reason="its host resolves to an address "
                        "that is not public, and no allowed prefix names it")
        if wait is None:
            self._metrics.webhook_delivered(endpoint.label, "abandoned")
            log.warning("webhook.abandoned", endpoint=endpoint.label, webhook_id=delivery.id,
                        attempts=delivery.attempt, status=answer.status)
            self._done(delivery)
            return
        self._metrics.webhook_delivered(endpoint.label, "failed")
        delivery.due = now + wait
        endpoint.queue(delivery)

    def _disable(self, endpoint: Endpoint, delivery: Delivery) -> None:
        """410 Gone: the receiver says it wants no more (Standard Webhooks): none is sent
        to it until the gateway restarts; what was pending for it is given up."""
        endpoint.disabled = True
        self._metrics.webhook_delivered(endpoint.label, "gone")
        for dropped in [delivery, *endpoint.drop_all()]:
            self._done(dropped)
        log.warning("webhook.disabled", audit=True, endpoint=endpoint.label,
                    reason="the receiver answered 410 Gone")

    def _done(self, delivery: Delivery) -> None:
        self._pending -= 1
        self._owners[delivery.owner] -= 1
        if self._owners[delivery.owner] <= 0:
            del self._owners[delivery.owner]

    # -- what operators see -------------------------------------------------------------------
    @property
    def pending(self) -> int:
        return self._pending

    def status(self) -> list[dict[str, Any]]:
        """Each endpoint: its label, whether it is disabled, its counts and last attempt."""
        return [{"endpoint": e.label, "disabled": e.disabled, "delivered": e.delivered,
                 "failures": e.failures, "pending": e.pending,
                 "last": None if e.last is None else {"at": e.last[0], "outcome": e.last[1]}}
                for e in [*self.endpoints, self.clients]]


__all__ = ["MAX_PENDING", "MAX_PENDING_PER_OWNER", "Pusher"]
