"""Per-tool entries of the settings that match no tool the upstream lists (issue 53, item
4): a typo until proven otherwise, said once in the log and shown to operators, for the
global entries (once every upstream listed its tools) and an upstream's own."""

from __future__ import annotations

import asyncio
import re

import structlog
from conftest import settings_for


async def test_an_entry_that_matches_no_listed_tool_is_said_once(gateway, http) -> None:
    main = {**settings_for()["upstreams"]["main"],
            "tasks": {"tools": {"slep": {"mode": "always"}, "sleep": {"mode": "always"}}}}
    with structlog.testing.capture_logs() as events:
        url = await gateway(upstreams={"main": main}, tasks={"tools": {
            "trigger-long-runing-operation": {"mode": "always"}, "ech*": {"mode": "never"}}})
        for _ in range(100):  # once the server's tools/list is in (asked at its start)
            async with http.get(url.replace("/mcp", "/readyz?detail")) as resp:
                found = (await resp.json()).get("tool_entries_unmatched")
            if found and len(found) == 2:
                break
            await asyncio.sleep(0.05)
        async with http.get(url.replace("/mcp", "/status")) as resp:
            page = await resp.text()
    assert found == {"*": ["trigger-long-runing-operation"], "main": ["slep"]}
    said = [(e["upstream"], e["pattern"]) for e in events
            if e["event"] == "tasks.tool_unmatched"]
    assert sorted(said) == [("*", "trigger-long-runing-operation"), ("main", "slep")]
    assert "trigger-long-runing-operation" in page and "a typo?" in page


async def test_entries_that_all_match_say_nothing(gateway, http) -> None:
    url = await gateway(tasks={"tools": {"echo": {"mode": "never"}, "s*": {"mode": "auto"}}})
    await asyncio.sleep(0.3)  # its tools/list in
    async with http.get(url.replace("/mcp", "/readyz?detail")) as resp:
        detail = await resp.json()
    assert "tool_entries_unmatched" not in detail
    # What an operator compares across replicas (docs/replicas.md): the entries' digest.
    assert re.fullmatch("[0-9a-f]{16}", detail["tools_config"])
