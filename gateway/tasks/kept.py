"""Finished tasks' answers, serialized once and kept until their ttl (docs/performance.md).

A finished task never changes again (model.TRANSITIONS: a terminal state maps to nothing),
so its tasks/get answer is the same bytes at every read. The first read renders them (and
marks the task delivered, as any read of a result does); later reads by its owner are served
from here, after only what must run for every request (auth, envelope, the scopes of its
tool, the tasks/* rate). The bytes are opaque here: the dialects render them.

Bounded (docs/limits.md): an answer over ENTRY_BYTES is not kept (it costs its bytes to
send whatever is saved), all of them take at most KEPT_BYTES, the least recently read
leave first, and each leaves at its task's ttl, after which the store's answer ("expired",
then unknown) is the right one. An entry answers its owner alone: another principal's look-up
misses and takes the ordinary path, which answers as for an unknown id.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from cachetools import TLRUCache

from gateway.tasks.model import Dialect, Task

KEPT_BYTES = 4 * 1024 * 1024  # all kept answers of a process
ENTRY_BYTES = 64 * 1024  # the largest answer kept
_RECORD_BYTES = 200  # what an entry costs beside its answer (key, record, cache links)


@dataclass(frozen=True, slots=True)
class Kept:
    owner: str
    tool: str  # a caller lacking its scopes is refused on the ordinary path
    answer: bytes  # the JSON-RPC result, serialized
    expires_at: float


def _expiry(_key: object, kept: Kept, _now: float) -> float:
    return kept.expires_at


def _size(kept: Kept) -> int:
    return len(kept.answer) + _RECORD_BYTES


class KeptAnswers:
    """(dialect, method, task id) -> the finished task's answer to that method."""

    def __init__(self, clock: Callable[[], float] = time.time,
                 max_bytes: int = KEPT_BYTES) -> None:
        self._answers: TLRUCache[tuple[str, str, str], Kept] = TLRUCache(
            max_bytes, _expiry, timer=clock, getsizeof=_size)

    def get(self, dialect: Dialect, method: str, task_id: str, owner: str) -> Kept | None:
        kept = self._answers.get((dialect, method, task_id))
        return kept if kept is not None and kept.owner == owner else None

    def keep(self, method: str, task: Task, answer: bytes) -> None:
        """`answer`, the finished `task`'s to `method`, for its owner's next reads."""
        if not task.terminal or len(answer) > ENTRY_BYTES:
            return
        end = task.expires_at
        self._answers[task.dialect, method, task.id] = Kept(
            task.owner, task.tool, answer, math.inf if end is None else end)

    def __len__(self) -> int:
        return len(self._answers)
