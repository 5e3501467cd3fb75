"""What a call holds, taken in one place and given back once: its `Lease`.

A call forwarded upstream holds, in this order, its principal's call slot (`InFlight`:
`limits.max_calls_per_owner`), the server process isolation picks for it (`Backend.
for_request`: a warm process under `isolation: call`, with a place of the principal's
process share) and its place under the concurrency limits (a queue `Ticket`). Each is
taken by the lease (`Leases.take`, `Lease.connect`, `Lease.queue`) and all are given back
by one idempotent `release` (httpcore's `PoolByteStream.aclose` with its closed flag is the
model): the exchange's or the task's `done` once the call is handed on (`hand`), else the
end of the `with lease:` block that took it, whatever ended it (a refusal, an error, a
cancel). So the four ways a call goes upstream (legacy and modern, inline and as a task)
differ only in how they word a refusal.

`Leases` knows every lease alive on this replica: the drain (drain.py) stops new calls
(`stop`: a new tools/call is refused with `GatewayStopping`; calls still waiting in a queue
are refused so), and waits for the running ones to end (`idle`).
"""

from __future__ import annotations

import asyncio
import contextlib
from types import TracebackType
from typing import Any

from gateway import errors
from gateway.answer_bytes import AnswerBytes
from gateway.protocol import mcp
from gateway.queues import Ticket
from gateway.ratelimit import InFlight
from gateway.router import PolicyFor
from gateway.upstream.connection import Connection
from gateway.upstream.correlator import Call, Owner
from gateway.upstream.isolation import Backend


class Lease:
    """One call's holdings: its principal's slot from the start, then its process and its
    queue place once taken; `release` gives back what it holds, once."""

    __slots__ = ("_backend", "_closed", "_handed", "_home", "_leases", "call", "principal",
                 "ticket", "used")

    def __init__(self, leases: Leases, principal: str) -> None:
        self._leases = leases
        self.principal = principal
        self._backend: Backend | None = None
        self._home: Connection | None = None
        self.used: Connection | None = None  # the process the call goes to
        self.ticket: Ticket | None = None
        self.call: Call | None = None  # once handed on (the drain refuses it while queued)
        self._handed = False
        self._closed = False

    async def connect(self, backend: Backend, home: Connection, owner: Owner, method: str
                      ) -> Connection:
        """The connection the call goes to: `home`, or a process isolation picks for it
        (UpstreamError, TooManyProcesses: nothing more is held). Asked again (a task that
        could not be made, the call then answered inline), the one it holds: never a
        second process the release would not give back."""
        if self.used is None:
            self._backend, self._home = backend, home
            self.used = await backend.for_request(home, owner, method)
        return self.used

    def queue(self, msg: dict[str, Any], policy_for: PolicyFor) -> Ticket | None:
        """A tools/call's place under its tool's concurrency limit and its server's; None
        for other methods, or no limit; QueueFull when it would wait in a full queue;
        GatewayStopping when the drain began since the lease was taken (it waited for a
        process or for its upstream: it is still not sent)."""
        backend = self._backend
        if backend is None or msg["method"] != mcp.TOOLS_CALL:
            return None
        if self._leases.stopping:  # the drain began while it waited for its process
            raise errors.GatewayStopping()
        if self.ticket is not None:  # asked again: the place of a call never sent goes
            self.ticket.release()
        tool = str((msg.get("params") or {}).get("name") or "")
        self.ticket = backend.ticket(self.principal, policy_for(tool).limit(backend.name))
        return self.ticket

    @property
    def queued(self) -> bool:
        return self.ticket is not None and self.ticket.queued

    def hand(self, call: Call) -> Lease:
        """The lease goes with `call`, sent, from here: its `release` is the exchange's or
        the task's `done`, and the `with` block that took it no longer gives it back."""
        self.call, self._handed = call, True
        return self

    def release(self) -> None:
        """Everything it holds goes back, once, whoever calls (the answer, a refusal, a
        cancel, the client leaving, a task's end)."""
        if self._closed:
            return
        self._closed = True
        if self.ticket is not None:
            self.ticket.release()
        if self._backend is not None and self._home is not None and self.used is not None:
            self._backend.done(self._home, self.used)
        # The call names its exchange, whose `done` is this lease: a cycle that would keep
        # a finished request's answer until the garbage collector runs.
        self.call = self.ticket = self.used = self._home = None
        leases = self._leases
        del leases.live[self]
        leases.inflight.release(self.principal)
        if not leases.live and leases.idle_event is not None:
            leases.idle_event.set()

    def __call__(self) -> None:  # a `done` callback
        self.release()

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if not self._handed:  # refused, failed or cancelled before its call was handed on
            self.release()


class Leases:
    """Every lease alive on this replica, and whether new calls are still taken."""

    def __init__(self, inflight: InFlight) -> None:
        self.inflight = inflight
        self.live: dict[Lease, None] = {}  # oldest first
        self.answers: AnswerBytes = inflight.answers
        self.stopping = False
        self.idle_event: asyncio.Event | None = None  # set when the last lease goes

    def take(self, principal: str, method: str) -> Lease:
        """A lease on one more call of `principal`: GatewayStopping for a new tools/call
        once the gateway stops (nothing is held, nothing sent upstream); TooManyRequests
        over the principal's calls in flight."""
        if self.stopping and method == mcp.TOOLS_CALL:
            raise errors.GatewayStopping()
        self.inflight.take(principal)
        lease = Lease(self, principal)
        self.live[lease] = None
        return lease

    def stop(self) -> int:
        """No new tools/call from now on; calls still waiting in a queue are refused as
        stopping (they would otherwise hold the drain). How many were refused."""
        self.stopping = True
        queued = [lease for lease in self.live if lease.queued and lease.call is not None]
        for lease in queued:
            call = lease.call
            assert call is not None
            call.conn.cancel(call, "the gateway is stopping")
            call.answer(errors.GatewayStopping().to_message(call.client_id))
        return len(queued)

    async def idle(self, timeout_s: float) -> int:
        """Once no lease is alive, or `timeout_s` passed: how many are still alive."""
        if self.live:
            self.idle_event = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.idle_event.wait(), timeout_s)
        return len(self.live)

    def status(self) -> dict[str, Any]:
        """For /readyz's detail: calls holding a lease, those of them queued, and whether
        new calls are taken."""
        return {"in_flight": len(self.live),
                "queued": sum(lease.queued for lease in self.live),
                "stopping": self.stopping}


__all__ = ["Lease", "Leases"]
