"""Per-message decisions: one pure function per client era computes a decision for each
request from the message, what the upstream said of its tools (the catalogue) and the task
policy. The eras (downstream/) carry decisions out; nothing here knows HTTP or does I/O.

A decision is one frozen record per kind, and each era gets a union of only the kinds it
can meet, so its handler matches them exhaustively (`assert_never`: a kind added here and
not handled there fails the type check). The MCP Python SDK's `mcp/shared/inbound.py` is
the model (a route or a rejection, matched).

    Pass          forward to the upstream as it is (`follow`: as a task of its own)
    Answer        the gateway answers itself with a fixed `result` (ping)
    SetLevel      the session's log level, kept here; answered at once
    Subscription  counted here: only the first subscribe / last unsubscribe goes upstream
    Augment       forward tools/list; each tool in the answer gains its taskSupport
    ServeTasks    tasks/* answered from the engine
    Discover      server/discover, answered from what the upstream said at initialize
    Listen        a subscriptions/listen stream
    TaskCall      the call becomes a task (`policy`; `at_once`, or after the sync budget)
    Resume        an MRTR retry that resumes a parked call with its input responses
                  (`round`: its requestState, opened once by the era, carried here)
    Refuse        answer with `error`
"""

from __future__ import annotations

from collections.abc import Callable, Container
from dataclasses import dataclass
from typing import Any

from gateway import errors
from gateway.protocol import mcp
from gateway.tasks.dialects import Lacking, core, extension, task_id_of
from gateway.tasks.policy import Policy
from gateway.upstream.catalogue import Catalogue

PolicyFor = Callable[[str], Policy]
Lacks = Callable[[frozenset[str]], frozenset[str]]  # needed scopes -> those not held


@dataclass(frozen=True, slots=True)
class Pass:
    follow: bool = False  # ask the upstream for its own task and follow it


@dataclass(frozen=True, slots=True)
class Answer:
    result: dict[str, Any]


@dataclass(frozen=True, slots=True)
class SetLevel:
    level: str  # one of mcp.LOG_LEVELS


@dataclass(frozen=True, slots=True)
class Subscription:
    """A resource (un)subscribe with a uri: counted per holder."""


@dataclass(frozen=True, slots=True)
class Augment:
    """A core-tasks session's tools/list: forwarded, and each tool in the answer gains its
    `execution.taskSupport` (spec tasks-2025-11-25, Tool-Level Negotiation)."""


@dataclass(frozen=True, slots=True)
class ServeTasks:
    """tasks/* of the gateway's own tasks (or ids it answers as unknown)."""


@dataclass(frozen=True, slots=True)
class Discover:
    """server/discover."""


@dataclass(frozen=True, slots=True)
class Listen:
    """subscriptions/listen."""


@dataclass(frozen=True, slots=True)
class TaskCall:
    policy: Policy
    at_once: bool  # a task now (always/required, or the client asked)
    ttl: int | None = None  # the ttl the client asked for (core)
    follow: bool = False  # as Pass.follow, should it run inline


@dataclass(frozen=True, slots=True)
class OwnRound:
    """A fact the modern era hands in: the request retries one of the gateway's own MRTR
    rounds, its requestState opened and checked against the request at the era's boundary
    (downstream/rounds.py `Rounds.opened`, once): which parked call, which of its rounds,
    and the replica holding it (`url`: where that replica is reached)."""

    parked: str | None  # None: the state names no call parked by the gateway
    round: int | None
    replica: str | None  # None: the state names none (this replica's, then)
    url: str | None


@dataclass(frozen=True, slots=True)
class Resume:
    """An MRTR retry of a call parked here (or on the replica its round names)."""

    round: OwnRound


@dataclass(frozen=True, slots=True)
class Refuse:
    error: errors.GatewayError


LegacyDecision = Pass | Answer | SetLevel | Subscription | Augment | ServeTasks | TaskCall | \
    Refuse
ModernDecision = Pass | Discover | Listen | ServeTasks | Resume | TaskCall | Refuse
Decision = LegacyDecision | ModernDecision

PASS = Pass()
TASKS_PREFIX = "tasks/"


# -- scopes (both eras; auth.oauth and the tools' `scopes`) ---------------------------------
def lacking(lacks: Lacks, policy_for: PolicyFor) -> Lacking:
    """A tool's name -> the scopes its policy needs that the caller does not hold."""
    return lambda tool: lacks(policy_for(tool).scopes)


def scope_refusal(msg: dict[str, Any], lacks: Lacks, policy_for: PolicyFor
                  ) -> errors.InsufficientScope | None:
    """spec (MCP 2025-11-25, scope challenge): a tools/call of a tool whose scopes the token
    lacks is refused with 403 and the scopes to ask for, whatever the era."""
    params = msg.get("params")
    if msg.get("method") != mcp.TOOLS_CALL or not isinstance(params, dict):
        return None
    name = params.get("name")
    policy = policy_for(name if isinstance(name, str) else "")
    missing = lacks(policy.scopes)
    return errors.InsufficientScope(f"tool {_called(name, policy)}", missing) \
        if missing else None


def _called(name: object, policy: Policy) -> str:
    """A tool named in an error for clients: by the name they call it (docs/tools.md), which
    curation may have changed from the server's the message carries past the door."""
    return errors.shown(policy.called or name)


# -- the legacy era (initialize, sessions) ----------------------------------------------------
def legacy(msg: dict[str, Any], *, in_flight: bool, core_tasks: bool, keeps_level: bool,
           native_task_ids: Container[str], catalogue: Catalogue,
           policy_for: PolicyFor) -> LegacyDecision:
    """A legacy session's request. `in_flight`: the session has a request of this id in
    flight; `core_tasks`: the session speaks 2025-11-25, whose core tasks the gateway
    serves; `keeps_level`: the upstream logs (or speaks the modern era, which takes a level
    per request), so each session's level is kept here; `native_task_ids`: tasks the
    upstream runs for the session."""
    if in_flight:  # spec (basic, Requests): an id MUST NOT be one its sender used before
        # in the session; one still in flight would make two answers of one id.
        return Refuse(errors.InvalidRequest(
            f"Invalid Request: id {errors.shown(msg['id'])} is already in flight"))
    method, params = msg["method"], msg.get("params")
    if method == mcp.PING:
        return Answer({})
    if method == mcp.SET_LEVEL and keeps_level:
        return _set_level(params)
    if method in (mcp.SUBSCRIBE, mcp.UNSUBSCRIBE) and isinstance(params, dict) and \
            isinstance(params.get("uri"), str):
        return Subscription()
    if method.startswith(TASKS_PREFIX):
        return _legacy_tasks_request(method, params, core_tasks, native_task_ids)
    if not core_tasks:
        return PASS
    if method == mcp.TOOLS_LIST:
        return Augment()
    if method == mcp.TOOLS_CALL and isinstance(params, dict):
        return _core_call(params, catalogue, policy_for)
    return PASS


def _set_level(params: object) -> SetLevel | Refuse:
    """Each session's level is its own: a modern server takes it with each request, a
    legacy one is set to the most verbose level asked and the rest filtered per session."""
    level = params.get("level") if isinstance(params, dict) else None
    if level not in mcp.LOG_LEVELS:  # a JSON-RPC error, as a server would answer
        return Refuse(errors.InvalidParams(
            f"Invalid params: unknown log level {errors.shown(level)}"))
    return SetLevel(level)


def _legacy_tasks_request(method: str, params: object, core_tasks: bool,
                          native_task_ids: Container[str]) -> Pass | ServeTasks | Refuse:
    """tasks/* of a legacy session. The upstream's own tasks are the gateway's client's,
    whoever made them (it sees one client): only ids this session created go there, and
    only from a session that negotiated tasks (docs/architecture.md, Tenancy)."""
    if core_tasks and method in core.METHODS:
        return _core_tasks_request(params, native_task_ids)
    task_id = task_id_of(params) if isinstance(params, dict) else None
    if core_tasks and task_id is not None and task_id in native_task_ids:
        return PASS  # a method of the upstream's own for the session's own task
    why = "tasks need protocol version 2025-11-25" if not core_tasks else \
        "not a method of core tasks"
    return Refuse(errors.MethodNotFound(f"Method not found: {method} ({why})"))


def _core_tasks_request(params: object, native_task_ids: Container[str]
                        ) -> Pass | ServeTasks | Refuse:
    if params is None:
        return ServeTasks()  # tasks/list may have no params at all
    if not isinstance(params, dict):
        return Refuse(errors.InvalidParams("Invalid params: params must be an object"))
    task_id = task_id_of(params)
    if task_id is not None and task_id in native_task_ids:
        return PASS  # the upstream's own task
    return ServeTasks()


def _core_call(params: dict[str, Any], catalogue: Catalogue, policy_for: PolicyFor
               ) -> Pass | TaskCall | Refuse:
    name = params.get("name")
    policy = policy_for(str(name or ""))
    if not core.is_task_call(params):
        if policy.mode == "required":  # spec (Tool-Level Negotiation): refuse plain calls
            return Refuse(errors.MethodNotFound(
                f"Tool {_called(name, policy)} must be called as a task (taskSupport: required)"))
        return PASS
    if catalogue.own_task_support(name):
        return PASS  # the upstream's own task: the connection notes whose it is
    try:
        ttl = core.requested_ttl(params)
    except errors.InvalidParams as exc:
        return Refuse(exc)
    if policy.mode == "never":  # spec (Tool-Level Negotiation): forbidden -> -32601
        return Refuse(errors.MethodNotFound(f"Tool {_called(name, policy)} does not support "
                                            "task-augmented calls (taskSupport: forbidden)"))
    return TaskCall(policy, at_once=True, ttl=ttl)


# -- the modern era (protocol 2026-07-28) --------------------------------------------------
def modern(msg: dict[str, Any], *, capabilities: dict[str, Any], modern_upstream: bool,
           upstream_task: bool, catalogue: Catalogue, policy_for: PolicyFor,
           retry: OwnRound | None = None) -> ModernDecision:
    """A modern request whose envelope and headers were checked, on a route resolved
    before (`modern_upstream`: its connection speaks the server's own modern wire).
    `upstream_task`: tasks/* names a task a modern upstream runs itself, created by this
    caller's principal; `retry`: it retries a round of the gateway's own."""
    method, params = msg["method"], msg.get("params") or {}
    if method == mcp.DISCOVER:
        return Discover()
    if method.startswith(TASKS_PREFIX) and method not in extension.METHODS:
        # Not the extension's: the upstream's own method, for the caller's own task only.
        if modern_upstream and upstream_task:
            return PASS
        return Refuse(errors.MethodNotFound(f"Method not found: {method}"))
    if method in extension.METHODS:
        if modern_upstream and upstream_task and extension.declared(capabilities):
            return PASS  # the caller's task of the upstream's own (a tool in mode never)
        return _gateway_tasks(capabilities)
    if method == mcp.LISTEN:
        return Listen()
    if retry is not None:  # its call is parked by the gateway, whatever the route's era
        return Resume(retry)
    if method == mcp.TOOLS_CALL:
        return _modern_call(params, capabilities, catalogue, policy_for)
    return PASS


def modern_held(msg: dict[str, Any], *, capabilities: dict[str, Any]
                ) -> ServeTasks | Refuse | None:
    """The early step of a modern request that names a task the engine holds for its
    caller (a fact found before the route: a tasks/get answered from the kept answers,
    tasks/* while the server cannot be reached): decided as `modern` decides it on any
    route, since a task of the gateway's is no upstream's own; None for any other method
    (the route decides)."""
    if msg["method"] not in extension.METHODS:
        return None
    return _gateway_tasks(capabilities)


def _gateway_tasks(capabilities: dict[str, Any]) -> ServeTasks | Refuse:
    """tasks/* of the extension about the gateway's tasks, and about what the caller did
    not create, which it answers like an unknown id (docs/architecture.md, Tenancy): the
    upstream sees one client, the gateway."""
    if not extension.declared(capabilities):
        return Refuse(extension.missing())
    return ServeTasks()


def _modern_call(params: dict[str, Any], capabilities: dict[str, Any], catalogue: Catalogue,
                 policy_for: PolicyFor) -> Pass | TaskCall | Refuse:
    name = params.get("name")
    # A tool the upstream runs only as a task of its own: the call asks for that task and
    # the connection waits on its result, so here it is one slow call.
    follow = catalogue.own_task_support(name) == "required"
    policy = policy_for(str(name or ""))
    if not extension.declared(capabilities):
        if policy.mode == "required":
            return Refuse(extension.missing())
        return Pass(follow)
    if policy.mode == "never":
        return Pass(follow)
    return TaskCall(policy, at_once=policy.mode in ("always", "required"), follow=follow)


# -- era detection and version negotiation -------------------------------------------------
def is_modern(msg: dict[str, Any], header_version: str | None) -> bool:
    """spec 2026-07-28 versioning, dual-era servers: a request carrying the modern `_meta`
    is modern; `initialize` (and anything else) selects the legacy era."""
    params = msg.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    if isinstance(meta, dict) and mcp.META_VERSION in meta:
        return True
    return header_version in mcp.MODERN_VERSIONS or msg.get("method") in (mcp.DISCOVER,
                                                                          mcp.LISTEN)


def negotiate(requested: object) -> str:
    """spec (lifecycle, Version Negotiation): the same version if supported, else our latest."""
    return requested if requested in mcp.LEGACY_VERSIONS else mcp.LATEST_LEGACY


# Client notifications that concern the gateway's own link with the upstream, not the server.
SWALLOWED_NOTIFICATIONS = frozenset({mcp.INITIALIZED})
