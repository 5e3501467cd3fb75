"""The operator's routes: `/healthz`, `/readyz`, `/metrics` and `/status`.

`Admin` reads the live parts of the app (upstreams, eras, the task engine, the lease) and
answers for them; it changes nothing. Health probes are open and say nothing but whether
the gateway is up and ready; `/metrics`, `/status` and `/readyz?detail` show every owner's
live work, so the guard (downstream/boundary.py) lets operators alone reach them
(auth/operators.py; docs/security.md). While the app runs, `sampling` samples the counts
into the status page's history (observability/history.py) every `every_s`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import replace
from typing import Any

from aiohttp import web

from gateway.auth.authenticator import Named
from gateway.downstream.boundary import OPERATOR, Handler, json_response
from gateway.downstream.leases import Leases
from gateway.downstream.legacy import LegacyEra
from gateway.errors import AuthCause, Rejection
from gateway.observability import status_page
from gateway.observability.counters import Counters
from gateway.observability.history import EVERY_S, Figures, History
from gateway.observability.metrics import CONTENT_TYPE, Metrics
from gateway.push.pusher import Pusher
from gateway.queues import Queues
from gateway.tasks.engine import TaskEngine
from gateway.tasks.lease import Lease
from gateway.tasks.model import LIVE, Task
from gateway.tasks.policy import Unmatched
from gateway.upstream.isolation import Backend
from gateway.upstream.processes import Processes

SHOWN_TASKS = 50  # running tasks listed on /status (all are counted)


class Admin:
    def __init__(self, backends: dict[str, Backend], eras: list[LegacyEra],
                 engine: TaskEngine, lease: Lease, counters: Counters,
                 metrics: Metrics, queues: Queues, processes: Processes,
                 leases: Leases, every_s: float = EVERY_S, pusher: Pusher | None = None,
                 unmatched: Unmatched | None = None, named: Sequence[Named] = (),
                 tools_config: str = "") -> None:
        self.backends = backends
        self.lanes = queues
        self.eras = eras
        self.engine = engine
        self.lease = lease
        self.counters = counters
        self.metrics = metrics
        self.processes = processes
        self.leases = leases  # the calls in flight, and whether the gateway stops
        self.answers = leases.answers
        self.pusher = pusher  # the webhooks, if any
        self.unmatched = unmatched  # per-tool entries that match no listed tool
        self.named = named  # the static tokens given a name
        self.tools_config = tools_config  # the digest of the per-tool entries (policy.py)
        self.started = time.time()
        self.history = History(metrics.tool_calls, metrics.tool_duration, metrics.queue_wait,
                               time.monotonic(), every_s)
        metrics.watch(self)
        metrics.prepare()  # what /metrics needs, loaded now rather than at its first scrape

    def routes(self, app: web.Application, guarded: Callable[[Handler], Handler]) -> None:
        """Each behind the guard (`guarded`): it opens the probes and admits operators."""
        app.router.add_get("/healthz", guarded(self.healthz))
        app.router.add_get("/readyz", guarded(self.readyz))
        app.router.add_get("/metrics", guarded(self.exposition))
        app.router.add_get("/status", guarded(self.status))

    # -- routes ---------------------------------------------------------------------------
    async def healthz(self, _: web.Request) -> web.Response:
        return json_response({"status": "ok"})

    async def readyz(self, request: web.Request) -> web.Response:
        """200 when every upstream is initialized and the gateway is not stopping (from the
        stop signal on, 503: balancers take a draining replica out; stopping.py); the body
        says so and nothing else, but to an operator asking for the detail (`?detail`,
        which the guard admitted). A shared store's state is in the detail only: it is
        shared, so its outage would take every replica out of a balancer, and pass-through
        with them (docs/replicas.md)."""
        stopping = self.leases.stopping
        ready = not stopping and all(b.ready for b in self.backends.values())
        body: dict[str, Any] = {"ready": ready, "stopping": True} if stopping else {
            "ready": ready}
        if request.get(OPERATOR, False):
            body |= {"upstreams": {n: b.status() for n, b in self.backends.items()},
                     "tasks": {"running": len(self.engine.running()),
                               "stored_bytes": self.engine.stored_bytes()},
                     "calls": self.leases.status(), "processes": self.processes.status(),
                     "queues": self.lanes.status(),
                     "store": self.lease.status(), "tools_config": self.tools_config,
                     "counters": self.counters.shown()}
            if self.pusher is not None:
                body["webhooks"] = await self.pusher.status()
            if self.unmatched is not None and self.unmatched.found:
                body["tool_entries_unmatched"] = self.unmatched.found
        return json_response(body, 200 if ready else 503)

    async def exposition(self, _: web.Request) -> web.Response:
        return web.Response(body=self.metrics.exposition(),
                            headers={"Content-Type": CONTENT_TYPE})

    async def status(self, _: web.Request) -> web.Response:
        snapshot = self.snapshot()
        if self.pusher is not None:
            snapshot = replace(snapshot, webhooks=await self.pusher.status())
        if self.unmatched is not None and self.unmatched.found:
            snapshot = replace(snapshot, unmatched=dict(self.unmatched.found))
        page = status_page.render(snapshot)
        return web.Response(text=page, content_type="text/html", headers={
            "Cache-Control": "no-store",
            # Server-rendered and script-free: nothing on the page may load or run anything.
            "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'"})

    def snapshot(self) -> status_page.Snapshot:
        now = time.time()
        runs = sorted(self.engine.running(), key=lambda t: t.created_at)
        return status_page.Snapshot(
            replica=self.engine.replica, store=self.lease.status(), started=self.started,
            upstreams={n: b.status() for n, b in self.backends.items()},
            live=Counter((t.upstream, t.tool, str(t.status)) for t in runs),
            tasks=[(t.id, t.upstream, t.tool, str(t.status), now - t.created_at,
                    t.status_message or "") for t in runs[:SHOWN_TASKS]],
            failures=self.engine.failures(), queues=self.lanes.status(),
            sessions=self.sessions(), now=now, tools=self._tools(runs),
            span_s=self.history.span_s, charts=sorted(self.history.lines.items()),
            chart_s=self.history.samples * self.history.every_s, budgets=self._budgets(),
            principals=self._principals(runs))

    def _principals(self, runs: list[Task]) -> list[tuple[str, str, int, int]]:
        """Each named static token: its scopes, and what its principal holds here now."""
        held = Counter(t.counted_as for t in runs)
        return [(n.name, "every scope" if n.scopes is None else " ".join(sorted(n.scopes)),
                 held[n.owner], sum(era.sessions.held_by(n.owner) for era in self.eras))
                for n in self.named]

    def _tools(self, runs: list[Task]) -> list[tuple[str, str, Figures, int, int]]:
        """The tools table: each tool's (or limit's) figures of the last quarter of an hour,
        with its tasks live and calls queued now, under the metrics' labels (bounded)."""
        live = Counter((t.upstream, self.metrics.tool_label(t.upstream, t.tool)) for t in runs)
        queued = Counter[tuple[str, str]]()
        for (up, label), n in self.lanes.depths().items():
            queued[up, self.metrics.lane(up, label)] += n
        figures = self.history.figures()
        rows = sorted({*figures, *live, *(row for row, n in queued.items() if n)})
        return [(up, tool, figures.get((up, tool), Figures()), live[up, tool],
                 queued[up, tool]) for up, tool in rows]

    def _budgets(self) -> list[tuple[str, str, str, str, str]]:
        """What the gateway holds of its budgets (docs/limits.md), against their bounds."""
        procs, answers = self.processes.status(), self.answers
        per = procs["max_processes_per_principal"]
        return [("server processes (isolated upstreams)", str(procs["running"]),
                 f"{procs['max_processes']} (limits.max_processes)",
                 "none (no auth)" if per is None else
                 f"{per} (limits.max_processes_per_principal)",
                 f"{procs['waiting']} waiting"),
                ("answer bytes held", _bytes(answers.total),
                 f"{_bytes(answers.overall)} (limits.max_inflight_bytes)",
                 f"{_bytes(answers.per_principal)} "
                 "(limits.max_inflight_bytes_per_principal)",
                 f"{len(answers.held)} principal(s) holding")]

    # -- the status page's history ----------------------------------------------------------
    async def sampling(self, _: web.Application) -> AsyncIterator[None]:
        """For the app's cleanup_ctx: sample the history while the app runs."""
        sampler = asyncio.create_task(self._sample())
        yield
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler

    async def _sample(self) -> None:
        """A sample every `every_s`, on a fixed beat (a late one is not made up for)."""
        every_s = self.history.every_s
        due = time.monotonic()
        while True:
            due = max(due + every_s, time.monotonic())
            await asyncio.sleep(due - time.monotonic())
            live = Counter(t.upstream for t in self.engine.running())
            queued = Counter[str]()
            for (up, _label), n in self.lanes.depths().items():
                queued[up] += n
            self.history.sample(time.monotonic(), self.backends, live, queued)

    # -- the state the gauges show (metrics.Live) --------------------------------------------
    def tasks_live(self) -> dict[str, int]:
        counts = Counter(str(t.status) for t in self.engine.running())
        return {str(s): counts[str(s)] for s in LIVE}

    def store_bytes(self) -> int:
        return self.engine.stored_bytes()

    def store_outbox(self) -> int:
        return 0 if self.lease.outbox is None else len(self.lease.outbox)

    def webhooks_pending(self) -> int:
        return 0 if self.pusher is None else self.pusher.held

    def upstreams(self) -> dict[str, tuple[bool, int]]:
        return {n: (b.ready, b.status()["restarts"]) for n, b in self.backends.items()}

    def sessions(self) -> int:
        return sum(len(era.sessions) for era in self.eras)

    def queues(self) -> dict[tuple[str, str], int]:
        return self.lanes.depths()

    def rejections(self) -> dict[tuple[Rejection, AuthCause | None], int]:
        return dict(self.counters.rejections)


def _bytes(n: int) -> str:
    """A size for people: 900 bytes, 12.5 KiB, 512.0 MiB."""
    size, unit = float(n), "bytes"
    for bigger in ("KiB", "MiB", "GiB"):
        if size < 1024:
            break
        size, unit = size / 1024, bigger
    return f"{n} bytes" if unit == "bytes" else f"{size:.1f} {unit}"
