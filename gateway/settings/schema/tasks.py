"""The `tasks:` section: how calls of a tool become tasks, by default and per tool; and an
upstream's own `tasks:` over it (`upstreams.<name>.tasks`), where a null clears the global
value.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Annotated, Any, Literal

from annotated_types import Ge

from gateway.settings.rules import Rule
from gateway.settings.schema.base import _Model, doc

TaskMode = Literal["never", "auto", "always", "required"]


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskPolicy(_Model):
    """How calls of a tool become tasks (docs/tasks.md, Task modes)."""

    mode: TaskMode = field(default="auto",
        metadata=doc("never, auto (a task once sync_budget_ms passes), always or required: "
            "docs/tasks.md, Task modes"))
    sync_budget_ms: Annotated[int, Ge(0)] = field(default=1000,
        metadata=doc("auto: how long a call may run inline before it becomes a task"))
    ttl_ms: Annotated[int, Ge(1)] = field(default=600_000,
        metadata=doc("how long a task's result is kept, unless the client asks another ttl: "
            "a task's ttl is its time bound (timeout_ms) plus this, so no running task "
            "expires first"))
    max_ttl_ms: Annotated[int, Ge(1)] = field(default=3_600_000,
        metadata=doc("the longest ttl a task gets, whatever its time bound and the client "
            "asked (set it low and a long run expires at it)"))
    poll_interval_ms: Annotated[int, Ge(1)] = field(default=1000,
        metadata=doc("suggested to clients; adapted to the tool's recent durations"))
    timeout_ms: Annotated[int | None, Ge(1)] = field(default=None,
        metadata=doc("a running task fails after this long, from when its call runs (null: "
            "the upstream's request_timeout_ms; both null: only max_ttl_ms ends it)"))
    # Text a 2025-11-25 client may show its model at once when a call becomes a task
    # (CreateTaskResult `_meta["io.modelcontextprotocol/model-immediate-response"]`).
    immediate_response: str | None = field(default=None,
        metadata=doc("text a 2025-11-25 client may show its model at once when a call becomes a "
            "task"))
    scopes: list[str] = field(default_factory=list,
        metadata=doc("with auth.oauth: scopes a token needs to call the tool (and to see it "
            "listed, and to read its tasks)"))
    max_concurrency: Annotated[int | None, Ge(1)] = field(default=None,
        metadata=doc("calls of the tool running at once on each replica (set for a pattern: "
            "shared by the tools it names); the rest wait in a queue, fair across "
            "callers (null: no limit)"))
    max_queue: Annotated[int, Ge(0)] = field(default=100,
        metadata=doc("with max_concurrency: calls that may wait; beyond, a call is refused"))


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskPolicyOverride(_Model):
    """A tool's own policy: any key of TaskPolicy; a key left out or null takes the
    default."""

    mode: TaskMode | None = None
    sync_budget_ms: Annotated[int | None, Ge(0)] = None
    ttl_ms: Annotated[int | None, Ge(1)] = None
    max_ttl_ms: Annotated[int | None, Ge(1)] = None
    poll_interval_ms: Annotated[int | None, Ge(1)] = None
    timeout_ms: Annotated[int | None, Ge(1)] = None
    immediate_response: str | None = None
    scopes: list[str] | None = None
    max_concurrency: Annotated[int | None, Ge(1)] = None
    max_queue: Annotated[int | None, Ge(0)] = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolEntry(TaskPolicyOverride):
    """A tool's entry: its policy (any key of TaskPolicy; a key left out or null takes the
    default) and how clients see it (docs/tools.md), a tool's own, never a default."""

    expose: bool | None = field(default=None,
        metadata=doc("false: the tool is neither listed nor callable (a call is answered as "
                     "the server answers an unknown tool)"))
    name: str | None = field(default=None,
        metadata=doc("the name clients see and call (the server gets its own); on an exact "
                     "tool name only"))
    title: str | None = field(default=None, metadata=doc("the listed title, replaced"))
    description: str | None = field(default=None,
        metadata=doc("the listed description, replaced"))
    annotations: dict[str, Any] | None = field(default=None,
        metadata=doc("merged over the server's annotations (readOnlyHint, destructiveHint, "
                     "...)"))

    @property
    def curates(self) -> bool:
        """The entry changes how clients see the tool."""
        return any(getattr(self, key) is not None for key in CURATION_KEYS)


CURATION_KEYS = ("expose", "name", "title", "description", "annotations")


def rename_problem(tools: dict[str, ToolEntry], local: dict[str, ToolEntry], where: str
                   ) -> str | None:
    """What is wrong with the renames one upstream's tools get (`tools`: the global
    entries, `local`: its own over them): a rename on a glob (it would give every tool it
    matches one name), two tools renamed to one name, or a rename onto the exact name of
    another entry that curates a tool of its own (an entry there with policy keys alone is
    the renamed tool's policy). None when nothing is."""
    for key, entry in (*tools.items(), *local.items()):
        if entry.name is not None and any(c in key for c in "*?["):
            return f"{_where(key, local, where)}.name: a glob cannot rename (name one tool)"
    entries = {**tools, **local}
    taken: dict[str, str] = {}
    for key, entry in entries.items():
        if entry.name is None or entry.name == key:
            continue
        if entry.name in taken:
            return (f"{_where(key, local, where)}.name: tools '{taken[entry.name]}' and "
                    f"'{key}' are both renamed '{entry.name}'")
        if entry.name in entries and entries[entry.name].curates:  # policy alone: the
            # renamed tool's, under the name clients see (tasks/policy.py)
            return (f"{_where(key, local, where)}.name: '{key}' is renamed "
                    f"'{entry.name}', another entry's tool name")
        taken[entry.name] = key
    return None


def _where(key: str, local: dict[str, ToolEntry], upstream: str) -> str:
    return f"upstreams.{upstream}.tasks.tools.{key}" if key in local else f"tasks.tools.{key}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Tasks(_Model):
    """Task policies: `defaults`, and per tool name in `tools`."""

    defaults: TaskPolicy = field(default_factory=TaskPolicy,
        metadata=doc("for every tool"))
    tools: dict[str, ToolEntry] = field(default_factory=dict,
        metadata=doc("per tool name, over the defaults (a key left out or null: the "
                     "default); with how clients see the tool (docs/tools.md)"))


# TaskPolicy's keys whose null means "none": no timeout, no immediate response, no limit.
NULLABLE_POLICY_KEYS = frozenset({"timeout_ms", "immediate_response", "max_concurrency"})


def _keys_given(raw: Any) -> Any:
    """Which keys an upstream's `tasks.defaults` names, null ones included: a null there
    clears the global value (tasks/policy.py), so "left out" and "null" differ."""
    if not isinstance(raw, dict):
        return raw
    if "given" in raw:
        raise ValueError("unknown key `given`")
    for key in raw.keys() - NULLABLE_POLICY_KEYS:
        if raw[key] is None and key in {f.name for f in fields(TaskPolicy)}:
            nullable = ", ".join(sorted(NULLABLE_POLICY_KEYS))
            raise ValueError(f"`{key}` cannot be null (only {nullable} can: a null "
                             "clears the global value)")
    return {**raw, "given": frozenset(raw)}


@dataclass(frozen=True, slots=True, kw_only=True)
class UpstreamDefaults(TaskPolicyOverride):
    """An upstream's `tasks.defaults`: a tool's policy, except that a key given as null
    clears the global value (`timeout_ms: null`: this upstream's tasks are bounded by its
    request_timeout_ms only)."""

    given: frozenset[str] = field(default=frozenset(), metadata={"internal": True})

    def __post_init__(self) -> None:
        if not self.given:  # built in code, not from a file: the keys it sets are given
            object.__setattr__(self, "given", frozenset(
                f.name for f in fields(TaskPolicyOverride) if getattr(self, f.name) is not None))


@dataclass(frozen=True, slots=True, kw_only=True)
class UpstreamTasks(_Model):
    """One upstream's task policies, over the global `tasks` field by field: a key left
    out takes the global one; in `defaults`, a null clears it."""

    defaults: Annotated[UpstreamDefaults, Rule(_keys_given, before=True)] = field(
        default_factory=UpstreamDefaults,
        metadata=doc("for every tool of this upstream, over the global `tasks.defaults` (a "
                     "null timeout_ms, immediate_response or max_concurrency clears it)"))
    tools: dict[str, ToolEntry] = field(default_factory=dict,
        metadata=doc("per tool name, over the global `tasks.tools` and these defaults"))
