"""Per-message decisions: one pure function per client era computes a `Decision` for each
request from the message, what the upstream said of its tools (the catalogue) and the task
policy. The eras (downstream/) carry decisions out; nothing here knows HTTP or does I/O.

    PASS          forward to the upstream as it is
    ANSWER        the gateway answers itself (`result`, or from its own state: `serve`)
    SUBSCRIPTION  counted here: only the first subscribe / last unsubscribe goes upstream
    AUGMENT       forward, and change the answer on its way back (`edit`)
    TASK          the call becomes a task (`policy`; `at_once`, or after the sync budget)
    MRTR          a retry that resumes a parked call with its input responses
    REFUSE        answer with `error`
"""

from __future__ import annotations

from collections.abc import Callable, Container
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gateway import errors
from gateway.protocol import mcp
from gateway.tasks.dialects import Lacking, core, extension
from gateway.tasks.policy import Policy
from gateway.upstream.catalogue import Catalogue

PolicyFor = Callable[[str], Policy]
Lacks = Callable[[frozenset[str]], frozenset[str]]  # needed scopes -> those not held


class Kind(StrEnum):
    PASS = "pass"
    ANSWER = "answer"
    SUBSCRIPTION = "subscription"
    AUGMENT = "augment"
    TASK = "task"
    MRTR = "mrtr"
    REFUSE = "refuse"


@dataclass(frozen=True, slots=True)
class Decision:
    kind: Kind
    serve: str | None = None  # ANSWER: which of the gateway's own handlers answers
    result: dict[str, Any] | None = None  # ANSWER: the result itself, when it is fixed
    error: errors.GatewayError | None = None  # REFUSE
    edit: str | None = None  # AUGMENT: "mark_tools"
    policy: Policy | None = None  # TASK
    at_once: bool = False  # TASK: a task now (always/required, or the client asked)
    ttl: int | None = None  # TASK: the ttl the client asked for (core)
    level: str | None = None  # ANSWER serve="set_level": the level to keep
    follow: bool = False  # PASS: ask the upstream for its own task and follow it


PASS = Decision(Kind.PASS)
TASKS_PREFIX = "tasks/"


def refuse(error: errors.GatewayError) -> Decision:
    return Decision(Kind.REFUSE, error=error)


# -- scopes (both eras; auth.oauth and the tools' `scopes`) ---------------------------------
def lacking(lacks: Lacks, policy_for: PolicyFor) -> Lacking:
    """A tool's name -> the scopes its policy needs that the caller does not hold."""
    return lambda tool: lacks(policy_for(tool).scopes)


def scope_refusal(msg: dict[str, Any], lacking: Lacking) -> errors.InsufficientScope | None:
    """spec (MCP 2025-11-25, scope challenge): a tools/call of a tool whose scopes the token
    lacks is refused with 403 and the scopes to ask for, whatever the era."""
    params = msg.get("params")
    if msg.get("method") != mcp.TOOLS_CALL or not isinstance(params, dict):
        return None
    name = params.get("name")
    missing = lacking(name if isinstance(name, str) else "")
    return errors.InsufficientScope(f"tool {errors.shown(name)}", missing) if missing else None


# -- the legacy era (initialize, sessions) ----------------------------------------------------
def legacy(msg: dict[str, Any], *, core_tasks: bool, keeps_level: bool,
           native_task_ids: Container[str], catalogue: Catalogue,
           policy_for: PolicyFor) -> Decision:
    """A legacy session's request. `core_tasks`: the session speaks 2025-11-25, whose core
    tasks the gateway serves; `keeps_level`: the upstream logs (or speaks the modern era,
    which takes a level per request), so each session's level is kept here;
    `native_task_ids`: tasks the upstream runs for the session."""
    method, params = msg["method"], msg.get("params")
    if method == mcp.PING:
        return Decision(Kind.ANSWER, result={})
    if method == mcp.SET_LEVEL and keeps_level:
        return _set_level(params)
    if method in (mcp.SUBSCRIBE, mcp.UNSUBSCRIBE) and isinstance(params, dict) and \
            isinstance(params.get("uri"), str):
        return Decision(Kind.SUBSCRIPTION)
    if method.startswith(TASKS_PREFIX):
        return _legacy_tasks_request(method, params, core_tasks, native_task_ids)
    if not core_tasks:
        return PASS
    if method == mcp.TOOLS_LIST:
        return Decision(Kind.AUGMENT, edit="mark_tools")
    if method == mcp.TOOLS_CALL and isinstance(params, dict):
        return _core_call(params, catalogue, policy_for)
    return PASS


def _set_level(params: Any) -> Decision:
    """Each session's level is its own: a modern server takes it with each request, a
    legacy one is set to the most verbose level asked and the rest filtered per session."""
    level = params.get("level") if isinstance(params, dict) else None
    if level not in mcp.LOG_LEVELS:  # a JSON-RPC error, as a server would answer
        return refuse(errors.InvalidParams(
            f"Invalid params: unknown log level {errors.shown(level)}"))
    return Decision(Kind.ANSWER, serve="set_level", result={}, level=level)


def _legacy_tasks_request(method: str, params: Any, core_tasks: bool,
                          native_task_ids: Container[str]) -> Decision:
    """tasks/* of a legacy session. The upstream's own tasks are the gateway's client's,
    whoever made them (it sees one client): only ids this session created go there, and
    only from a session that negotiated tasks (docs/architecture.md, Tenancy)."""
    if core_tasks and method in core.METHODS:
        return _core_tasks_request(params, native_task_ids)
    task_id = params.get("taskId") if isinstance(params, dict) else None
    if core_tasks and isinstance(task_id, str) and task_id in native_task_ids:
        return PASS  # a method of the upstream's own for the session's own task
    why = "tasks need protocol version 2025-11-25" if not core_tasks else \
        "not a method of core tasks"
    return refuse(errors.MethodNotFound(f"Method not found: {method} ({why})"))


def _core_tasks_request(params: Any, native_task_ids: Container[str]) -> Decision:
    if params is None:
        return Decision(Kind.ANSWER, serve="tasks")  # tasks/list may have no params at all
    if not isinstance(params, dict):
        return refuse(errors.InvalidParams("Invalid params: params must be an object"))
    task_id = params.get("taskId")
    if isinstance(task_id, str) and task_id in native_task_ids:
        return PASS  # the upstream's own task
    return Decision(Kind.ANSWER, serve="tasks")


def _core_call(params: dict[str, Any], catalogue: Catalogue, policy_for: PolicyFor
               ) -> Decision:
    name = params.get("name")
    policy = policy_for(str(name or ""))
    if not core.is_task_call(params):
        if policy.mode == "required":  # spec (Tool-Level Negotiation): refuse plain calls
            return refuse(errors.MethodNotFound(
                f"Tool {errors.shown(name)} must be called as a task (taskSupport: required)"))
        return PASS
    if catalogue.own_task_support(name):
        return PASS  # the upstream's own task: the connection notes whose it is
    try:
        ttl = core.requested_ttl(params)
    except errors.InvalidParams as exc:
        return refuse(exc)
    if policy.mode == "never":  # spec (Tool-Level Negotiation): forbidden -> -32601
        return refuse(errors.MethodNotFound(f"Tool {errors.shown(name)} does not support "
                                            "task-augmented calls (taskSupport: forbidden)"))
    return Decision(Kind.TASK, policy=policy, at_once=True, ttl=ttl)


# -- the modern era (protocol 2026-07-28) --------------------------------------------------
def modern(msg: dict[str, Any], *, capabilities: dict[str, Any], modern_upstream: bool,
           upstream_task: bool, catalogue: Catalogue, policy_for: PolicyFor) -> Decision:
    """A modern request whose envelope and headers were checked. `upstream_task`: tasks/*
    names a task a modern upstream runs itself, created by this caller's principal."""
    method, params = msg["method"], msg.get("params") or {}
    if method == mcp.DISCOVER:
        return Decision(Kind.ANSWER, serve="discover")
    if method.startswith(TASKS_PREFIX) and method not in extension.METHODS:
        # Not the extension's: the upstream's own method, for the caller's own task only.
        if modern_upstream and upstream_task:
            return PASS
        return refuse(errors.MethodNotFound(f"Method not found: {method}"))
    if method in extension.METHODS:
        if not extension.declared(capabilities):
            return refuse(extension.missing())
        if modern_upstream and upstream_task:
            return PASS  # the caller's task of the upstream's own (a tool in mode never)
        # The gateway's tasks, and what the caller did not create, which it answers like
        # an unknown id (docs/architecture.md, Tenancy): the upstream sees one client, the gateway.
        return Decision(Kind.ANSWER, serve="tasks")
    if method == mcp.LISTEN:
        return Decision(Kind.ANSWER, serve="listen")
    if method in mcp.MRTR_METHODS and "requestState" in params and not modern_upstream:
        return Decision(Kind.MRTR)
    if method == mcp.TOOLS_CALL:
        return _modern_call(params, capabilities, catalogue, policy_for)
    return PASS


def _modern_call(params: dict[str, Any], capabilities: dict[str, Any], catalogue: Catalogue,
                 policy_for: PolicyFor) -> Decision:
    name = params.get("name")
    # A tool the upstream runs only as a task of its own: the call asks for that task and
    # the connection waits on its result, so here it is one slow call.
    follow = catalogue.own_task_support(name) == "required"
    policy = policy_for(str(name or ""))
    if not extension.declared(capabilities):
        if policy.mode == "required":
            return refuse(extension.missing())
        return Decision(Kind.PASS, follow=follow)
    if policy.mode == "never":
        return Decision(Kind.PASS, follow=follow)
    return Decision(Kind.TASK, policy=policy, at_once=policy.mode in ("always", "required"),
                    follow=follow)


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


def negotiate(requested: Any) -> str:
    """spec (lifecycle, Version Negotiation): the same version if supported, else our latest."""
    return requested if requested in mcp.LEGACY_VERSIONS else mcp.LATEST_LEGACY


# Client notifications that concern the gateway's own link with the upstream, not the server.
SWALLOWED_NOTIFICATIONS = frozenset({mcp.INITIALIZED})
