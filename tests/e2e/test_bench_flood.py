"""bench/flood.py (bench/README.md, flood.py) prints issue 41's flood table: its quick run
floods a gateway of its own once, small, and prints the table's row beside the budget the
gateway's defaults document, and leaves no process of its own behind."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


@pytest.mark.slow
def test_a_quick_flood_prints_its_row_against_the_budget(tmp_path: Path) -> None:
    figures = tmp_path / "flood.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "flood.py"), "--quick",
                           "--json", str(figures)], cwd=ROOT / "bench", capture_output=True,
                          text=True, timeout=90, check=True)
    lines = done.stdout.splitlines()
    assert lines[0].startswith("host: ")
    assert lines[1].startswith("| attack | gateway peak RSS growth | its budget |")
    row = next(line for line in lines if line.startswith("| 1a: "))
    assert "max_inflight_bytes_per_principal 128 MiB (overall 512 MiB)" in row
    assert "3 × ok (8 MiB)" in row  # Bob reads his three answers whole
    assert re.search(r"\| (\d+)/\1 answered, p50 [\d.]+ s, max [\d.]+ s \|$", row), row
    # The gateway and the server it ran are gone.
    for pid in json.loads(figures.read_text())["rows"][0]["pids"]:
        cmdline = Path(f"/proc/{pid}/cmdline")
        running = cmdline.read_bytes() if cmdline.exists() else b""
        assert b"basic.py" not in running and b"gateway" not in running, pid
