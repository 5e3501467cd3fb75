"""Per-tool task policy (INTERFACE.md: modes never / auto / always / required and their
timings), from `tasks:` globally and per upstream, by exact name first, then by glob in the
order written; each level overrides the defaults field by field."""

from __future__ import annotations

import statistics
from collections import defaultdict, deque
from dataclasses import dataclass
from fnmatch import fnmatchcase

from cachetools import LRUCache

from gateway.settings import TaskPolicy, TaskPolicyOverride, Tasks

POLL_FLOOR_MS = 250  # never suggest polling faster than this
POLL_CEILING_MS = 30_000
HISTORY = 20  # durations remembered per tool


@dataclass(frozen=True, slots=True)
class Policy:
    mode: str
    sync_budget_ms: int
    ttl_ms: int
    max_ttl_ms: int
    poll_interval_ms: int
    timeout_ms: int | None
    immediate_response: str | None = None
    scopes: frozenset[str] = frozenset()  # with OAuth: what a token needs to use the tool

    def ttl(self, requested: int | None) -> int:
        """The TTL a task gets: what was asked (or the default), clamped to the maximum."""
        wanted = self.ttl_ms if requested is None or requested <= 0 else requested
        return min(wanted, self.max_ttl_ms)


class Policies:
    def __init__(self, tasks: Tasks, per_upstream: dict[str, Tasks | None]) -> None:
        self.tasks = tasks
        self.per_upstream = per_upstream
        # Settings never change: remember answers (tool names come from clients: bounded).
        self._known: LRUCache[tuple[str, str], Policy] = LRUCache(4096)

    def for_tool(self, upstream: str, tool: str) -> Policy:
        policy = self._known.get((upstream, tool))
        if policy is None:
            policy = self._known[upstream, tool] = self._resolve(upstream, tool)
        return policy

    def _resolve(self, upstream: str, tool: str) -> Policy:
        merged = self.tasks.defaults.model_dump()
        local = self.per_upstream.get(upstream)
        layers = [self.tasks] + ([local] if local is not None else [])
        if local is not None:
            merged.update(local.defaults.model_dump(exclude_unset=True))
        for layer in layers:
            override = _match(layer.tools, tool)
            if override is not None:
                merged.update(override.model_dump(exclude_none=True))
        merged["scopes"] = frozenset(merged["scopes"])
        return Policy(**merged)


def _match(tools: dict[str, TaskPolicyOverride], tool: str) -> TaskPolicyOverride | None:
    if tool in tools:
        return tools[tool]
    return next((o for pattern, o in tools.items() if fnmatchcase(tool, pattern)), None)


class PollAdvisor:
    """Poll intervals learned from how long each tool's tasks take."""

    def __init__(self) -> None:
        self.durations: defaultdict[str, deque[float]] = defaultdict(lambda: deque(maxlen=HISTORY))

    def record(self, tool: str, seconds: float) -> None:
        self.durations[tool].append(seconds)

    def suggest(self, tool: str, configured: int) -> int:
        """From the policy until a tool has history; then a quarter of its median duration,
        within [POLL_FLOOR_MS, POLL_CEILING_MS]: fast tools are polled soon, slow ones
        less often."""
        seen = self.durations.get(tool)
        if not seen or len(seen) < 3:
            return configured
        median_ms = statistics.median(seen) * 1000
        return int(min(POLL_CEILING_MS, max(POLL_FLOOR_MS, median_ms / 4)))


__all__ = ["Policies", "Policy", "PollAdvisor", "TaskPolicy"]
