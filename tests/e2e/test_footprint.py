"""What a running gateway holds (issue 34, item 4): the settings are validated by pydantic in
a forked child, so the process that serves never maps pydantic's compiled core. Issue 54:
nor libstdc++ (frozenlist's compiled extension, ~1 MiB), nor prometheus_client (/metrics is
written by the gateway), nor the HTTP upstream client for stdio servers only."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import free_port, listening, loaded_by, stop
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
        assert "libstdc++" not in maps  # frozenlist's C++ extension brings it
        assert "_frozenlist" not in maps
    finally:
        stop(proc)


def test_a_gateway_of_stdio_servers_loads_neither_the_http_client_nor_prometheus() -> None:
    app = ("from gateway.app import create_app; from gateway.settings.load import "
           "from_mapping; create_app(from_mapping({'upstreams': {'main': {%s}}}))")
    heavy = ("gateway.upstream.http", "prometheus_client")
    assert loaded_by(app % "'command': 'true'", heavy) == []
    assert loaded_by(app % "'url': 'http://127.0.0.1:9/mcp'", heavy) == [
        "gateway.upstream.http"]  # loaded at start with its backend, not at a first call


def test_aiohttp_is_imported_lean_and_leaves_the_environment_and_mimetypes_as_they_were(
        ) -> None:
    """frozenlist is the pure one, and no upstream inherits the variable that chose it;
    aiohttp's file responses hold Python's own MIME table, not the system's, and the
    `mimetypes` module still reads the system's when asked."""
    lean = ("import os, mimetypes; from gateway.cli import PURE_FROZENLIST, _lean_imports; "
            "_lean_imports(); import aiohttp.web; from aiohttp import web_fileresponse as f; "
            "assert PURE_FROZENLIST not in os.environ and not mimetypes.inited; "
            "assert f.CONTENT_TYPES.guess_type('a.json')[0] == 'application/json'; "
            "assert len(f.CONTENT_TYPES.types_map[True]) <= len(mimetypes.types_map) + 9")
    assert loaded_by(lean, ("frozenlist", "frozenlist._frozenlist")) == ["frozenlist"]
