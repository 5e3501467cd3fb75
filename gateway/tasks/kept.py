"""Finished tasks' answers, serialized once and kept until their ttl (docs/performance.md).

A finished task never changes again (model.TRANSITIONS: a terminal state maps to nothing),
so its tasks/get answer is the same bytes at every read. The first read renders them (and
marks the task delivered, as any read of a result does); later reads by its owner are served
from here, after only what must run for every request (auth, envelope, the scopes of its
tool, the tasks/* rate). The bytes are opaque here: the dialects render them.

Bounded (docs/limits.md): an answer over ENTRY_BYTES is not kept (it costs its bytes to
send whatever is saved), all of them take at most KEPT_BYTES, the least recently read
leave first, and each leaves at its task's ttl or once the store no longer holds the task
(a read task evicted to make room: docs/limits.md), after which the store's answer
("expired", "not found") is the right one. An entry answers its owner alone: another
principal's look-up misses and takes the ordinary path, which answers as for an unknown id.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

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


class KeptAnswers:
    """(dialect, method, task id) -> the finished task's answer to that method; least
    recently read first (a plain ordered dict: cachetools' TLRUCache cost a tasks/get ~2 us
    more than the answer it keeps saves: docs/performance.md)."""

    def __init__(self, holds: Callable[[str], bool], clock: Callable[[], float] = time.time,
                 max_bytes: int = KEPT_BYTES) -> None:
        self._holds = holds  # the store's: whether it still holds a task's record
        self._clock = clock
        self._max_bytes = max_bytes
        self._bytes = 0
        self._answers: OrderedDict[tuple[str, str, str], Kept] = OrderedDict()

    def get(self, dialect: Dialect, method: str, task_id: str, owner: str) -> Kept | None:
        key = (dialect, method, task_id)
        kept = self._answers.get(key)
        if kept is None:
            return None
        if kept.expires_at <= self._clock() or not self._holds(task_id):
            self._drop(key)  # its ttl passed, or the store let it go to make room: the
            return None  # store's answer ("expired", "not found") is the right one
        self._answers.move_to_end(key)
        return kept if kept.owner == owner else None

    def keep(self, method: str, task: Task, answer: bytes) -> None:
        """`answer`, the finished `task`'s to `method`, for its owner's next reads."""
        end = task.expires_at
        if not task.terminal or len(answer) > ENTRY_BYTES or \
                (end is not None and end <= self._clock()):
            return
        key = (task.dialect, method, task.id)
        self._drop(key)
        self._answers[key] = Kept(task.owner, task.tool, answer,
                                  math.inf if end is None else end)
        self._bytes += _size(answer)
        while self._bytes > self._max_bytes:
            self._drop(next(iter(self._answers)))

    def _drop(self, key: tuple[str, str, str]) -> None:
        if (kept := self._answers.pop(key, None)) is not None:
            self._bytes -= _size(kept.answer)

    def __len__(self) -> int:
        return len(self._answers)


def _size(answer: bytes) -> int:
    return len(answer) + _RECORD_BYTES
