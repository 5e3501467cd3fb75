"""The work budget (docs/performance.md): the Python function calls one request costs
through the whole gateway, counted in one process by bench/calls.py (a legacy echo, a modern
echo, a `tasks/get` of a finished task), stay within a budget. The count is exact (the same
on a loaded machine as on an idle one), so a change that adds work to every request fails
here until its commit raises the budget on purpose."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "bench"))
from calls import table

ROOT = Path(__file__).parents[2]

# Python function calls (and coroutine resumptions) a request, counted with Python 3.11.7,
# aiohttp 3.14.5 and uvloop 0.23.0, plus MARGIN. To raise one: see what grew (the failure
# shows the top functions; `bench/calls.py --save` before the change and `--against` after
# it show every function that moved), write the figure the failure names, and say in the
# commit message which change costs the calls and why it is worth them. A count well under
# its budget fails too: lower the budget then, so that room is not spent unseen.
BUDGET = {"legacy-echo": 226, "modern-echo": 245, "tasks-get": 119}
MARGIN = 1.02  # the count does not move with load: room for a dependency's patch release
SLACK = 1.05  # a budget more than this above its count is to be lowered
# What the budget was counted with (a failure says when this run differs: a new aiohttp
# moves the count by itself, and the commit that takes it sets the budgets anew).
COUNTED_WITH = {"python": "3.11.7", "aiohttp": "3.14.5", "uvloop": "0.23.0"}

# Modes that add calls of their own to every request: never counted.
DEBUGGING = ("PYTHONASYNCIODEBUG", "PYTHONDEVMODE", "PYTHONTRACEMALLOC", "PYTHONWARNINGS")

pytestmark = [
    pytest.mark.skipif(sys.platform == "win32", reason="the count runs on uvloop"),
    # Another Python counts otherwise (3.12 inlines comprehensions, starts tasks eagerly):
    # budgets for it are counted on it, in a dict of their own.
    pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="budgets counted on 3.11"),
]


@pytest.fixture(scope="module")
def counted() -> dict[str, Any]:
    """bench/calls.py's figures, from a process of its own: no other test's state, none of
    pytest's hooks, and the logging `serve` sets up."""
    env = {k: v for k, v in os.environ.items() if k not in DEBUGGING}
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "calls.py"), "--json"],
        capture_output=True, text=True, timeout=90, cwd=ROOT,
        env={**env, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    figures: dict[str, Any] = json.loads(done.stdout)
    return figures


def shown(flow: str, figures: dict[str, Any]) -> str:
    """The failure's table: the versions (those unlike the budget's named), the calls by
    origin and by the gateway's module, the top functions."""
    versions = ", ".join(f"{k} {v}" for k, v in figures["versions"].items())
    moved = [f"{k} {figures['versions'][k]} (budget's: {v})"
             for k, v in COUNTED_WITH.items() if figures["versions"][k] != v]
    if moved:
        versions += "\nnot what the budget was counted with: " + ", ".join(moved)
    return (f"{versions}\n{table(flow, figures['flows'][flow], 30)}\n"
            "(every function: PYTHONPATH=. .venv/bin/python bench/calls.py --top 400)")


@pytest.mark.parametrize("flow", sorted(BUDGET))
def test_a_request_costs_no_more_calls_than_its_budget(counted: dict[str, Any], flow: str
                                                        ) -> None:
    calls = counted["flows"][flow]["calls"]
    new = math.ceil(calls * MARGIN)
    assert calls <= BUDGET[flow], (
        f"{flow} costs {calls:g} calls a request, over its budget of {BUDGET[flow]}: find "
        f"what grew below; if it is worth it, raise BUDGET['{flow}'] to {new} and say why "
        f"in the commit message\n{shown(flow, counted)}")
    assert BUDGET[flow] <= calls * SLACK, (
        f"{flow} costs {calls:g} calls a request, well under its budget of {BUDGET[flow]}: "
        f"lower BUDGET['{flow}'] to {new}\n{shown(flow, counted)}")


def test_the_count_is_exact(counted: dict[str, Any]) -> None:
    """Most windows of a flow agree to the call (a timer may add to one window, never to
    most): the budget holds the work, not the machine's load."""
    for flow, got in counted["flows"].items():
        exact = [w for w in got["windows"] if w == got["calls"]]
        assert len(exact) * 2 > len(got["windows"]), (flow, got["windows"])
