"""Per-tool curation, the pure parts (tasks/curation.py; issue 53 item 1): lists as clients
see them, calls by the names clients know, masked names put back, renames refused where
they would clash, and a renamed tool's policy found under either name."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway import router
from gateway.settings import ConfigError
from gateway.settings.load import from_mapping
from gateway.settings.schema import Tasks, ToolEntry, UpstreamTasks
from gateway.tasks.curation import MASK, Curation, unmask
from gateway.tasks.policy import Policies, Unmatched


def listing(*names: str, **extra: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "result": {"tools": [
        {"name": n, "inputSchema": {"type": "object"}, **extra} for n in names]}}


def names(msg: dict[str, Any]) -> list[str]:
    return [t["name"] for t in msg["result"]["tools"]]


CURATED = Curation([{
    "debug_*": ToolEntry(expose=False),
    "run_query": ToolEntry(name="query", description="Run one read-only SQL query.",
                           annotations={"readOnlyHint": True}),
    "echo": ToolEntry(mode="never"),
}])


def test_no_curation_is_inactive_and_leaves_lists_alone() -> None:
    plain = Curation([{"echo": ToolEntry(mode="always")}, {}])
    assert not plain.active
    msg = listing("echo", "sleep")
    tool = msg["result"]["tools"][0]
    assert plain.listed(msg)["result"]["tools"][0] is tool


def test_a_list_as_clients_see_it() -> None:
    msg = CURATED.listed(listing("debug_dump", "run_query", "echo",
                                 annotations={"destructiveHint": False, "readOnlyHint": False}))
    assert names(msg) == ["query", "echo"]
    query = msg["result"]["tools"][0]
    assert query["description"] == "Run one read-only SQL query."
    assert query["annotations"] == {"destructiveHint": False, "readOnlyHint": True}


def test_calls_by_the_names_clients_know() -> None:
    assert CURATED.called_as({"name": "query", "arguments": {}}) == (
        {"name": "run_query", "arguments": {}}, None)
    params = {"name": "echo"}
    assert CURATED.called_as(params) == (params, None)
    for hidden in ("debug_dump", "run_query"):  # not exposed; a renamed tool's old name
        taken, masked = CURATED.called_as({"name": hidden})
        assert taken == {"name": hidden + MASK} and masked == hidden


def test_a_masked_name_is_put_back_wherever_the_server_said_it() -> None:
    said = {"result": {"content": [{"type": "text", "text": f"unknown tool x{MASK}"}],
                       "isError": True}}
    assert unmask(said, "x") == {"result": {"content": [
        {"type": "text", "text": "unknown tool x"}], "isError": True}}


def test_a_tool_a_rename_takes_the_name_of_is_not_listed_twice() -> None:
    onto = Curation([{"a": ToolEntry(name="b")}])
    assert names(onto.listed(listing("a", "b"))) == ["b"]
    assert onto.called_as({"name": "b"})[0] == {"name": "a"}


def test_a_renamed_tools_policy_is_found_under_either_name_the_new_one_winning() -> None:
    tasks = Tasks(tools={"run_query": ToolEntry(name="query", mode="always", ttl_ms=5),
                         "query": ToolEntry(mode="never")})
    policy = Policies(tasks, {"main": UpstreamTasks()}).for_tool("main", "run_query")
    assert (policy.mode, policy.ttl_ms) == ("never", 5)


def test_an_upstreams_entry_curates_over_the_global_one() -> None:
    policies = Policies(Tasks(tools={"echo": ToolEntry(description="global")}),
                        {"main": UpstreamTasks(tools={"echo": ToolEntry(title="Echo")})})
    shown = policies.curation("main").shown("echo")
    assert (shown.title, shown.description) == ("Echo", "global")
    assert policies.curation("other").shown("echo").title is None


@pytest.mark.parametrize(("tools", "local", "said"), [
    ({"a": {"name": "x"}, "b": {"name": "x"}}, {},
     "tasks.tools.b.name: tools 'a' and 'b' are both renamed 'x'"),
    ({"a": {"name": "b"}, "b": {"description": "B"}}, {},
     "tasks.tools.a.name: 'a' is renamed 'b', another entry's tool name"),
    ({"a": {"name": "x"}}, {"c": {"name": "x"}},
     "upstreams.main.tasks.tools.c.name: tools 'a' and 'c' are both renamed 'x'"),
    ({"db_*": {"name": "x"}}, {}, "tasks.tools.db_*.name: a glob cannot rename"),
])
def test_clashing_renames_are_refused_with_the_names(tools, local, said) -> None:
    raw = {"upstreams": {"main": {"command": "x", "tasks": {"tools": local}}},
           "tasks": {"tools": tools}}
    with pytest.raises(ConfigError) as refused:
        from_mapping(raw)
    assert said in str(refused.value)


def test_the_worked_examples_of_docs_tools_md_are_valid(monkeypatch) -> None:
    monkeypatch.setenv("ANALYSTS_TOKEN", "a" * 32)
    monkeypatch.setenv("ADMINS_TOKEN", "b" * 32)
    page = (Path(__file__).parents[2] / "docs" / "tools.md").read_text()
    blocks = re.findall(r"^```yaml\n(.*?)^```", page, re.M | re.S)
    assert len(blocks) == 4
    for block in blocks:
        raw = {"upstreams": {"main": {"command": "x"}}, **yaml.safe_load(block)}
        from_mapping(raw)


def test_an_entry_under_a_renamed_tools_new_name_is_no_typo() -> None:
    policies = Policies(Tasks(tools={"params": ToolEntry(name="show_params"),
                                     "show_params": ToolEntry(mode="never")}),
                        {"main": UpstreamTasks()})
    unmatched = Unmatched(policies, ["main"])
    unmatched.learned("main", ["params", "echo"])
    assert unmatched.found == {}


def test_the_tools_digest_tells_replicas_whose_entries_differ() -> None:
    """Replicas apply their own settings (docs/replicas.md): the digest on /readyz?detail
    is how an operator finds one whose tools differ; the order of globs matters, so it
    counts, and an unrelated setting does not."""
    def digest(tools: dict[str, Any], **other: Any) -> str:
        return Policies.of(from_mapping({"upstreams": {"main": {"command": "x"}},
                                         "tasks": {"tools": tools}, **other})).digest()

    hidden = {"a*": {"expose": False}, "*": {"scopes": ["write"]}}
    assert digest(hidden) == digest(dict(hidden), limits={"max_body_bytes": 12345})
    assert digest(hidden) != digest({"*": {"scopes": ["write"]}, "a*": {"expose": False}})
    assert digest(hidden) != digest({**hidden, "echo": {"name": "say"}})
    assert digest({}) != digest({"echo": {"mode": "never"}})


def test_entries_cascade_an_exact_one_keeping_what_a_glob_below_it_sets() -> None:
    """An entry that only re-describes or renames a tool keeps the scopes (and mode, and
    visibility) a glob below it sets: a description must not open a tool to every token."""
    tasks = Tasks(tools={"blob": ToolEntry(description="N bytes"),
                         "params": ToolEntry(name="pp"),
                         "get_*": ToolEntry(scopes=["read"], mode="never"),
                         "*": ToolEntry(scopes=["write"], mode="always")})
    policies = Policies(tasks, {})
    assert policies.for_tool("main", "blob").scopes == {"write"}
    assert policies.for_tool("main", "params").scopes == {"write"}
    get = policies.for_tool("main", "get_x")  # the first glob wins key by key
    assert (get.scopes, get.mode) == ({"read"}, "never")
    hidden = Policies(Tasks(tools={"deep": ToolEntry(description="d"),
                                   "d*": ToolEntry(expose=False)}), {})
    assert hidden.curation("main").shown("deep").expose is False


def test_a_masked_call_is_judged_and_named_as_the_name_called() -> None:
    """A hidden tool's (or a renamed tool's old) name is judged as a tool the server lacks
    would be: by the name called, never by the mark the gateway adds (issue 53 attack:
    refusals said `environ\u2060(not exposed)`, and globs not ending in * missed it)."""
    tasks = Tasks(tools={"environ": ToolEntry(expose=False), "echo": ToolEntry(name="say"),
                         "*ep": ToolEntry(scopes=["write"]), "*": ToolEntry(mode="required")})
    policies = Policies(tasks, {})
    for called in ("environ", "echo", "deep"):
        policy = policies.for_tool("main", called + MASK)
        assert policy.called == called
        assert policy.scopes == policies.for_tool("main", called).scopes
    assert policies.for_tool("main", "deep" + MASK).scopes == {"write"}
    refusal = router.scope_refusal(
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": "environ" + MASK}}, lambda needed: frozenset({"x"}),
        lambda tool: policies.for_tool("main", tool))
    assert refusal is not None and '"environ"' in refusal.message and MASK not in \
        refusal.message


def test_a_renamed_tools_own_limit_is_named_as_clients_call_it() -> None:
    policy = Policies(Tasks(tools={"sleep": ToolEntry(name="nap", max_concurrency=1,
                                                      max_queue=0)}), {}).for_tool(
        "main", "sleep")
    limit = policy.limit("main")
    assert limit is not None and (limit.label, limit.shown) == ("sleep", "nap")
    glob = Policies(Tasks(tools={"sleep": ToolEntry(name="nap"),
                                 "s*": ToolEntry(max_concurrency=1)}), {}).for_tool(
        "main", "sleep").limit("main")
    assert glob is not None and (glob.label, glob.shown) == ("s*", "")


def test_a_token_listed_twice_is_refused_without_being_named() -> None:
    token = "t" * 40
    with pytest.raises(ConfigError) as refused:
        from_mapping({"upstreams": {"main": {"command": "x"}}, "auth": {"bearer_tokens": [
            token, {"token": token, "scopes": ["read"], "name": "readers"}]}})
    assert "listed twice" in str(refused.value) and token not in str(refused.value)
