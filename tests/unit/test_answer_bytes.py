"""answer_bytes.py with a stdio reader (issue 41, item 1c): a line a server has written in
part is counted in the gateway's answer budget until it is whole (then it is its call's
answer, held by its principal) or its process is gone; it is never refused, and it makes
the overall bound meet a principal over its share sooner, never one under it."""

from __future__ import annotations

import pytest

from gateway.answer_bytes import AnswerBytes
from gateway.errors import AnswersOverBudget
from gateway.upstream.stdio import _Pipes

MIB = 1 << 20


async def test_a_part_read_line_is_counted_until_it_is_whole_or_its_process_gone() -> None:
    budget = AnswerBytes(64 * MIB, 16 * MIB)
    lines: list[bytes] = []
    pipes = _Pipes("main", lambda line: lines.append(bytes(line)), lambda: None, 8 * MIB,
                   budget.reading("upstream main"))
    pipes.pipe_data_received(1, b'{"jsonrpc":"2.0","id":1,"result":{"t":"' + b"x" * MIB)
    assert budget.total == budget.held["upstream main"] > MIB
    pipes.pipe_data_received(1, b'"}}\n{"jsonrpc":"2.0","id":2,')  # one whole, one begun
    assert len(lines) == 1 and budget.total == len(b'{"jsonrpc":"2.0","id":2,')
    pipes.pipe_connection_lost(1, None)  # the process went mid-line
    assert budget.total == 0 and not budget.held


async def test_a_line_past_max_message_bytes_is_dropped_and_uncounted() -> None:
    budget = AnswerBytes(64 * MIB, 16 * MIB)
    killed: list[bool] = []
    pipes = _Pipes("main", lambda _: None, lambda: killed.append(True), MIB,
                   budget.reading("upstream main"))
    pipes.pipe_data_received(1, b"x" * (MIB + 1))
    assert killed and budget.total == 0


def test_lines_read_count_toward_the_overall_bound_for_those_over_their_share() -> None:
    """32 MiB in all: a server writing a 20 MiB line for Bob's call leaves Alice, who holds
    2 MiB, her next answer; Bob, who holds 10 MiB already, meets the bound."""
    budget = AnswerBytes(32 * MIB, 16 * MIB)
    budget.take("alice", 2 * MIB)
    budget.take("bob", 10 * MIB)
    budget.reading("upstream main")(20 * MIB)
    budget.take("alice", 2 * MIB)
    with pytest.raises(AnswersOverBudget, match=r"limits\.max_inflight_bytes"):
        budget.take("bob", MIB)
