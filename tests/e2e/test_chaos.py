"""A short run of bench/chaos.py, the same script that measures a long one: three replicas
behind the shipped haproxy configuration, a Sentinel-managed Redis pair, load from both eras,
and every incident of the long run (a replica killed and started again, the primary
SIGSTOPped, killed and failed over, the store restarted empty, another replica killed).
Every acknowledged task ends with its right result or an honest failure."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


@pytest.mark.slow
@pytest.mark.timeout(270)
def test_a_short_chaos_run_loses_nothing(tmp_path: Path) -> None:
    out = tmp_path / "chaos.json"
    proc = subprocess.Popen([sys.executable, str(ROOT / "bench" / "chaos.py"), "--seed", "3",
                             "--load-seconds", "20", "--json", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _, err = proc.communicate(timeout=220)
    except subprocess.TimeoutExpired:
        proc.terminate()  # it ends the processes it started
        _, err = proc.communicate(timeout=20)
    assert out.exists(), err[-2000:]
    report = json.loads(out.read_text())
    print(json.dumps(report, indent=1))  # shown when an assertion fails
    assert (report["lost"], report["stuck"], report["wrong"]) == (0, 0, 0), report["problems"]
    assert report["errors_unexplained"] == []  # pass-through errors only near incidents
    assert report["acknowledged"] >= 100 and report["outcome"]["ok"] >= 50
    assert {"modern", "core"} <= set(report["by_era"])
    assert report["calls"]["plain calls"] > 0 and report["calls"]["mrtr rounds"] > 0
    happened = " ".join(report["events"])
    for incident in ("kill replica", "SIGSTOP", "sentinels promoted", "empty"):
        assert incident in happened
    # The report tells the load's length and the run's apart (bench/README.md).
    assert 20 <= report["load_s"] < report["run_s"]
    assert proc.returncode == 0
