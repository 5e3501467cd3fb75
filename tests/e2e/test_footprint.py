"""What a running gateway holds (issue 34, item 4): the settings are validated by pydantic in
a forked child, so the process that serves never maps pydantic's compiled core."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import free_port, listening, stop
from mcp_http import BASIC, McpHttp

pytestmark = pytest.mark.skipif(not Path("/proc/self/maps").exists(),
                                reason="reads the process's mappings in /proc")


async def test_the_serving_cli_never_loads_pydantic(http) -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gateway", "--port", str(port),
                             "--log-level", "error", "--", *BASIC])
    try:
        await listening(port)
        mcp = McpHttp(http, f"http://127.0.0.1:{port}/mcp")
        await mcp.initialize()
        reply = await mcp.call("echo", {"text": "hi"})
        assert "hi" in str(reply.body["result"]["content"])
        maps = Path(f"/proc/{proc.pid}/maps").read_text()
        assert "pydantic" not in maps  # its compiled core, _pydantic_core*.so
    finally:
        stop(proc)
