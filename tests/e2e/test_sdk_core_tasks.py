"""Two real task-capable legacy clients through the gateway, both on protocol 2025-11-25 core
tasks in front of the plain stdio test server (whose tools know nothing of tasks): the
TypeScript SDK (`client.experimental.tasks`) and the Python SDK mcp==1.30.0
(`session.experimental`), each printing what its user sees."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import MCP130, NODE_BIN, node_env

HERE = Path(__file__).parents[1]
POLICY = {"defaults": {"poll_interval_ms": 100},
          "tools": {"echo": {"mode": "never"}, "crash": {"mode": "required"}}}


async def transcript(*argv: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(*argv, env=env, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()
    return json.loads(out.splitlines()[-1])


def check_common(seen: dict[str, Any]) -> None:
    assert seen["capabilities"] == {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
    assert (seen["support"]["echo"], seen["support"]["sleep"], seen["support"]["crash"]) == (
        "forbidden", "optional", "required")
    assert len(seen["asked"]) == 1 and seen["asked"][0][1]  # with the related task's id
    assert seen["cancelled"] == "cancelled"
    assert seen["cancel_again" if "cancel_again" in seen else "cancelAgain"] == -32602
    assert seen["cancel_done" if "cancel_done" in seen else "cancelDone"] == -32602
    assert seen["unknown"] == -32602
    assert seen["pages"][0] == 50 and len(seen["pages"]) == 2


@pytest.mark.node
async def test_typescript_sdk_tasks(gateway) -> None:
    url = await gateway(tasks=POLICY)
    seen = await transcript(str(NODE_BIN / "node"), str(HERE / "node" / "tasks.mjs"), url,
                            env=node_env())
    check_common(seen)
    # The time bound (request_timeout_ms, 600 s) plus ttl_ms (600 s): issue 40.
    assert seen["sleep"][0] == ["created", "working", 1_200_000]
    assert seen["sleep"][-1] == ["result", "slept 300", "related"]
    assert json.loads(seen["ask"][-1][1])["content"] == {"name": "Ada"}
    assert seen["asked"][0][0] == "Name?"
    assert seen["failed"][-2] == ["status", "failed"] and seen["failed"][-1][0] == "error"
    assert (seen["early"], seen["after"]) == ("slept 400", "completed")
    assert seen["forbidden"] == -32601
    assert seen["pages"] == [50, 7]  # 3 streamed, 2 by hand, 52 in a loop


async def test_python_sdk_1_30_tasks(gateway) -> None:
    if not MCP130.exists():
        pytest.fail("the mcp==1.30.0 environment is missing: run scripts/test.sh")
    url = await gateway(tasks=POLICY)
    seen = await transcript(str(MCP130), str(HERE / "clients" / "mcp130_tasks.py"), url)
    check_common(seen)
    assert seen["created"] == ["working", 630_000]  # the time bound + the 30 s asked
    assert seen["polled"] == "completed" and seen["result"] == ["slept 300", True]
    assert seen["answered"] == {"name": "Grace"} and seen["asked"][0][0] == "Who?"
    assert seen["pages"] == [50, 3]  # 3 before, 50 in a loop
