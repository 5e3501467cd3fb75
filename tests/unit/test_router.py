"""The router's decisions, per era, from the message, the catalogue and the policy: no HTTP."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import loaded_by
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway import errors, router
from gateway.protocol import jsonrpc, mcp
from gateway.settings.load import from_mapping
from gateway.tasks.dialects import extension
from gateway.tasks.policy import Policies
from gateway.upstream.catalogue import Catalogue

POLICIES = Policies(from_mapping({"upstreams": {"main": {"command": "x"}}, "tasks": {"tools": {
    "quick": {"mode": "never"}, "slow": {"mode": "always"}, "must": {"mode": "required"}}}}).tasks,
    {})
TASKS_EXT = {"extensions": {extension.EXTENSION: {}}}


def catalogue(own: dict[str, str] | None = None) -> Catalogue:
    """A catalogue as learned from a 2025-11-25 upstream's tools/list."""
    cat = Catalogue()
    tools = [{"name": n, "execution": {"taskSupport": s}} for n, s in (own or {}).items()]
    cat.learn(jsonrpc.result(1, {"tools": tools}),
              {"capabilities": {"tasks": {"requests": {"tools": {"call": {}}}}}})
    return cat


def legacy(method: str, params: Any = None, *, core_tasks: bool = True,
           keeps_level: bool = False, native: tuple[str, ...] = (),
           cat: Catalogue | None = None, in_flight: bool = False) -> router.LegacyDecision:
    return router.legacy(jsonrpc.request(1, method, params), in_flight=in_flight,
                         core_tasks=core_tasks,
                         keeps_level=keeps_level, native_task_ids=set(native),
                         catalogue=cat or catalogue(),
                         policy_for=lambda tool: POLICIES.for_tool("main", tool))


def modern(method: str, params: Any = None, *, caps: dict[str, Any] | None = None,
           modern_upstream: bool = False, theirs: bool = False,
           cat: Catalogue | None = None) -> router.ModernDecision:
    # A retry's state is opened before deciding (rounds.py `Rounds.opened`): on a bridged
    # route, a round of the gateway's own is the fact the router is handed.
    retried = method in mcp.MRTR_METHODS and isinstance(params, dict) and \
        "requestState" in params and not modern_upstream
    return router.modern(jsonrpc.request(1, method, params),
                         capabilities=TASKS_EXT if caps is None else caps,
                         modern_upstream=modern_upstream, upstream_task=theirs,
                         catalogue=cat or catalogue(),
                         policy_for=lambda tool: POLICIES.for_tool("main", tool),
                         retry=router.OwnRound("p", 1, None, None) if retried else None)


def call(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "arguments": {}, **extra}


# -- legacy -------------------------------------------------------------------------------------
def test_legacy_answers_ping_and_passes_the_rest() -> None:
    assert legacy(mcp.PING) == router.Answer({})
    assert isinstance(legacy("resources/read", {"uri": "x"}), router.Pass)
    assert isinstance(legacy(mcp.TOOLS_LIST, core_tasks=False), router.Pass)  # no core tasks


def test_legacy_keeps_each_sessions_log_level_where_the_upstream_logs() -> None:
    kept = legacy(mcp.SET_LEVEL, {"level": "debug"}, keeps_level=True)
    assert kept == router.SetLevel("debug")
    bad = legacy(mcp.SET_LEVEL, {"level": "loud"}, keeps_level=True)
    assert isinstance(bad, router.Refuse) and isinstance(bad.error, errors.InvalidParams)
    # A server without logging answers for itself (it has no level anyone could change).
    assert isinstance(legacy(mcp.SET_LEVEL, {"level": "debug"}), router.Pass)


def test_legacy_tasks_requests_need_a_session_that_negotiated_tasks() -> None:
    for method in ("tasks/get", "tasks/list", "tasks/result", "tasks/cancel", "tasks/update",
                   "tasks/delete"):
        refused = legacy(method, {"taskId": "up-1"}, core_tasks=False, native=("up-1",))
        assert isinstance(refused, router.Refuse)
        assert isinstance(refused.error, errors.MethodNotFound)


def test_other_tasks_methods_reach_the_upstream_for_the_callers_own_task_only() -> None:
    """The upstream serves any client's tasks (it sees one, the gateway)."""
    assert isinstance(legacy("tasks/delete", {"taskId": "up-1"}, native=("up-1",)), router.Pass)
    for params in ({"taskId": "up-2"}, {}, None):
        refused = legacy("tasks/update", params, native=("up-1",))
        assert isinstance(refused, router.Refuse)
        assert isinstance(refused.error, errors.MethodNotFound)
    assert isinstance(modern("tasks/delete", {"taskId": "t"}, modern_upstream=True, theirs=True),
        router.Pass)
    assert isinstance(modern("tasks/delete", {"taskId": "t"}, modern_upstream=True), router.Refuse)
    assert isinstance(modern("tasks/delete", {"taskId": "t"}, theirs=True), router.Refuse)


def test_legacy_counts_subscriptions_with_a_uri() -> None:
    assert isinstance(legacy(mcp.SUBSCRIBE, {"uri": "file:///a"}), router.Subscription)
    assert isinstance(legacy(mcp.UNSUBSCRIBE, {"uri": "file:///a"}), router.Subscription)
    assert isinstance(legacy(mcp.SUBSCRIBE, {"uri": 3}), router.Pass)  # the server's to refuse


def test_core_tasks_requests_are_answered_here_unless_the_upstream_runs_the_task() -> None:
    assert legacy("tasks/get", {"taskId": "t1"}) == router.ServeTasks()
    assert legacy("tasks/list") == router.ServeTasks()
    assert isinstance(legacy("tasks/result", {"taskId": "up-1"}, native=("up-1",)), router.Pass)
    bad = legacy("tasks/get", [1, 2])
    assert isinstance(bad, router.Refuse) and bad.error.code == -32602


def test_core_tools_list_is_augmented_with_task_support() -> None:
    assert legacy(mcp.TOOLS_LIST) == router.Augment()


@pytest.mark.parametrize(("params", "kind", "code"), [
    (call("slow", task={"ttl": 5000}), router.TaskCall, None),
    (call("auto", task={}), router.TaskCall, None),
    (call("quick", task={}), router.Refuse, -32601),  # taskSupport forbidden
    (call("slow", task={"ttl": -1}), router.Refuse, -32602),
    (call("slow", task=[]), router.Refuse, -32602),
    (call("must"), router.Refuse, -32601),  # required tools refuse plain calls
    (call("slow"), router.Pass, None),  # the client decides: a plain call is served inline
])
def test_core_tool_calls(params: dict[str, Any], kind: type[router.LegacyDecision],
                         code: int | None) -> None:
    decision = legacy(mcp.TOOLS_CALL, params)
    assert type(decision) is kind
    if code is not None:
        assert isinstance(decision, router.Refuse) and decision.error.code == code
    if isinstance(decision, router.TaskCall):
        assert decision.at_once and decision.policy is not None
        assert decision.ttl == params["task"].get("ttl")


def test_core_task_calls_of_the_upstreams_own_tools_pass() -> None:
    """The connection notes whose the task it creates is (upstream/task_owners.py)."""
    cat = catalogue({"research": "required"})
    decided = legacy(mcp.TOOLS_CALL, call("research", task={}), cat=cat)
    assert decided == router.PASS


# -- modern -------------------------------------------------------------------------------------
def test_modern_answers_discover_and_listen_here() -> None:
    assert modern(mcp.DISCOVER) == router.Discover()
    assert modern(mcp.LISTEN, {"notifications": {}}) == router.Listen()
    assert isinstance(modern("prompts/get", {"name": "p"}), router.Pass)


def test_modern_tasks_requests_need_the_extension() -> None:
    refused = modern("tasks/get", {"taskId": "t"}, caps={})
    assert isinstance(refused, router.Refuse)
    assert refused.error.code == mcp.MISSING_CAPABILITY
    assert modern("tasks/get", {"taskId": "t"}) == router.ServeTasks()
    # On a modern upstream, only a task of its own that the caller created goes there;
    # any other id is answered here (the gateway's, or as unknown).
    assert isinstance(modern("tasks/get", {"taskId": "t"}, modern_upstream=True, theirs=True),
        router.Pass)
    assert modern("tasks/get", {"taskId": "t"}, modern_upstream=True) == router.ServeTasks()


def test_a_retry_with_request_state_resumes_its_parked_call() -> None:
    retry = call("ask", requestState="s", inputResponses={})
    assert isinstance(modern(mcp.TOOLS_CALL, retry), router.Resume)
    # A modern upstream runs its own rounds: the retry goes to it as it is.
    assert isinstance(modern(mcp.TOOLS_CALL, retry, modern_upstream=True), router.TaskCall)


@pytest.mark.parametrize(("tool", "caps", "kind", "at_once"), [
    ("auto", TASKS_EXT, router.TaskCall, False),  # inline if done within the sync budget
    ("slow", TASKS_EXT, router.TaskCall, True),
    ("must", TASKS_EXT, router.TaskCall, True),
    ("quick", TASKS_EXT, router.Pass, False),
    ("slow", {}, router.Pass, False),  # a client without the extension is served inline
    ("must", {}, router.Refuse, False),  # ... unless the tool requires a task: -32021
])
def test_modern_tool_calls(tool: str, caps: dict[str, Any], kind: type[router.ModernDecision],
                           at_once: bool) -> None:
    decision = modern(mcp.TOOLS_CALL, call(tool), caps=caps)
    assert type(decision) is kind
    assert (isinstance(decision, router.TaskCall) and decision.at_once) == at_once
    if kind is router.Refuse:
        assert isinstance(decision, router.Refuse)
        assert decision.error.code == mcp.MISSING_CAPABILITY


def test_modern_calls_follow_tools_the_upstream_runs_only_as_tasks() -> None:
    cat = catalogue({"research": "required", "maybe": "optional"})
    assert modern(mcp.TOOLS_CALL, call("research"), caps={}, cat=cat) == router.Pass(follow=True)
    assert modern(mcp.TOOLS_CALL, call("maybe"), caps={}, cat=cat) == router.Pass(follow=False)


def test_era_detection_and_version_negotiation() -> None:
    modern_meta = {"_meta": {mcp.META_VERSION: "2026-07-28"}}
    assert router.is_modern(jsonrpc.request(1, mcp.TOOLS_LIST, modern_meta), None)
    assert router.is_modern(jsonrpc.request(1, mcp.DISCOVER), None)
    assert not router.is_modern(jsonrpc.request(1, mcp.INITIALIZE, {}), None)
    assert router.negotiate("2025-06-18") == "2025-06-18"
    assert router.negotiate("1999-01-01") == mcp.LATEST_LEGACY


def test_the_router_is_pure_and_light() -> None:
    """Issue 20: `import gateway.router` loads no engine, no HTTP library and no metrics
    client: decisions are plain functions of the message and what the upstream said."""
    heavy = ("gateway.tasks.engine", "aiohttp", "prometheus_client",
             "gateway.upstream.correlator", "redis")
    assert loaded_by("import gateway.router", heavy) == []


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                    | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=8)
FIELDS = st.sampled_from(["name", "arguments", "task", "_meta", "taskId", "uri", "level",
                          "cursor", "requestState", "inputResponses"])
METHODS = st.sampled_from([mcp.TOOLS_CALL, mcp.TOOLS_LIST, mcp.SET_LEVEL, mcp.SUBSCRIBE,
                           mcp.UNSUBSCRIBE, mcp.PING, mcp.LISTEN, mcp.DISCOVER, "tasks/get",
                           "tasks/list", "tasks/result", "tasks/cancel", "tasks/update"])


@settings(max_examples=400, deadline=None)
@given(method=METHODS, params=st.dictionaries(FIELDS, JSON, max_size=4),
       core_tasks=st.booleans(), upstream=st.booleans())
def test_any_object_params_get_a_decision_never_an_exception(
        method: str, params: dict[str, Any], core_tasks: bool, upstream: bool) -> None:
    """Params are objects by now (checked at the edge), but their fields may be anything."""
    assert isinstance(legacy(method, params, core_tasks=core_tasks, keeps_level=upstream),
                      router.LegacyDecision)
    assert isinstance(modern(method, params, modern_upstream=upstream), router.ModernDecision)


@pytest.mark.parametrize(("method", "params"), [
    (mcp.PING, None), (mcp.SET_LEVEL, {"level": "info"}), (mcp.SUBSCRIBE, {"uri": "r://x"}),
    ("tasks/get", {"taskId": "t"}), (mcp.TOOLS_CALL, call("echo", task={})),
    (mcp.TOOLS_CALL, call("echo")), (mcp.TOOLS_LIST, None)])
def test_a_legacy_request_whose_id_is_in_flight_is_refused_whatever_it_asks(
        method: str, params: Any) -> None:
    """One decision for every kind, before any side effect (a subscription counted, a
    task made): the era no longer checks it in three branches."""
    decided = legacy(method, params, in_flight=True, keeps_level=True)
    assert isinstance(decided, router.Refuse)
    assert isinstance(decided.error, errors.InvalidRequest)
    assert "already in flight" in decided.error.message
    assert not isinstance(legacy(method, params, keeps_level=True), router.Refuse)


@pytest.mark.parametrize("method", sorted(extension.METHODS))
@pytest.mark.parametrize("caps", [TASKS_EXT, {}])
def test_the_early_step_decides_a_held_task_as_every_route_would(method: str,
                                                                  caps: dict[str, Any]) -> None:
    """tasks/* of a task the gateway holds is decided before the route (kept answers, a
    server that cannot start) by the same rule as after it, on either era's route."""
    msg = jsonrpc.request(1, method, {"taskId": "t"})
    early = router.modern_held(msg, capabilities=caps)
    assert isinstance(early, router.ServeTasks if caps else router.Refuse)
    for modern_upstream in (False, True):
        late = modern(method, {"taskId": "t"}, caps=caps, modern_upstream=modern_upstream)
        assert type(late) is type(early)
        if isinstance(early, router.Refuse) and isinstance(late, router.Refuse):
            assert late.error.to_message(1) == early.error.to_message(1)
    assert router.modern_held(jsonrpc.request(1, mcp.TOOLS_CALL, call("echo")),
                              capabilities=caps) is None


def test_refusals_name_a_renamed_tool_as_clients_call_it() -> None:
    """docs/tools.md: past the door a renamed tool travels by the server's name, but what the
    gateway tells a client names it as the client calls it."""
    policies = Policies(from_mapping({"upstreams": {"main": {"command": "x"}}, "tasks": {
        "tools": {"must": {"name": "gh_must", "mode": "required", "scopes": ["write"]}}}}).tasks,
        {})
    policy_for = lambda tool: policies.for_tool("main", tool)  # noqa: E731
    plain = router.legacy(jsonrpc.request(1, mcp.TOOLS_CALL, call("must")), in_flight=False,
                          core_tasks=True, keeps_level=False, native_task_ids=set(),
                          catalogue=catalogue(), policy_for=policy_for)
    assert isinstance(plain, router.Refuse)
    assert '"gh_must" must be called as a task' in plain.error.message
    refusal = router.scope_refusal(jsonrpc.request(2, mcp.TOOLS_CALL, call("must")),
                                   lambda needed: frozenset(needed), policy_for)
    assert refusal is not None and refusal.message.count('"gh_must"') == 1
    assert '"must"' not in refusal.message
    # An unrenamed tool keeps its one name.
    assert POLICIES.for_tool("main", "must").called == ""
