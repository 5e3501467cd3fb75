"""Timers for what is mostly over within a tick (issue 54): a call's keep-alive switch, its
request timeout and its sync budget, a task's ttl and time bound, are armed only once it has
waited a whole tick unfinished. Most calls and tasks end sooner and arm none: on uvloop a
timer is a libuv handle made, started, stopped and closed, and an echo's two were 6% of its
CPU (bench/below_ab.py).

What defers its timers (`Deferring`: an exchange, a task's run) notes their deadlines and
asks to be watched; one or two ticks later, still unfinished, it is told `late()` and arms
them for those deadlines: each fires when it would have, in the context it was asked for in
(a request's metrics marker, log and trace context). A time shorter than `LAZY_MIN_S` is
armed at once.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable
from typing import Protocol

from gateway.observability import log

TICK_S = 0.05
# A watched exchange is told late one to two ticks after it asked: a shorter time is armed
# when asked for, so that no deadline passes before its timer is armed.
LAZY_MIN_S = 2 * TICK_S


class Late(Protocol):
    def late(self) -> None:
        """It has waited a whole tick: arm what it deferred."""


class Laggards:
    """What waits now (`young`) and what waited through the last tick (`old`); each still
    there at the next tick is told `late()`. A tick runs only while something waits."""

    __slots__ = ("_handle", "old", "young")

    def __init__(self) -> None:
        self.young: set[Late] = set()
        self.old: set[Late] = set()
        self._handle: asyncio.TimerHandle | None = None

    def watch(self, who: Late) -> set[Late]:
        """Watch `who`; the set it leaves (`discard`) once over, before it is late."""
        if self._handle is None:  # in no request's context: the tick outlives the one arming it
            self._handle = asyncio.get_running_loop().call_later(
                TICK_S, self._tick, context=contextvars.Context())
        self.young.add(who)
        return self.young

    def _tick(self) -> None:
        late, self.old, self.young = self.old, self.young, set()
        loop = asyncio.get_running_loop()
        self._handle = loop.call_later(TICK_S, self._tick, context=contextvars.Context()) \
            if self.old else None
        for who in late:
            try:  # one failing must not leave the others' timers unarmed
                who.late()
            except Exception as exc:  # a fault of the gateway's: said, and the tick goes on
                log.error("timers.late_failed", error=f"{type(exc).__name__}: {exc}")


class Deferring:
    """A base for what defers its timers: each asked for through `_due` (the one place that
    decides whether a timer waits), watched from the first, told `late()` once (the
    override arms what it deferred, with `_at`), or let go when it ends first (`_unwatch`)."""

    __slots__ = ("_context", "_late", "_watched")

    def __init__(self) -> None:
        self._watched: set[Late] | None = None  # the set it is watched in
        self._late = False  # told late: its timers are armed when asked for from now on
        self._context: contextvars.Context | None = None  # where they were asked for

    def _due(self, seconds: float, laggards: Laggards) -> float | None:
        """The deadline (loop time) of a timer of `seconds` that waits to be armed until
        this is late, watched by `laggards` from now on; None when it is to be armed now:
        shorter than `LAZY_MIN_S`, or asked for once this is late already."""
        if seconds < LAZY_MIN_S or self._late:
            return None
        if self._watched is None:
            self._watched = laggards.watch(self)
            self._context = contextvars.copy_context()
        return asyncio.get_running_loop().time() + seconds

    def _unwatch(self) -> None:
        if self._watched is not None:
            self._watched.discard(self)
            self._watched = None

    def _at(self, due: float, callback: Callable[..., object], *args: object
            ) -> asyncio.TimerHandle:
        """A deferred timer armed for its deadline `due` (loop time), in its context."""
        return asyncio.get_running_loop().call_at(due, callback, *args, context=self._context)

    def late(self) -> None:
        self._watched, self._late = None, True


__all__ = ["LAZY_MIN_S", "TICK_S", "Deferring", "Laggards", "Late"]
