"""Issue 41, F2: an HTTP upstream's answer is counted in the answer budget while it is read,
not only once it is whole. A gateway process of its own (test_bytes_budget.py's) in front of
tests/servers/unruly_http.py, whose `big` tool, given `hold_s`, writes all but the last
bytes of its answer and waits: the answer stays read in part meanwhile."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from mcp_http import McpHttp
from test_bytes_budget import MIB, gateway_process, peak_mib, principal, text_length
from test_upstream_edges import unruly

HOLD_S = 6.0  # how long each of Bob's answers waits for its last bytes
BOBS = 24  # calls of 7 MiB: 168 MiB in all, against a budget of 16 (8 a principal)


async def timed(session: McpHttp, arguments: dict[str, Any]) -> tuple[dict[str, Any], float]:
    """A call of `big` and how long its answer took, in seconds."""
    loop = asyncio.get_running_loop()
    began = loop.time()
    reply = await session.call("big", arguments)
    return reply.message, loop.time() - began


@pytest.mark.parametrize("how", ["json", "chunked", "sse"])
async def test_answers_read_in_part_are_refused_at_bobs_share_not_alices(how: str) -> None:
    """Bob's 24 answers of 7 MiB stall before their last bytes: they are counted as they
    come, and refused at his share (8 MiB) while they are read, each call failing alone
    with the error that names the bound, long before its answer would be whole; at most
    one (7 MiB fits his share) comes whole. Alice's calls, two at once, are answered whole
    meanwhile, and the gateway grows by about the budget, not by Bob's 168 MiB (it grew
    ~200 MiB before: answers read in part were not counted)."""
    async with unruly() as base, gateway_process(base + "/mcp", {
            "max_inflight_bytes": 16 * MIB, "max_inflight_bytes_per_principal": 8 * MIB,
            "max_message_bytes": 8 * MIB}) as (url, pid), \
            principal(url, "alice") as alice, principal(url, "bob") as bob:
        await alice.call("big", {"mib": 7, "how": how})  # warm: what one answer costs
        before = peak_mib(pid)
        bobs = [asyncio.ensure_future(timed(bob, {"mib": 7, "how": how, "hold_s": HOLD_S}))
                for _ in range(BOBS)]
        await asyncio.sleep(1)  # Bob's answers are being read (or refused already)
        for _ in range(2):
            twice = await asyncio.wait_for(asyncio.gather(
                alice.call("big", {"mib": 3, "how": how}),
                alice.call("big", {"mib": 3, "how": how})), 10)
            assert [text_length(r.message) for r in twice] == [3 * MIB] * 2
        answers = await asyncio.gather(*bobs)
        refused = [(msg["error"], took) for msg, took in answers if "error" in msg]
        assert len(refused) >= BOBS - 1, [msg.get("error") for msg, _ in answers]
        for error, took in refused:
            assert error["data"]["limit"] == "limits.max_inflight_bytes_per_principal", error
            assert "max_inflight_bytes_per_principal (8388608 bytes)" in error["message"]
            assert took < HOLD_S, f"refused after {took:.1f} s: once whole, not as it was read"
        for msg, _ in answers:
            if "result" in msg:
                assert text_length(msg) == 7 * MIB
        grown = peak_mib(pid) - before
        assert grown < 48, f"the gateway grew {grown:.1f} MiB for Bob's 168 MiB read in part"
        # Nothing is left counted: Bob's next call, and Alice's, are answered whole.
        assert text_length((await bob.call("big", {"mib": 7, "how": how})).message) == 7 * MIB
        assert text_length((await alice.call("big", {"mib": 7, "how": how})).message) == 7 * MIB
