"""The replay budget: how many bytes the SSE streams of every legacy session keep for
clients that resume, per principal (`limits.replay_bytes_per_principal`) and together
(`limits.replay_budget_bytes`); one budget per process.

Each stream keeps its own last events (`replay_events`, `replay_bytes`, sse.py); this bounds
their sum, which would otherwise grow with sessions x MAX_STREAMS x replay_bytes (issue 29:
60 answers of 2 MiB kept 120 MiB resident for good). The rules:

- A stream whose every event was written (its request answered) keeps them `replay_linger_ms`
  more, for a client that lost the end on the way to resume, and then sheds them: memory
  falls back once answers are delivered.
- Streams shed what no reader waits for (sse.Stream.shed), least recently pushed first. A
  principal over its share sheds its own: its other streams, then the pushing stream's older
  events (the newest stays). Over the budget in all, the same first, and only then anyone's
  streams. A principal that floods loses its own replay before another's.

Per event the cost is a few dict operations; shedding walks streams only while over a bound.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable

from gateway.downstream.sse import Stream
from gateway.observability import log

Excess = Callable[[], int]  # bytes over a bound, now


class ReplayBudget:
    def __init__(self, limit: int, linger_s: float, per_principal: int | None = None) -> None:
        self.limit = limit
        self.per_principal = per_principal or limit
        self.linger_s = linger_s
        self.bytes = 0
        self.bytes_of: dict[str, int] = {}  # per principal, those holding some
        self._principal: dict[Stream, str] = {}  # every stream counted here
        self._lru: OrderedDict[Stream, None] = OrderedDict()  # those holding bytes
        self._lru_of: dict[str, OrderedDict[Stream, None]] = {}  # the same, per principal
        self._delivered: deque[tuple[float, Stream]] = deque()  # (when to shed, stream)
        self._timer: asyncio.TimerHandle | None = None

    def enter(self, stream: Stream, principal: str) -> None:
        """Count `stream`'s bytes from now on, as `principal`'s."""
        self._principal[stream] = principal
        stream.budget = self

    def forget(self, stream: Stream) -> None:
        """`stream` can no longer be resumed (its session ended, or it was one too many):
        its bytes leave the budget, whatever it still holds for a reader."""
        principal = self._principal.pop(stream, None)
        if principal is None:
            return
        stream.budget = None
        self._count(principal, -stream.bytes)
        self._unlist(stream, principal)

    # -- Budget (sse.py) ---------------------------------------------------------------------
    def grew(self, stream: Stream, delta: int) -> None:
        principal = self._principal[stream]
        self._count(principal, delta)
        self._lru[stream] = None
        self._lru.move_to_end(stream)
        mine = self._lru_of.setdefault(principal, OrderedDict())
        mine[stream] = None
        mine.move_to_end(stream)
        if self.bytes_of.get(principal, 0) > self.per_principal:
            self._shed_own(stream, principal,
                           lambda: self.bytes_of.get(principal, 0) - self.per_principal)
        if self.bytes > self.limit:
            def over() -> int:
                return self.bytes - self.limit
            self._shed_own(stream, principal, over)
            self._free_all(self._lru, stream, over)

    def delivered(self, stream: Stream) -> None:
        if stream not in self._principal:
            return
        self._delivered.append((time.monotonic() + self.linger_s, stream))
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.linger_s, self._linger)

    # -- shedding ----------------------------------------------------------------------------
    def _shed_own(self, pushing: Stream, principal: str, excess: Excess) -> None:
        """The principal's other streams, then the pushing stream's older events."""
        self._free_all(self._lru_of.get(principal, ()), pushing, excess)
        if excess() > 0:
            self._count(principal, -pushing.trim(excess()))
        log.debug("replay.shed", principal=principal[:12], bytes=self.bytes,
                  principal_bytes=self.bytes_of.get(principal, 0))

    def _free_all(self, held: Iterable[Stream], pushing: Stream, excess: Excess) -> None:
        for stream in list(held):
            if excess() <= 0:
                return
            if stream is not pushing:
                self._free(stream)

    def _free(self, stream: Stream) -> None:
        principal = self._principal[stream]
        self._count(principal, -stream.shed())
        if not stream.buffer:
            self._unlist(stream, principal)

    def _count(self, principal: str, delta: int) -> None:
        self.bytes += delta
        held = self.bytes_of.get(principal, 0) + delta
        if held:
            self.bytes_of[principal] = held
        else:
            self.bytes_of.pop(principal, None)

    def _unlist(self, stream: Stream, principal: str) -> None:
        self._lru.pop(stream, None)
        mine = self._lru_of.get(principal)
        if mine is not None:
            mine.pop(stream, None)
            if not mine:
                del self._lru_of[principal]

    def _linger(self) -> None:
        """Delivered streams whose linger passed shed their events."""
        self._timer = None
        now = time.monotonic()
        while self._delivered and self._delivered[0][0] <= now:
            _, stream = self._delivered.popleft()
            if stream in self._principal:
                self._free(stream)
        if self._delivered:
            self._timer = asyncio.get_running_loop().call_later(
                self._delivered[0][0] - now, self._linger)
