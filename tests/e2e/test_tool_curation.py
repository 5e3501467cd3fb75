"""Per-tool curation (issue 53, item 1; docs/tools.md) against the real stdio server
(tests/servers/basic.py), in both eras: a tool not exposed is absent from tools/list and a
call to it is answered byte-for-byte as an unknown tool is; a renamed tool is listed and
called under its new name while the server gets its own; titles, descriptions and
annotations are shown as configured; clashing renames are refused; two static tokens with
scopes see different lists; with no curation, lists pass through unchanged."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from mcp_http import McpHttp
from test_modern import call, modern
from test_scoped_tokens import bearer

CURATED = {
    "crash": {"expose": False},
    "gar*": {"expose": False},
    "params": {"name": "show_params", "title": "Params", "description": "What reached it.",
               "annotations": {"readOnlyHint": True}},
}
SESSION = {"version": "2025-11-25", "capabilities": {"tasks": {}}}


async def legacy_session(http, url: str, **headers: str) -> McpHttp:
    client = McpHttp(http, url)
    await client.initialize(SESSION["capabilities"], version=SESSION["version"],
                            headers=headers)
    return client


async def legacy_list(client: McpHttp, **headers: str) -> list[dict[str, Any]]:
    reply = await client.send({"jsonrpc": "2.0", "id": next(client.ids), "method": "tools/list"},
                              **headers)
    return list(reply.message["result"]["tools"])


async def legacy_call(client: McpHttp, name: str, **headers: str) -> Any:
    reply = await client.send({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                               "params": {"name": name, "arguments": {}}}, **headers)
    return reply.message


def as_unknown(answer: Any, name: str) -> str:
    """An answer's bytes, but its id, with the name it was about made neutral (the server
    repeats it)."""
    rest = {k: v for k, v in answer.items() if k != "id"}
    return json.dumps(rest, sort_keys=True).replace(name, "NAME")


async def test_a_hidden_tool_is_unlisted_and_answered_as_unknown_modern(gateway, http) -> None:
    url = await gateway(tasks={"tools": CURATED})
    listed = (await modern(http, url, "tools/list", {})).body["result"]["tools"]
    names = {t["name"] for t in listed}
    assert not names & {"crash", "garble", "params"} and {"echo", "show_params"} <= names
    unknown = await call(http, url, "made_up")
    for hidden in ("crash", "garble", "params"):  # not exposed; a renamed tool's old name
        answered = await call(http, url, hidden)
        assert answered.status == unknown.status
        assert as_unknown(answered.body, hidden) == as_unknown(unknown.body, "made_up")
    assert "unknown tool made_up" in json.dumps(unknown.body)  # the server's own answer


async def test_a_hidden_tool_is_unlisted_and_answered_as_unknown_legacy(gateway, http) -> None:
    url = await gateway(tasks={"tools": CURATED})
    client = await legacy_session(http, url)
    names = {t["name"] for t in await legacy_list(client)}
    assert not names & {"crash", "garble", "params"} and "show_params" in names
    unknown = await legacy_call(client, "made_up")
    for hidden in ("crash", "garble", "params"):
        answered = await legacy_call(client, hidden)
        assert as_unknown(answered, hidden) == as_unknown(unknown, "made_up")


async def test_a_renamed_tool_is_listed_and_called_by_its_new_name(gateway, http) -> None:
    url = await gateway(tasks={"tools": CURATED})
    listed = (await modern(http, url, "tools/list", {})).body["result"]["tools"]
    shown = next(t for t in listed if t["name"] == "show_params")
    assert (shown["title"], shown["description"]) == ("Params", "What reached it.")
    assert shown["annotations"] == {"readOnlyHint": True}
    # The server ran its own `params` tool: it answers with the keys that reached it.
    answered = await call(http, url, "show_params", {"x": 1})
    assert json.loads(answered.body["result"]["content"][0]["text"]) == ["arguments", "name"]
    client = await legacy_session(http, url)
    tool = next(t for t in await legacy_list(client) if t["name"] == "show_params")
    assert tool["execution"] == {"taskSupport": "optional"} and tool["title"] == "Params"
    said = await legacy_call(client, "show_params")
    assert "isError" not in said["result"]


async def test_a_renamed_tools_mode_is_found_under_its_new_name(gateway, http) -> None:
    url = await gateway(tasks={"tools": {"params": {"name": "show_params"},
                                         "show_params": {"mode": "never"}}})
    client = await legacy_session(http, url)
    tool = next(t for t in await legacy_list(client) if t["name"] == "show_params")
    assert tool["execution"] == {"taskSupport": "forbidden"}


async def test_two_principals_see_different_lists(gateway, http) -> None:
    alice, bob = "alice-token-0123456789abcdef0123456789", "bob-token-0123456789abcdef01234567"
    tokens = [{"token": alice, "scopes": ["read"], "name": "alice"},
              {"token": bob, "scopes": ["read", "write"], "name": "bob"}]
    tools = {**CURATED, "sleep": {"scopes": ["write"]}, "echo": {"scopes": ["read"]}}
    url = await gateway(auth={"bearer_tokens": tokens}, tasks={"tools": tools})

    async def names(token: str) -> set[str]:
        reply = await modern(http, url, "tools/list", {}, headers=bearer(token))
        return {t["name"] for t in reply.body["result"]["tools"]}

    seen_by_alice, seen_by_bob = await names(alice), await names(bob)
    assert "sleep" not in seen_by_alice and "sleep" in seen_by_bob
    assert "show_params" in seen_by_alice and "crash" not in seen_by_bob
    client = await legacy_session(http, url, **bearer(alice))
    assert "sleep" not in {t["name"] for t in await legacy_list(client, **bearer(alice))}


async def test_without_curation_lists_pass_through_unchanged(gateway, http) -> None:
    url = await gateway(tasks={"tools": {"echo": {"mode": "never"}}})
    listed = (await modern(http, url, "tools/list", {})).body["result"]["tools"]
    assert {"crash", "params", "garble"} <= {t["name"] for t in listed}
    assert all(set(t) == {"name", "inputSchema"} for t in listed)


def test_check_config_refuses_clashing_renames(tmp_path) -> None:
    conf = tmp_path / "clash.yaml"
    conf.write_text("upstreams:\n  main: {command: python3}\ntasks:\n  tools:\n"
                    "    a: {name: same}\n    b: {name: same}\n")
    res = subprocess.run([sys.executable, "-m", "gateway", "--check-config", str(conf)],
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 2
    assert "tasks.tools.b.name: tools 'a' and 'b' are both renamed 'same'" in res.stderr


async def test_a_hidden_tool_called_as_a_core_task_is_answered_as_unknown(gateway, http
                                                                          ) -> None:
    url = await gateway(tasks={"tools": CURATED})
    client = await legacy_session(http, url)

    async def as_task(name: str) -> Any:
        made = await client.send({"jsonrpc": "2.0", "id": next(client.ids),
                                  "method": "tools/call",
                                  "params": {"name": name, "arguments": {}, "task": {}}})
        task_id = made.message["result"]["task"]["taskId"]
        ended = await client.send({"jsonrpc": "2.0", "id": 9, "method": "tasks/result",
                                   "params": {"taskId": task_id}})
        answer = dict(ended.message)
        answer["result"] = {k: v for k, v in answer["result"].items() if k != "_meta"}
        return answer  # its related-task _meta names its own id

    unknown = await as_task("made_up")
    assert as_unknown(await as_task("crash"), "crash") == as_unknown(unknown, "made_up")


async def test_a_tool_the_server_adds_later_is_curated(gateway, http) -> None:
    url = await gateway(tasks={"tools": {"added": {"name": "late_addition"}}})
    await call(http, url, "changed")  # the server lists "added" from now on
    listed = (await modern(http, url, "tools/list", {})).body["result"]["tools"]
    names = {t["name"] for t in listed}
    assert "late_addition" in names and "added" not in names
    answered = await call(http, url, "late_addition")
    assert answered.body["result"]["content"][0]["text"] == "added"
