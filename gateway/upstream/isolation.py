"""Which upstream process serves which caller (`isolation` in the YAML).

- shared: one supervised process for every session; ids rewritten per call.
- client: one supervised process per downstream session, started at its initialize.
- call:   every tools/call takes a pre-initialized process from a small warm pool and the
          process is retired afterwards; everything else goes to one shared control process.

The per-client and per-call modes make the routing of server-to-client requests exact.

Eras (`era` in the YAML; spec 2026-07-28 versioning, Backward Compatibility). The primary
process opens with initialize (legacy clients' sessions go there) unless the era is pinned
`modern`. A modern request's `Route` is resolved before it is decided: its connection,
ready, and the era that connection speaks, which every process the request may be handed
(`for_request`) speaks too. With `era: auto` a `Shared` backend holds a `DualEra` (eras.py):
a server of both eras is reached by modern clients on a second link of its own modern
wire. With `isolation: client` each modern owner's process probes for itself; `isolation:
call` keeps one warm pool of legacy processes for both eras and opens no modern link (a
tools/call of a modern client is bridged onto a pool process, so everything else of that
client is bridged as well: one era per route).

Bounds (issue 41): the processes of `client` and `call` are counted by one `Processes` of
the gateway, overall and per principal (processes.py); a modern principal's own process
idle for `process_idle_ms` is closed (`reap`; a legacy session's ends with its session).
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from gateway.answer_bytes import AnswerBytes, Partial
from gateway.errors import UpstreamNotReady, UpstreamSessionLost, UpstreamShutdown
from gateway.observability import log
from gateway.observability.counters import Counters
from gateway.protocol import mcp
from gateway.protocol.jsonrpc import Message
from gateway.queues import Limit, Queues, Ticket
from gateway.settings.schema import Upstream as UpstreamConf
from gateway.upstream.catalogue import Catalogue
from gateway.upstream.connection import Connection
from gateway.upstream.correlator import Owner
from gateway.upstream.eras import DualEra
from gateway.upstream.handshake import Opening
from gateway.upstream.processes import Processes
from gateway.upstream.stdio import StdioTransport
from gateway.upstream.transport import MakeTransport


@dataclass(frozen=True, slots=True)
class Route:
    """Where a modern request goes, resolved once before it is decided: the connection, as
    it was found ready, what its server said of itself then (`init_result`, what
    server/discover answers from, held even if the connection is lost before the request
    reads it), and whether it speaks the server's own modern wire (`modern`: its rounds and
    its tasks are the server's; else the gateway bridges the request onto a legacy one).
    A process `for_request` hands the request instead speaks the same era."""

    conn: Connection
    init_result: dict[str, Any]
    modern: bool

    @classmethod
    async def ready(cls, conn: Connection) -> Route:
        """`conn`'s route once it is ready (UpstreamError: it never got there)."""
        init_result = await conn.wait_ready()
        return cls(conn, init_result, conn.modern)


class Backend:
    """The processes behind one named upstream: what every isolation mode shares (`Shared`,
    `PerClient`, `PerCall` are its kinds)."""

    def __init__(self, name: str, conf: UpstreamConf, max_message_bytes: int,
                 counters: Counters | None = None, queues: Queues | None = None,
                 processes: Processes | None = None, answers: AnswerBytes | None = None
                 ) -> None:
        self.name = name
        self.conf = conf
        self.queues = queues or Queues()
        # The gateway's budget of isolated processes (counted by PerClient and PerCall).
        self.processes = processes or Processes()
        self.limit = None if conf.max_concurrency is None else Limit(
            name, "*", conf.max_concurrency, conf.max_queue, server=True)
        self.max_message_bytes = max_message_bytes
        # The answer budget: a stdio line, or an HTTP answer, read in part is counted in it
        # (stdio.py, http_post.py).
        self.answers = answers or AnswerBytes(1 << 62, 1 << 62)
        self.counters = counters if counters is not None else Counters()
        self.catalogue = Catalogue()
        self.connections: weakref.WeakSet[Connection] = weakref.WeakSet()  # every process
        # Told each time the catalogue learns the tools listed (upstream, names).
        self.listed: Callable[[str, Collection[str]], None] | None = None
        self.primary = self._new(restart=True)
        # Client headers an HTTP upstream receives; None: a stdio upstream, which has none.
        self.forward = (frozenset(h.lower() for h in conf.forward_headers)
                        if conf.url is not None else None)
        if self.forward and "authorization" in self.forward:
            log.warning("upstream.forwards_authorization", upstream=name)

    def ticket(self, owner: str, tool_limit: Limit | None) -> Ticket | None:
        """A tool call's place under its tool's limit and this server's (None: no limit);
        QueueFull when it would have to wait in a full queue."""
        return self.queues.ticket(owner, tool_limit, self.limit)

    def learn_tools(self, msg: Message) -> Message:
        """Note from a tools/list answer what the gateway must know of each tool (and tell
        `listed`, the settings' check of per-tool entries)."""
        self.catalogue.learn(msg, self.primary.init_result)
        result = msg.get("result")
        last_page = isinstance(result, dict) and not result.get("nextCursor")
        if self.listed is not None and last_page:  # every page's names are in now
            self.listed(self.name, self.catalogue.tools)
        return msg

    def client_headers(self, headers: Mapping[str, str]) -> dict[str, str] | None:
        """Those of a client request's `headers` the upstream gets: the ones named in
        `forward_headers`, and every `Mcp-Param-*` (spec 2026-07-28 Streamable HTTP:
        intermediaries MUST forward the ones they do not recognize)."""
        if self.forward is None:
            return None
        out = {k: v for k, v in headers.items()
               if k.lower() in self.forward or k.lower().startswith("mcp-param-")}
        return out or None

    def _new(self, restart: bool, opening: Opening | None = None, learns: bool = True
             ) -> Connection:
        """A connection of this upstream; `learns`: its tools/list answers teach the
        catalogue."""
        conn = Connection(self.name, self._transport(restart), self.conf.startup_timeout_ms
                          / 1000, self.counters, opening or self.conf.era,
                          on_tools=self.learn_tools if learns else None)
        self.connections.add(conn)
        return conn

    def _transport(self, restart: bool) -> MakeTransport:
        """How a connection of this upstream makes its transport: HTTP for a `url`, else a
        process of its `command` (settings.Upstream holds one of them)."""
        name, conf, url, command = self.name, self.conf, self.conf.url, self.conf.command
        holder = f"upstream {name}"  # what it reads for no principal is counted under
        if url is not None:
            # Loaded with the backend's first connection (`primary`, at start), never by a
            # gateway of stdio servers only: the HTTP client side is ~0.3 MiB resident.
            from gateway.upstream.http import HttpTransport

            def partial(principal: str | None) -> Partial:
                return self.answers.partial(principal, holder)
            return lambda link: HttpTransport(link, name, conf, url, self.max_message_bytes,
                                              restart, partial)
        if command is None:
            raise ValueError(f"upstream '{name}' has neither a command nor a url")
        reading = self.answers.reading(holder)
        return lambda link: StdioTransport(link, name, conf, command, self.max_message_bytes,
                                           restart, reading)

    def stop_calls(self) -> int:
        """The gateway is stopping: every client's call in flight, on any of this upstream's
        processes, is cancelled and answered with an error that says so."""
        error = UpstreamShutdown(self.name, "the gateway is stopping")
        calls = [(conn, call) for conn in list(self.connections)
                 for call in conn.correlator.clients_calls()]
        for conn, call in calls:
            conn.cancel(call, error.message)
            call.fail(error)
        return len(calls)

    async def start(self) -> None:
        self.primary.start()

    async def close(self) -> None:
        # Every process this upstream started (the primary, the modern link, each
        # session's and principal's own, the warm pool's): one whose owner never ended it
        # (a session still open at shutdown) would leave its process or HTTP client behind.
        await asyncio.gather(*(conn.close() for conn in list(self.connections)))

    @property
    def ready(self) -> bool:
        return self.primary.ready

    def status(self) -> dict[str, Any]:
        return {"isolation": self.conf.isolation, **self.primary.status()}

    async def modern_conn(self) -> Connection | None:
        """The link that serves modern clients on the server's own modern wire: the
        primary when it speaks only that; None when modern clients are bridged onto the
        legacy session (a legacy server, the era pinned `legacy`, or a mode that opens no
        modern link; `Shared` finds a server of both eras' own)."""
        return self.primary if self.primary.modern else None

    def home(self) -> Connection:
        """The connection a new legacy session will be served by (`attach` it there)."""
        return self.primary

    async def attach(self, owner: Owner, conn: Connection) -> dict[str, Any]:
        """`owner`'s session on `conn`, its `home`, once it is initialized: what the server
        said of itself then (UpstreamError: not attached, it never got there)."""
        init_result = await conn.wait_ready()
        conn.attach(owner)
        return init_result

    async def detach(self, owner: Owner, conn: Connection) -> None:
        conn.detach(owner)

    async def for_principal(self, principal: str) -> Route:
        """The route of modern requests of one auth context, ready (the modern link may
        have been lost since it was found: it is waited for too)."""
        await self.primary.wait_ready()
        return await Route.ready(await self.modern_conn() or self.primary)

    async def for_request(self, conn: Connection, owner: Owner, method: str) -> Connection:
        """The connection one request of `owner`, a session attached to `conn` (or a modern
        request routed there), goes to: `conn`, or a process of the same era."""
        return conn

    def done(self, conn: Connection, used: Connection) -> None:
        """`used` finished the request it was taken for."""

    async def reap(self, idle_s: float) -> int:
        """Close the processes of its own idle for `idle_s` (no call in flight, nobody
        listening); how many went. The shared process stays."""
        return 0


class Shared(Backend):
    """One supervised process for every session (isolation `shared`, the default); with
    `era: auto`, a server of both eras gets a second link for its modern clients, found by
    probing it (eras.py): the only mode that opens one."""

    def __init__(self, name: str, conf: UpstreamConf, max_message_bytes: int,
                 counters: Counters | None = None, queues: Queues | None = None,
                 processes: Processes | None = None, answers: AnswerBytes | None = None
                 ) -> None:
        super().__init__(name, conf, max_message_bytes, counters, queues, processes, answers)
        # Its link learns no tools: the catalogue is the primary's (its native tasks, its
        # tools). None: the era is pinned.
        self.eras = DualEra(name, lambda: self._new(restart=True, opening="probe",
                                                    learns=False)) \
            if conf.era == "auto" else None

    async def start(self) -> None:
        await super().start()
        if self.eras is not None and self.conf.url is None:
            # A stdio server's probe starts a process of its own (seconds, its start): at
            # the upstream's start, so that the first modern request need not wait for it.
            # An HTTP server's is a request or two, made at the first modern request.
            self.eras.probe(self.primary.wait_ready)

    async def close(self) -> None:
        if self.eras is not None:
            await self.eras.close()
        await super().close()

    def status(self) -> dict[str, Any]:
        out = super().status()
        if self.eras is not None:  # what the probe found, and the modern clients' link
            out["era_probe"] = self.eras.state
            if self.eras.link is not None:
                out["modern_link"] = self.eras.link.status()
        return out

    async def modern_conn(self) -> Connection | None:
        if self.primary.modern or self.eras is None:
            return await super().modern_conn()
        return await self.eras.modern_link()


class PerClient(Backend):
    """A process per legacy session, and per auth context of modern requests; each holds a
    place of the gateway's process budget from before it starts until it is closed."""

    # No modern link beside: each principal's own process probes for itself (`_own`).

    def __init__(self, name: str, conf: UpstreamConf, max_message_bytes: int,
                 counters: Counters | None = None, queues: Queues | None = None,
                 processes: Processes | None = None, answers: AnswerBytes | None = None
                 ) -> None:
        super().__init__(name, conf, max_message_bytes, counters, queues, processes, answers)
        self._by_principal: dict[str, Connection] = {}
        self._starting: dict[str, asyncio.Task[Connection]] = {}  # waiting for a place
        self._used: dict[str, float] = {}  # principal -> its last modern request (monotonic)
        self._held: dict[Connection, Ticket] = {}  # each process's place in the budget

    async def for_principal(self, principal: str) -> Route:
        self._used[principal] = time.monotonic()
        proc = self._by_principal.get(principal)
        if proc is None:
            starting = self._starting.get(principal)
            if starting is None:  # one start per principal, whoever asks meanwhile
                starting = self._starting[principal] = asyncio.create_task(
                    self._own(principal), name="own-process")
                starting.add_done_callback(lambda _: self._starting.pop(principal, None))
            # Shielded: a caller that goes away does not end the start others wait for.
            proc = await asyncio.shield(starting)
        return await Route.ready(proc)

    async def _own(self, principal: str) -> Connection:
        """`principal`'s own process, started once the budget has a place for it."""
        ticket = await self.processes.take(self.name, principal)  # TooManyProcesses
        # Its own process, which speaks the modern wire if the server does.
        opening: Opening = "probe" if self.conf.era == "auto" else self.conf.era
        proc = self._by_principal[principal] = self._new(restart=True, opening=opening)
        self._held[proc] = ticket
        proc.start()
        return proc

    def home(self) -> Connection:
        return self._new(restart=True)  # its own process, started when it is attached

    async def attach(self, owner: Owner, conn: Connection) -> dict[str, Any]:
        if conn not in self._held:  # TooManyProcesses: the session is not made
            self._held[conn] = await self.processes.take(self.name, owner.principal)
        try:
            init_result = await _started(conn)
        except BaseException:
            self._release(conn)
            raise
        conn.attach(owner)
        return init_result

    async def detach(self, owner: Owner, conn: Connection) -> None:
        conn.detach(owner)
        # A task's call still running there (with auth a core task outlives its session)
        # ends with the process, saying so: not as if the gateway stopped.
        await conn.close(UpstreamSessionLost(self.name, "the client's session ended, and "
                                             "with it the server process its call ran in "
                                             "(isolation: client)"))
        self._release(conn)

    def _release(self, conn: Connection) -> None:
        ticket = self._held.pop(conn, None)
        if ticket is not None:
            ticket.release()

    async def reap(self, idle_s: float) -> int:
        cutoff = time.monotonic() - idle_s
        idle = [p for p, conn in self._by_principal.items()
                if self._used.get(p, 0.0) < cutoff and not conn.in_flight
                and not conn.audience.watchers]
        for principal in idle:
            conn = self._by_principal.pop(principal)
            self._used.pop(principal, None)
            await conn.close()
            self._release(conn)
            log.info("upstream.process_reaped", upstream=self.name, why="idle")
        return len(idle)

    async def start(self) -> None:
        # The primary process only answers readiness and tells what the server is; sessions
        # get their own processes.
        self.primary.start()


class PerCall(Backend):
    """A warm process per tools/call: each warm one holds a place of the gateway's process
    budget from its start until it is retired; a call on one holds a place of its
    principal's share while it runs. Its warm processes and its control process open alike
    (the upstream's `era`), so a modern request's route keeps its era whichever process
    takes its tools/call: no modern link is opened beside them."""

    def __init__(self, name: str, conf: UpstreamConf, max_message_bytes: int,
                 counters: Counters | None = None, queues: Queues | None = None,
                 processes: Processes | None = None, answers: AnswerBytes | None = None
                 ) -> None:
        super().__init__(name, conf, max_message_bytes, counters, queues, processes, answers)
        self._warm: asyncio.Queue[Connection] = asyncio.Queue()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closing = False
        self._pooled: dict[Connection, Ticket] = {}  # each warm process's place overall
        self._calls: dict[Connection, Ticket] = {}  # a call's place in its principal's share
        self._short = 0  # warm-ups waiting for a place overall
        self._coming = 0  # warm-ups not done yet (waiting for a place, or starting)

    async def start(self) -> None:
        self.primary.start()
        for _ in range(self.conf.pool_size):
            self._refill()

    async def close(self) -> None:
        self._closing = True
        for task in list(self._tasks):
            if task.get_name() == "warm-up":  # retirements run to the end: no orphans
                task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await super().close()  # the warm ones too: every connection it made

    def status(self) -> dict[str, Any]:
        return {**super().status(), "warm": self._warm.qsize()}

    async def for_request(self, conn: Connection, owner: Owner, method: str) -> Connection:
        if method != mcp.TOOLS_CALL:
            return conn
        share = await self.processes.share(self.name, owner.principal)  # TooManyProcesses
        try:
            proc = await self._take_warm()
        except BaseException:
            if share is not None:
                share.release()
            raise
        if share is not None:
            self._calls[proc] = share
        proc.attach(owner)
        return proc

    async def _take_warm(self) -> Connection:
        """A warm process; at the overall bound (its replacement cannot start) no longer
        than `process_wait_ms`, else as long as a start may take."""
        self._top_up()  # the pool short of a warm-up that failed: another try
        startup_s = self.conf.startup_timeout_ms / 1000
        first_s = min(self.processes.bounds.wait_s, startup_s)
        # Cancelled, a get loses nothing: the queue gives its item only to a get that runs.
        # Waited with asyncio.wait, never wait_for: on Python 3.11 wait_for swallows a cancel
        # that lands as the get completes, and the caller's call went on unasked (issue 48).
        taking = asyncio.ensure_future(self._warm.get())
        try:
            await asyncio.wait({taking}, timeout=first_s)
            if not taking.done() and self._short:
                raise self.processes.refusal(self.name, None)
            if not taking.done():
                await asyncio.wait({taking}, timeout=startup_s - first_s)
            if not taking.done():
                raise UpstreamNotReady(self.name, f"no process of upstream '{self.name}' "
                                       "became ready")
            proc = taking.result()
        except BaseException:
            # Cancelled once the get had its process (the client left): it goes back to the
            # pool, or its place would be held for good (issue 48: Bob's resets took them all).
            if taking.done() and not taking.cancelled() and taking.exception() is None:
                self._warm.put_nowait(taking.result())
            raise
        finally:
            if not taking.done():
                taking.cancel()
        self._top_up()  # its replacement: one per process taken keeps the pool at its size
        return proc

    def done(self, conn: Connection, used: Connection) -> None:
        if used is not conn:
            share = self._calls.pop(used, None)
            if share is not None:
                share.release()
            self._spawn(self._retire(used), "retire")

    async def _retire(self, conn: Connection) -> None:
        try:
            await conn.close()
        finally:
            ticket = self._pooled.pop(conn, None)
            if ticket is not None:
                ticket.release()

    def _refill(self) -> None:
        if not self._closing:
            self._coming += 1
            self._spawn(self._warm_one(), "warm-up")

    def _top_up(self) -> None:
        """Warm-ups started until the pool, warm or coming, is `pool_size` again (never
        more: a call refused or timed out leaves no extra process behind)."""
        while not self._closing and self._warm.qsize() + self._coming < self.conf.pool_size:
            self._refill()

    async def _warm_one(self) -> None:
        try:
            self._short += 1
            try:
                ticket = await self.processes.pooled(self.name)
            finally:
                self._short -= 1
            conn = self._new(restart=False)
            self._pooled[conn] = ticket
            try:
                await _started(conn)
            except BaseException:
                del self._pooled[conn]
                ticket.release()
                raise
            self._warm.put_nowait(conn)
        finally:
            self._coming -= 1

    def _spawn(self, coro: Any, name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._reap)

    def _reap(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("upstream.pool_spawn_failed", upstream=self.name,
                        error=str(task.exception()))


async def _started(conn: Connection) -> dict[str, Any]:
    """`conn` started and ready: what its server said of itself; closed when it never
    gets there (its process goes)."""
    conn.start()
    try:
        return await conn.wait_ready()
    except BaseException:
        await conn.close()
        raise


def build(name: str, conf: UpstreamConf, max_message_bytes: int,
          counters: Counters | None = None, queues: Queues | None = None,
          processes: Processes | None = None, answers: AnswerBytes | None = None) -> Backend:
    kind: type[Backend] = {"shared": Shared, "client": PerClient,
                           "call": PerCall}[conf.isolation]
    return kind(name, conf, max_message_bytes, counters, queues, processes, answers)
