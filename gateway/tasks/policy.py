"""Per-tool task policy (docs/configuration.md, `tasks.defaults`: modes never / auto / always /
required and their timings), from `tasks:` globally and per upstream: every entry matching
a tool applies key by key over the defaults (curation.matching: its exact name first, then
globs in the order written). A tool
is known here by the server's name; a renamed tool's entry under the name clients see
(tasks/curation.py) is found too, and wins key by key over the one under the server's."""

from __future__ import annotations

import hashlib
from collections import defaultdict, deque
from collections.abc import Collection
from dataclasses import asdict, dataclass, fields, replace
from fnmatch import fnmatchcase

import orjson

from gateway.observability import log
from gateway.queues import Limit
from gateway.settings.schema import (
    Settings,
    TaskMode,
    TaskPolicy,
    TaskPolicyOverride,
    Tasks,
    UpstreamTasks,
)
from gateway.tasks.curation import MASK, Curation, matching

KNOWN_POLICIES = 4096  # (upstream, tool) policies remembered
_GLOB = frozenset("*?[")  # what makes a tools key a pattern (fnmatch)
POLL_FLOOR_MS = 250  # never suggest polling faster than this
POLL_CEILING_MS = 30_000
HISTORY = 20  # durations remembered per tool


@dataclass(frozen=True, slots=True)
class Policy:
    mode: TaskMode
    sync_budget_ms: int
    ttl_ms: int
    max_ttl_ms: int
    poll_interval_ms: int
    timeout_ms: int | None
    immediate_response: str | None = None
    scopes: frozenset[str] = frozenset()  # with OAuth: what a token needs to use the tool
    max_concurrency: int | None = None
    max_queue: int = 100
    lane: str = ""  # what shares the concurrency limit: the pattern that set it, or the tool
    called: str = ""  # the name clients call the tool by, where curation renames it

    def limit(self, upstream: str) -> Limit | None:
        """The tool's concurrency limit, if it has one."""
        if self.max_concurrency is None:
            return None
        return Limit(upstream, self.lane, self.max_concurrency, self.max_queue,
                     # a lane named without a glob is the tool's own: named as clients call it
                     shown="" if _GLOB.intersection(self.lane) else self.called)

    def ttl(self, requested: int | None) -> int:
        """The ttl a task gets (issue 40): what was asked (or `ttl_ms`) as the retention
        of its result, counted from the latest its run can end (`timeout_ms`), so no
        running task expires on a client's guess of how long the tool takes (the Python
        SDK 1.x asks 60 s whatever the tool); `max_ttl_ms` is the hard cap. spec
        2025-11-25 (Task Creation): a receiver MAY override the requested ttl and MUST
        report the actual one (the task answers carry it). With no time bound at all a
        run may last up to the cap, so the cap is its ttl."""
        wanted = self.ttl_ms if requested is None or requested <= 0 else requested
        if self.timeout_ms is None:
            return self.max_ttl_ms
        return min(self.timeout_ms + wanted, self.max_ttl_ms)


class Policies:
    def __init__(self, tasks: Tasks, per_upstream: dict[str, UpstreamTasks | None],
                 request_timeouts: dict[str, int | None] | None = None) -> None:
        self.tasks = tasks
        self.per_upstream = per_upstream
        # Each upstream's `request_timeout_ms`: a task's time bound where its tool sets no
        # `timeout_ms` (a task's call is bounded like an inline one).
        self.request_timeouts = request_timeouts or {}
        # Settings never change: remember answers (tool names come from clients: bounded,
        # the oldest forgotten first; a plain dict's C lookup, where cachetools' LRUCache
        # took four Python calls a request: bench/calls.py).
        self._known: dict[tuple[str, str], Policy] = {}
        self._curations: dict[str, Curation] = {}

    @classmethod
    def of(cls, conf: Settings) -> Policies:
        return cls(conf.tasks, {n: u.tasks for n, u in conf.upstreams.items()},
                   {n: u.request_timeout_ms for n, u in conf.upstreams.items()})

    def _layers(self, upstream: str) -> list[Tasks | UpstreamTasks]:
        """`upstream`'s policy layers: the global one, then its own if it has one."""
        local = self.per_upstream.get(upstream)
        return [self.tasks, *([local] if local else [])]

    def scopes(self, upstream: str | None = None) -> frozenset[str]:
        """Every scope a tool policy names: of `upstream`'s tools (where some are named,
        its tools/list varies per token), or of every upstream's (the protected resource
        metadata's scopes_supported)."""
        layers: list[Tasks | UpstreamTasks] = self._layers(upstream) \
            if upstream is not None else [self.tasks, *filter(None, self.per_upstream.values())]
        return frozenset(s for layer in layers for s in layer.defaults.scopes or ()) | {
            s for layer in layers for e in layer.tools.values() for s in e.scopes or ()}

    def digest(self) -> str:
        """A digest of every per-tool entry (global and per upstream): what decides who sees
        and calls which tool, and how. Replicas sharing a store each apply their own
        settings (docs/replicas.md): operators compare this, shown on /readyz?detail and
        logged at start, to find a replica whose tools differ."""
        entries = {"*": self.tasks.tools, **{up: t.tools for up, t in
                                             sorted(self.per_upstream.items()) if t}}
        shown = {where: {k: asdict(e) for k, e in tools.items()}
                 for where, tools in entries.items()}
        return hashlib.sha256(orjson.dumps(shown)).hexdigest()[:16]

    def curation(self, upstream: str) -> Curation:
        """How clients see `upstream`'s tools (its entries over the global ones)."""
        found = self._curations.get(upstream)
        if found is None:
            found = self._curations[upstream] = Curation(
                [layer.tools for layer in self._layers(upstream)])
        return found

    def for_tool(self, upstream: str, tool: str) -> Policy:
        policy = self._known.get((upstream, tool))
        if policy is None:
            if len(self._known) >= KNOWN_POLICIES:
                del self._known[next(iter(self._known))]
            policy = self._known[upstream, tool] = self._resolve(upstream, tool)
        return policy

    def _resolve(self, upstream: str, tool: str) -> Policy:
        if tool.endswith(MASK):  # a name no client may call (curation.py): judged, and
            # named in refusals, as the name called, as a tool the server lacks would be
            called = tool[:-len(MASK)]
            return replace(self._resolve(upstream, called), called=called)
        return self._policy(upstream, tool)

    def _policy(self, upstream: str, tool: str) -> Policy:
        merged = asdict(self.tasks.defaults)
        local = self.per_upstream.get(upstream)
        layers = self._layers(upstream)
        if local is not None:  # the upstream's defaults, over the global ones (a null
            # given there clears the global value: `timeout_ms: null`, no timeout)
            merged.update({key: getattr(local.defaults, key) for key in local.defaults.given})
        merged["lane"] = tool  # a limit of the defaults: each tool has its own
        for layer in layers:
            for pattern, override in reversed(matching(layer.tools, tool)):
                merged.update(_given(override))
                if override.max_concurrency is not None:
                    merged["lane"] = pattern  # the tools it names share the limit
        shown_as = self.curation(upstream).renamed.get(tool, tool)
        for layer in layers if shown_as != tool else ():  # the name clients see wins
            if (entry := layer.tools.get(shown_as)) is not None:
                merged.update(_given(entry))
        merged["called"] = shown_as if shown_as != tool else ""
        merged["scopes"] = frozenset(merged["scopes"])
        if merged["timeout_ms"] is None:
            merged["timeout_ms"] = self.request_timeouts.get(upstream)
        return Policy(**merged)


class Unmatched:
    """Per-tool entries (`tasks.tools`, `upstreams.<name>.tasks.tools`) that match no tool
    an upstream lists: a typo until proven otherwise (issue 53: an entry for
    `trigger-long-runing-operation` applied to nothing, silently). Checked each time an
    upstream's tools/list is learned (`learned`); each found is logged once
    (`tasks.tool_unmatched`) and kept for the operator pages (`found`: by upstream, `*` for
    the global entries, judged once every upstream has listed its tools)."""

    def __init__(self, policies: Policies, upstreams: Collection[str]) -> None:
        self._policies = policies
        self._listed: dict[str, frozenset[str]] = dict.fromkeys(upstreams, frozenset())
        self._heard: set[str] = set()
        self.found: dict[str, list[str]] = {}
        self._told: set[tuple[str, str]] = set()

    def learned(self, upstream: str, tools: Collection[str]) -> None:
        """`upstream` lists `tools` now (an entry may name one by its new name too)."""
        renamed = self._policies.curation(upstream).renamed
        self._listed[upstream] = frozenset(tools) | {renamed[t] for t in tools if t in renamed}
        self._heard |= {upstream}
        local = self._policies.per_upstream.get(upstream)
        self._judge(upstream, local.tools if local else {}, self._listed[upstream])
        if self._heard >= self._listed.keys():
            every = frozenset().union(*self._listed.values())
            self._judge("*", self._policies.tasks.tools, every)

    def _judge(self, where: str, entries: Collection[str], tools: frozenset[str]) -> None:
        missing = [p for p in entries if not any(fnmatchcase(t, p) for t in tools)]
        if missing:
            self.found[where] = missing
        else:
            self.found.pop(where, None)
        for pattern in missing:
            if (where, pattern) not in self._told:
                self._told.add((where, pattern))
                log.warning("tasks.tool_unmatched", upstream=where, pattern=pattern,
                            listed=len(tools))


def _given(override: TaskPolicyOverride) -> dict[str, object]:
    """The policy keys an override sets (left out or null: the layer below holds; a tool
    entry's curation keys are not policy)."""
    return {f.name: value for f in _POLICY_FIELDS
            if (value := getattr(override, f.name)) is not None}


_POLICY_FIELDS = fields(TaskPolicyOverride)


def _median(values: deque[float]) -> float:
    """statistics.median, without the 0.5 MiB resident that module (with decimal and
    fractions) costs a serving process."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def queued_poll_ms(configured: int, expected_wait_s: float | None) -> int:
    """While a call waits in a queue: half its expected wait, no sooner than configured,
    within POLL_CEILING_MS (a client polls a long queue less often)."""
    if expected_wait_s is None:
        return configured
    return int(min(POLL_CEILING_MS, max(configured, expected_wait_s * 500)))


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
        median_ms = _median(seen) * 1000
        return int(min(POLL_CEILING_MS, max(POLL_FLOOR_MS, median_ms / 4)))


__all__ = ["Policies", "Policy", "PollAdvisor", "TaskPolicy", "queued_poll_ms"]
