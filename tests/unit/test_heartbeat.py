"""The progress heartbeat of one quiet call (downstream/heartbeat.py), alone: it speaks for
its client's token only when the call stays quiet, says whether the call runs or waits
(never how many are ahead), and every progress value its client hears increases (spec:
Progress), the server's own included."""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.downstream.heartbeat import Heartbeat, after


def progress(value: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": "notifications/progress",
            "params": {"progressToken": "t", "progress": value}}


def test_after_is_the_next_tidy_value_above() -> None:
    assert after(None) == 0.001
    assert after(3) == 3.001
    assert after(0.0015) > 0.0015
    big = 2.0 ** 60  # where a thousandth is lost to rounding: the next float instead
    assert after(big) > big


async def test_a_quiet_call_hears_it_runs_until_stopped() -> None:
    sent: list[dict[str, Any]] = []
    beat = Heartbeat("tok", 0.05, sent.append)
    await asyncio.sleep(0.3)
    assert len(sent) >= 2
    assert all(m["params"]["progressToken"] == "tok" for m in sent)
    values = [m["params"]["progress"] for m in sent]
    assert values == sorted(values) and len(set(values)) == len(values)
    assert sent[0]["params"]["message"].startswith("still running")
    beat.stop()
    stopped = len(sent)
    await asyncio.sleep(0.15)
    assert len(sent) == stopped


async def test_a_call_that_speaks_hears_no_heartbeat() -> None:
    sent: list[dict[str, Any]] = []
    beat = Heartbeat("tok", 0.4, sent.append)
    for value in range(8):  # the call's own progress, every 50 ms: never quiet for 0.4 s
        beat.heard(progress(value + 1))
        await asyncio.sleep(0.05)
    beat.stop()
    assert sent == []


async def test_a_queued_call_says_it_waits_not_how_many_are_ahead() -> None:
    sent: list[dict[str, Any]] = []
    beat = Heartbeat("tok", 0.03, sent.append, waiting=lambda: 7)
    await asyncio.sleep(0.05)
    beat.stop()
    assert sent and sent[0]["params"]["message"].startswith("queued (")
    assert "7" not in sent[0]["params"]["message"]


async def test_the_servers_values_are_raised_above_the_last_sent() -> None:
    sent: list[dict[str, Any]] = []
    beat = Heartbeat("tok", 0.03, sent.append)
    await asyncio.sleep(0.05)
    beat.stop()
    last = sent[-1]["params"]["progress"]
    low = progress(0)  # the server starts at 0 after the heartbeat spoke
    beat.heard(low)
    assert low["params"]["progress"] > last
    high = progress(50)
    beat.heard(high)
    assert high["params"]["progress"] == 50  # above: untouched
    odd = {"jsonrpc": "2.0", "method": "notifications/progress", "params": ["not", "a", "map"]}
    beat.heard(odd)  # malformed params pass as they are
    assert odd["params"] == ["not", "a", "map"]


async def test_an_exchange_that_never_responds_lets_go_when_closed() -> None:
    """A wait whose lookup failed before it responded (downstream/exchange.py `close`): its
    heartbeat stops and its answer's bytes go back, once, however often it is closed."""
    from gateway.answer_bytes import AnswerBytes
    from gateway.downstream import sse
    from gateway.downstream.exchange import Exchange

    budget = AnswerBytes(1 << 20, 1 << 20)
    hold = budget.hold("alice")
    ex = Exchange(1, True, lambda: sse.Stream("0", 0), {}, hold)
    ex.heartbeat("tok", sse.Flow(keepalive_s=1, slow_s=1, heartbeat_s=0.03), None)
    hold.take(100)  # an answer's bytes, held and never written
    await asyncio.sleep(0.1)
    assert ex.early  # quiet: its heartbeat spoke
    ex.close()
    ex.close()
    assert budget.held["alice"] == 0
    sent = len(ex.early)
    await asyncio.sleep(0.1)
    assert len(ex.early) == sent  # and speaks no more
