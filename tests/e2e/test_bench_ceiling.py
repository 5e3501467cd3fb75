"""bench/ceiling.py compares the gateway with bridges that do less (bench/README.md,
"ceiling"): its figures mean something only if those bridges answer what the server would.
Each one echoes a text through a real HTTP session, and one short run of the script
reports every bridge."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "bench"))
from ceiling import NODE, answering, bridges

from bench import Http, free_port

ROOT = Path(__file__).parents[2]
TEXT = "ceiling ✓ \"quoted\" " + "x" * (1 << 19)  # aiohttp warns of bigger bodies


@pytest.fixture(params=["thin", "null-aiohttp", "null-node"])
def bridge_url(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "null-node" and not NODE.exists():
        pytest.skip("no node in tests/node (scripts/test.sh installs it)")
    port = free_port()
    command = bridges(str(NODE))[request.param](port)
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL)
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(10)


async def test_each_bridge_echoes_what_the_server_would(bridge_url: str) -> None:
    assert await answering(bridge_url)
    client = Http(bridge_url)
    await client.start()
    try:
        result = await client.request("tools/call", {"name": "echo",
                                                     "arguments": {"text": TEXT}})
    finally:
        await client.close()
    assert result["content"][0]["text"] == TEXT


@pytest.mark.slow
def test_a_short_ceiling_run_reports_every_bridge(tmp_path: Path) -> None:
    out = tmp_path / "ceiling.json"
    subprocess.run([sys.executable, str(ROOT / "bench" / "ceiling.py"), "--rounds", "1",
                    "--calls", "400", "--json", str(out)], check=True, timeout=240,
                   cwd=ROOT)
    medians = json.loads(out.read_text())["medians"]
    expected = {"direct", "gateway", "thin", "null-aiohttp"} | (
        {"null-node"} if NODE.exists() else set())
    assert set(medians) == expected
    for name, figures in medians.items():
        assert figures["echo32_rps"] > 0 and figures["big_p50_ms"] > 0, name
        if name != "direct":
            assert figures["bridge_us"] > 0 and figures["rss_mib"] > 0, name
