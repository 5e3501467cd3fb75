"""Who wants to hear of a task's changes (core tasks/result waiters and input relays, listen
streams), by task id; told by the engine as changes happen in this process."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from gateway.tasks.model import Task

Watcher = Callable[[Task], None]


class Watchers:
    """Who wants to hear of a task's changes (core links, listen streams), by task id."""

    def __init__(self) -> None:
        self._by_task: defaultdict[str, set[Watcher]] = defaultdict(set)

    def watch(self, task_id: str, fn: Watcher) -> None:
        self._by_task[task_id].add(fn)

    def unwatch(self, task_id: str, fn: Watcher) -> None:
        fns = self._by_task.get(task_id)
        if fns is not None:
            fns.discard(fn)
            if not fns:
                del self._by_task[task_id]

    def watching(self, task_id: str) -> bool:
        return task_id in self._by_task

    def ids(self) -> list[str]:
        return list(self._by_task)

    def tell(self, task: Task) -> None:
        for fn in list(self._by_task.get(task.id, ())):
            fn(task)
