"""Timers for what is mostly over within a tick (issue 54): a call's keep-alive switch, its
request timeout and its sync budget are armed only once it has waited a whole tick
unanswered. Most calls are answered sooner and arm none: on uvloop a timer is a libuv handle
made, started, stopped and closed, and an echo's two were 6% of its CPU (bench/below_ab.py).

An exchange asks to be watched (`watch`), noting each timer's deadline; one or two ticks
later, still waiting, it is told `late()` and arms them for those deadlines: each fires when
it would have, in the request's context. A time shorter than `LAZY_MIN_S` is armed at once.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

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
        if self._handle is None:
            self._handle = asyncio.get_running_loop().call_later(TICK_S, self._tick)
        self.young.add(who)
        return self.young

    def _tick(self) -> None:
        late, self.old, self.young = self.old, self.young, set()
        self._handle = asyncio.get_running_loop().call_later(TICK_S, self._tick) \
            if self.old else None
        for who in late:
            who.late()


__all__ = ["LAZY_MIN_S", "TICK_S", "Laggards", "Late"]
