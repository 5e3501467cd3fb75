"""The application: `create_app(settings)` wires every concrete piece together, and `serve`
runs it. This is the only module that knows every concrete class.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import gc
import secrets
import ssl
import sys
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web

from gateway.admin import Admin
from gateway.answer_bytes import AnswerBytes
from gateway.auth import Authenticator
from gateway.auth.replicas import ReplicaSeals
from gateway.auth.resource import WELL_KNOWN, ProtectedResource
from gateway.downstream.boundary import Handler, metadata_handler
from gateway.downstream.endpoint import Endpoint
from gateway.downstream.guard import Guard
from gateway.downstream.leases import Leases
from gateway.downstream.legacy import LegacyEra
from gateway.downstream.modern import ModernEra
from gateway.downstream.mrtr import Sealer
from gateway.downstream.replay import ReplayBudget
from gateway.downstream.resume import Resumption, SessionRecords
from gateway.downstream.serving import Lean, serve_lean
from gateway.downstream.session import SessionStore
from gateway.errors import StoreUnavailable
from gateway.keyring import Cipher, derive
from gateway.observability import configure_logging, log
from gateway.observability.counters import Counters
from gateway.observability.history import EVERY_S
from gateway.observability.metrics import Metrics
from gateway.observability.tracing import Tracer
from gateway.push.pusher import MAX_PENDING, MAX_PENDING_PER_OWNER, Pusher
from gateway.queues import Queues
from gateway.ratelimit import Admission, InFlight, RateLimiter
from gateway.settings.rules import MIN_TOKEN_CHARS
from gateway.settings.schema import Limits, Settings
from gateway.stopping import Stopping
from gateway.tasks.engine import TaskEngine
from gateway.tasks.lease import Lease
from gateway.tasks.policy import Policies, Unmatched
from gateway.tasks.store import ReplicaBus, StoreBounds, TaskStore, snapshot
from gateway.tasks.store.memory import MemoryStore
from gateway.tasks.store.outbox import Outbox
from gateway.upstream import isolation
from gateway.upstream.isolation import Backend
from gateway.upstream.processes import Bounds, Processes

BACKENDS = web.AppKey("backends", dict[str, Backend])
ERAS = web.AppKey("eras", list[LegacyEra])
MODERNS = web.AppKey("moderns", list[ModernEra])
ENGINE = web.AppKey("engine", TaskEngine)
LEASE = web.AppKey("lease", Lease)
LEASES = web.AppKey("leases", Leases)
REAP_EVERY_S = 30.0
SETTLE_S = 2.0  # for the ends of tasks to be written at shutdown
HANDLERS_S = 2.0  # for answered requests to finish sending at shutdown
# Request bodies are read as sent: a compressed one is refused (415, downstream/boundary.py)
# and never inflated, not even by aiohttp's lingering read of a body left unread, which
# inflated it on the one event loop for up to 10 s (a second look at issue 41).
INFLATE = False  # aiohttp's auto_decompress, on both listeners


def create_app(conf: Settings, tracing: Tracer | None = None,
               sample_s: float = EVERY_S) -> web.Application:
    """The gateway as an aiohttp app; for tests, `tracing` (else built from `conf.tracing`)
    to read spans in memory, `sample_s` (/status's samples: history.py) to watch them fill."""
    counters, replica = Counters(), conf.replica.id or secrets.token_hex(8)
    seals = _seals(conf, replica)
    app, auth, guard = _guarded_app(conf, counters, _owner_key(conf), seals)
    backends: dict[str, Backend] = {}
    eras: list[LegacyEra] = []
    moderns: list[ModernEra] = []
    posts: dict[str, Handler] = {}  # the MCP paths' POST: served below the web layer
    sealer, limits = _sealer(conf), conf.limits
    tracing = _traced(app, tracing or Tracer.from_settings(conf.tracing))
    metrics = Metrics(lambda up, tool: tool in backends[up].catalogue.tools,
                      named={*conf.tasks.tools, *(name for up in conf.upstreams.values()
                                                  if up.tasks for name in up.tasks.tools)})
    admission = Admission(RateLimiter(limits.task_requests_per_s, limits.task_requests_burst),
                          RateLimiter(limits.task_creations_per_s, limits.task_creations_burst),
                          counters)
    leases = _leases(limits, counters)
    queues = Queues(metrics.queue_waited, counters=counters)
    store, bus, records = _store(conf, replica)
    engine = TaskEngine(store, counters, admission, replica, metrics, bus,
                        conf.replica_url or "")
    pusher = _pusher(app, conf, engine, metrics, bus)
    policies = Policies.of(conf)
    replay, processes = _replay(limits), Processes(Bounds.of(limits, conf.auth.enabled), counters)
    for name, up in conf.upstreams.items():
        backend = isolation.build(name, up, limits.max_message_bytes, counters, queues, processes,
                                  leases.answers)
        exchanger = auth.exchanger(up.token_exchange)
        era = LegacyEra(backend, _sessions(limits, replay, up.isolation == "client"), conf,
                        engine, policies, leases, exchanger, _resumption(records, name, limits))
        modern = ModernEra(backend, conf, sealer, engine, policies, leases, exchanger, seals)
        endpoint = Endpoint(era, modern, guard, limits, metrics, counters, tracing)
        posts[up.path] = _route(app, up.path, endpoint, guard)
        backends[name] = backend
        eras.append(era)
        moderns.append(modern)
    app[BACKENDS], app[ERAS], app[MODERNS], app[ENGINE] = backends, eras, moderns, engine
    unmatched = _unmatched(policies, backends)
    app[LEASES] = leases
    app[LEASE] = lease = Lease(engine, engine.replicas, conf.store.backend, conf.store.lease_ms,
                               store if isinstance(store, Outbox) else None)
    _operators(app, conf, guard, Admin(backends, eras, engine, lease, counters, metrics, queues,
                                       processes, leases, sample_s, pusher, unmatched,
                                       auth.named(), policies.digest()))
    _serving(app, guard, posts, limits)
    _lifecycles(app, conf, store)
    return app


def _traced(app: web.Application, tracing: Tracer | None) -> Tracer | None:
    """Traces, if on, flushed as the app ends."""
    if tracing is not None:
        app.on_cleanup.append(_flush(tracing))
    return tracing


def _unmatched(policies: Policies, backends: dict[str, Backend]) -> Unmatched:
    """The settings' per-tool entries that match no tool, checked as each upstream lists."""
    unmatched = Unmatched(policies, backends)
    for backend in backends.values():
        backend.listed = unmatched.learned
    return unmatched


def _pusher(app: web.Application, conf: Settings, engine: TaskEngine, metrics: Metrics,
            bus: ReplicaBus | None) -> Pusher | None:
    """The webhooks (docs/push.md), told each status the engine writes, their pending
    deliveries in the shared store where there is one (any replica delivers them); its
    workers run while the app does, and stop after the tasks' ends were written."""
    if not conf.webhooks and not conf.webhooks_allowed:
        return None
    pending = None
    if bus is not None:  # a shared store's (redis is loaded only then)
        from gateway.push.pending_redis import RedisPending
        from gateway.tasks.store.redis_bus import RedisBus

        assert isinstance(bus, RedisBus)
        secret = _shared_secret(conf)
        pending = RedisPending(bus.store.link, None if secret is None else Cipher(
            derive(secret, "webhooks")), MAX_PENDING, MAX_PENDING_PER_OWNER)
    pusher = Pusher(conf.webhooks, metrics, pending)
    engine.on_status(pusher.told)

    async def running(_: web.Application) -> AsyncIterator[None]:
        await pusher.start()
        yield
        await pusher.close()
    app.cleanup_ctx.append(running)  # before the tasks' own: it stops after them
    return pusher


def _serving(app: web.Application, guard: Guard, posts: dict[str, Handler], limits: Limits
             ) -> None:
    """The catch-all route, last (see _unrouted); the connections that serve the MCP
    paths' POST below the web layer (downstream/serving.py)."""
    app.router.add_route("*", "/{tail:.*}", guard.wrap(_unrouted))
    serve_lean(app, Lean(posts, limits.max_body_bytes))


def _route(app: web.Application, path: str, endpoint: Endpoint, guard: Guard) -> Handler:
    """An MCP path: its POST calls the guard itself (the lean path: served below the web
    layer, downstream/serving.py; the route stays for a path spelled otherwise, or `Expect`);
    GET and DELETE are routed behind the guard."""
    app.router.add_post(path, endpoint.post)
    app.router.add_get(path, guard.wrap(endpoint.get), allow_head=False)
    app.router.add_delete(path, guard.wrap(endpoint.delete))
    return endpoint.post


def _operators(app: web.Application, conf: Settings, guard: Guard, admin: Admin) -> None:
    """The operator's routes on the gateway's port, and on the operator listener's; the
    sampling of /status's history while the app runs."""
    admin.routes(app, guard.wrap)
    app.cleanup_ctx.append(admin.sampling)
    if conf.listen.operator_port is not None:
        app.cleanup_ctx.append(_operator_listener(conf, guard.for_listener(conf), admin))


def _operator_listener(conf: Settings, guard: Guard, admin: Admin
                       ) -> Callable[[web.Application], AsyncIterator[None]]:
    """The operator listener (`listen.operator_port`): the operator's routes alone, on a
    port of their own that the shipped proxies do not expose (docs/security.md), run for
    as long as the gateway's app."""
    async def listening(_: web.Application) -> AsyncIterator[None]:
        app = web.Application()
        app.on_response_prepare.append(guard.on_prepare)
        admin.routes(app, guard.wrap)
        runner = web.AppRunner(app, access_log=None, handle_signals=False,
                                auto_decompress=INFLATE)
        await runner.setup()
        site = web.TCPSite(runner, conf.listen.operator_host, conf.listen.operator_port,
                           ssl_context=_tls(conf.listen.tls_cert, conf.listen.tls_key))
        await site.start()
        log.info("gateway.operator_listening", host=conf.listen.operator_host,
                 port=runner.addresses[0][1] if runner.addresses else None)
        yield
        await runner.cleanup()
    return listening


def _replay(limits: Limits) -> ReplayBudget:
    """What every upstream's legacy sessions keep for resumption, together."""
    return ReplayBudget(limits.replay_budget_bytes, limits.replay_linger_ms / 1000,
                        limits.replay_bytes_per_principal)


def _sessions(limits: Limits, replay: ReplayBudget, own_process: bool) -> SessionStore:
    """One upstream's legacy sessions, bounded per principal and in all; the replay budget
    is shared by every upstream's. A session with a process of its own (isolation: client)
    ends idle after `process_idle_ms` if that is sooner: its process goes with it (issue 41:
    old sessions do not hold processes for ever)."""
    idle_ms = limits.session_idle_ms
    if own_process:
        idle_ms = min(idle_ms, limits.process_idle_ms)
    return SessionStore(limits.max_sessions, idle_ms / 1000,
                        limits.max_sessions_per_principal, replay)


def _resumption(records: SessionRecords | None, upstream: str, limits: Limits
                ) -> Resumption | None:
    """One upstream's legacy sessions in the shared store (none with the memory store)."""
    return None if records is None else Resumption(
        records, upstream, limits.session_idle_ms / 1000, limits.max_sessions_per_principal)


def _guarded_app(conf: Settings, counters: Counters, owner_key: bytes | None,
                 seals: ReplicaSeals) -> tuple[web.Application, Authenticator, Guard]:
    """The app and its guard (origins, authentication), with the protected resource
    metadata when OAuth is on. No middleware: each route is registered behind the guard
    (`Guard.wrap`), and the MCP endpoints' POST calls it first thing (one handler a
    request, no chain: docs/architecture.md, The request path)."""
    auth = Authenticator(conf.auth, Policies.of(conf).scopes(), owner_key)
    guard = Guard.of(conf, counters, auth, seals)
    # aiohttp refuses bodies over client_max_size with 413 before we parse them.
    app = web.Application(client_max_size=conf.limits.max_body_bytes)
    app.on_response_prepare.append(guard.on_prepare)
    if auth.resource is not None:
        _serve_metadata(app, auth.resource, [up.path for up in conf.upstreams.values()])
    app.on_cleanup.append(lambda _: auth.close())
    return app, auth, guard


async def _unrouted(request: web.Request) -> web.StreamResponse:
    """What aiohttp answers a request no route takes: 405 with Allow for a known path, else
    404; registered last, behind the guard, so that a stranger still gets 401 there (with
    no middleware, nothing else stands in front of it)."""
    allowed = {route.method for resource in request.app.router.resources()
               if resource.canonical == request.path for route in resource
               if route.method != "*"}  # the catch-all's own, for a path spelled "/{tail}"
    if allowed:
        raise web.HTTPMethodNotAllowed(request.method, allowed)
    raise web.HTTPNotFound()


def _serve_metadata(app: web.Application, resource: ProtectedResource, paths: list[str]
                    ) -> None:
    """RFC 9728 section 3: at the well-known URI, and with each MCP path appended."""
    handler = metadata_handler(resource.document)
    for suffix in {"", *paths}:
        app.router.add_get(WELL_KNOWN + suffix, handler)


def _shared_secret(conf: Settings) -> bytes | None:
    """What every replica shares (settings insist on it with a shared store)."""
    secret = conf.shared_secret
    return None if secret is None else secret.encode()


def _sealer(conf: Settings) -> Sealer:
    """requestState's key: derived from the shared secret, else random per start."""
    secret = _shared_secret(conf)
    return Sealer(None if secret is None else derive(secret, "request-state"),
                  conf.limits.park_timeout_ms / 1000)


def _seals(conf: Settings, replica: str) -> ReplicaSeals:
    """What one replica vouches for on a request it relays to another (`replica`: this
    one's id, which a seal for it names): sealed with a key of the shared secret
    (auth/replicas.py), else with a random one (no other replica)."""
    secret = _shared_secret(conf)
    return ReplicaSeals(None if secret is None else derive(secret, "relay"), replica)


def _owner_key(conf: Settings) -> bytes | None:
    """With a shared store, owners are keyed digests there (authenticator.py); one
    process keeps the plain ones (they never leave it)."""
    secret = _shared_secret(conf)
    if conf.store.backend == "memory" or secret is None:
        return None
    return derive(secret, "owner-digest")


def _store(conf: Settings, replica: str
           ) -> tuple[TaskStore, ReplicaBus | None, SessionRecords | None]:
    """The memory store (one process: no bus, no session records); or a shared one behind
    the outbox that keeps what it misses, the replicas' bus and legacy sessions' records
    (any replica adopts a session: downstream/resume.py) over the same server."""
    store, bounds = conf.store, StoreBounds.of(conf.limits)
    if store.backend == "redis":
        # Imported here: redis-py (and what it pulls in: hiredis, cryptography, OpenTelemetry
        # where installed) costs a one-process gateway ~20 MiB resident for nothing.
        from gateway.tasks.store.redis import RedisStore
        from gateway.tasks.store.redis_bus import RedisBus
        from gateway.tasks.store.redis_sessions import RedisSessions

        shared = RedisStore(store.url, store.key_prefix, bounds, replica=replica,
                            sentinels=store.sentinels, master=store.sentinel_master,
                            min_acked=store.min_replicas_acked, secret=_shared_secret(conf),
                            ack_timeout_ms=store.ack_timeout_ms)
        return (Outbox(shared, store.outbox_max_entries, store.outbox_max_bytes),
                RedisBus(shared), RedisSessions(shared.link, _shared_secret(conf)))
    return MemoryStore(bounds), None, None


def _flush(tracing: Tracer) -> Callable[[web.Application], Awaitable[None]]:
    async def flush(_: web.Application) -> None:
        await asyncio.to_thread(tracing.shutdown)  # exports the spans still queued
    return flush


def _lifecycles(app: web.Application, conf: Settings, store: TaskStore) -> None:
    """What runs while the app does: its parts, the stop's stages (`_stop`), and a single
    gateway's snapshot, read once its parts started (before it serves) and written right
    after the stop's first stages settled the tasks' ends: before aiohttp waits on slow
    readers, so `docker stop`'s 10 s kill finds it written (review of issue 48)."""
    app.cleanup_ctx.append(_lifecycle)
    app.on_shutdown.append(_stop)
    path = conf.store.snapshot_path
    if path is not None and isinstance(store, MemoryStore):
        load, save = _snapshot(path, _shared_secret(conf), store)
        app.on_startup.append(load)
        app.on_shutdown.append(save)


def _snapshot(path: str, secret: bytes | None, store: MemoryStore
              ) -> tuple[Callable[[web.Application], Awaitable[None]],
                         Callable[[web.Application], Awaitable[None]]]:
    """A single gateway's tasks across its restart (tasks/store/snapshot.py): how they are
    read at start and written at the stop, under one key."""
    key = snapshot.key_of(path, secret)

    async def load(_: web.Application) -> None:
        snapshot.load(store, path, key)

    async def save(_: web.Application) -> None:
        snapshot.save(store, path, key)
    return load, save


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    backends = app[BACKENDS]
    lease = app[LEASE]
    await lease.start()
    for backend in backends.values():
        await backend.start()
    reaper = asyncio.create_task(_reap(app[ERAS], app[ENGINE], backends, *_reaping(backends)))
    yield
    reaper.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await reaper
    await lease.stop()
    await asyncio.gather(*(m.handoff.close() for m in app[MODERNS]))
    await asyncio.gather(*(b.close() for b in backends.values()))
    log.info("shutdown.upstreams_stopped")
    log.info("gateway.stopped")


def _reaping(backends: dict[str, Backend]) -> tuple[float, float]:
    """(how often to reap, how long an isolated process may idle): with isolated upstreams,
    at least twice per `process_idle_ms`, so a process goes within 1.5 times its idle time."""
    isolated = [b for b in backends.values() if b.conf.isolation != "shared"]
    if not isolated:
        return REAP_EVERY_S, 0.0
    idle_s = isolated[0].processes.bounds.idle_s
    return min(REAP_EVERY_S, idle_s / 2), idle_s


async def _reap(eras: list[LegacyEra], engine: TaskEngine, backends: dict[str, Backend],
                every_s: float, idle_s: float) -> None:
    while True:
        await asyncio.sleep(every_s)
        with contextlib.suppress(StoreUnavailable):  # the lease keeper logs it
            await engine.sweep()
        for era in eras:
            await era.expire()
        for backend in backends.values():
            await backend.reap(idle_s)


async def _stop(app: web.Application) -> None:
    """Graceful shutdown, in stages (aiohttp has stopped accepting before this runs, and
    ends the upstream processes after it, in `_lifecycle`): calls in flight are answered
    with a JSON-RPC error that says the gateway is stopping (and cancelled upstream), so
    clients see an answer rather than a dropped connection; tasks whose calls ended so are
    written as failed; streams end cleanly."""
    log.info("shutdown.accepting_stopped")
    calls = sum(b.stop_calls() for b in app[BACKENDS].values())
    log.info("shutdown.calls_answered", calls=calls)
    running = len(app[ENGINE].running())
    left = await app[ENGINE].settle(SETTLE_S)
    log.info("shutdown.tasks_ended", tasks=running - left, still_running=left)
    for era in app[ERAS]:
        for session in era.sessions.all():
            session.close_streams()
    for modern in app[MODERNS]:
        modern.close()
    log.info("shutdown.streams_closed")


def serve(conf: Settings) -> int:
    configure_logging(conf.logging)
    loop = _new_loop()
    _tune_allocator()
    app = create_app(conf)
    app.on_startup.append(Stopping(app[LEASES], conf.shutdown.drain_ms).on_startup())
    short = sum(0 < len(t) < MIN_TOKEN_CHARS
                for t in [*(s.token for s in conf.auth.static_tokens), *conf.auth.admin_tokens])
    if short:  # refused beyond loopback (settings.py); here, a word to the operator
        log.warning("auth.short_token", tokens=short, min_chars=MIN_TOKEN_CHARS)
    host, port = conf.listen.host, conf.listen.port

    def listening(_: str) -> None:  # run_app's word once its sockets are bound
        _tune_collector()
        log.info("gateway.listening", host=host, port=port, upstreams=sorted(conf.upstreams),
                 tls=conf.listen.tls_cert is not None, tools_config=Policies.of(conf).digest())
    try:
        web.run_app(app, host=host, port=port,
                    ssl_context=_tls(conf.listen.tls_cert, conf.listen.tls_key),
                    access_log=None, print=listening, shutdown_timeout=HANDLERS_S, loop=loop,
                    handle_signals=False,  # the stop signals start the drain (stopping.py)
                    max_line_size=conf.listen.max_header_bytes,
                    max_field_size=conf.listen.max_header_bytes,
                    # A modern client cancels by closing its stream (spec 2026-07-28); legacy
                    # calls outlive their handlers anyway.
                    handler_cancellation=True, auto_decompress=INFLATE)
    except OSError as exc:
        if exc.errno not in _CANNOT_BIND:
            raise
        # One line, as the other start-up failures give (cli.py), not a traceback.
        reason = (exc.strerror or str(exc)).rsplit(": ", 1)[-1]  # aiohttp's names the address
        log.error("gateway.listen_failed", host=host, port=port, error=reason)
        print(f"mcp-task-gateway: cannot listen on {host}:{port}: {reason} (--port, or "
              "listen.port in the config, picks another)", file=sys.stderr)
        return 1
    return 0


# The address cannot be bound: in use, not this host's, or a port below 1024 unprivileged.
_CANNOT_BIND = frozenset({errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES})


def _tls(cert: str | None, key: str | None) -> ssl.SSLContext | None:
    """HTTPS where the gateway ends TLS itself (bearer tokens never cross a network in
    clear: RFC 6750 section 5.3); None when TLS ends in front of it, or on loopback."""
    if cert is None or key is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context


def _tune_collector() -> None:
    """The cyclic garbage collector, set for a server that has started: what start-up made
    (modules, settings, the app) is moved out of its view for good (`gc.freeze`), and its
    youngest generation is collected every 10,000 allocations rather than 700. A call
    allocates some hundred tracked objects and leaves no cycle (an exchange lets its call go:
    exchange.py), so at 700 a collection ran every few calls and cost ~4% of an echo's CPU
    (peerbench's wrk phase, perf); at 10,000 one runs every ~100 calls, over as many young
    objects, the older generations' thresholds unchanged."""
    gc.freeze()
    gc.set_threshold(YOUNG_COLLECTED, *gc.get_threshold()[1:])


YOUNG_COLLECTED = 10_000  # allocations between collections of the youngest generation


def _tune_allocator() -> None:
    """Bound what glibc keeps of freed big buffers, without making it fault them in again.

    By default glibc raises its mmap threshold after each large free (up to 32 MiB) and lets
    the heap keep twice that unused: after one 30 MiB message the process holds ~60 MiB it no
    longer needs. Unmapping every buffer instead (a low fixed threshold) costs page faults on
    each message (measured: 3x slower to parse and serialize 1 MiB). Fixed values in between:
    buffers up to 4 MiB come from the heap and are reused, and at most 4 MiB of free heap is
    kept (a 1 MiB message passes through about that much at once: keeping only 2 MiB, each
    one faulted 4 MiB in again, 2,000 page faults and a third of its CPU); bigger messages
    are mapped and unmapped one by one.
    """
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 4 << 20)  # M_MMAP_THRESHOLD (fixing it stops the drift)
        libc.mallopt(-1, 4 << 20)  # M_TRIM_THRESHOLD


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def _leases(limits: Limits, counters: Counters) -> Leases:
    """What calls hold (downstream/leases.py): each principal's calls in flight, and the
    budget of answer bytes held for clients (answer_bytes.py)."""
    answers = AnswerBytes(limits.max_inflight_bytes, limits.max_inflight_bytes_per_principal,
                          counters)
    return Leases(InFlight(limits.max_calls_per_owner, counters, answers))
