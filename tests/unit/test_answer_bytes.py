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
    assert budget.total == budget.reading_now["upstream main"] > MIB and not budget.held
    pipes.pipe_data_received(1, b'"}}\n{"jsonrpc":"2.0","id":2,')  # one whole, one begun
    assert len(lines) == 1 and budget.total == len(b'{"jsonrpc":"2.0","id":2,')
    pipes.pipe_connection_lost(1, None)  # the process went mid-line
    assert budget.total == 0 and not budget.held and not budget.reading_now


async def test_a_line_past_max_message_bytes_is_dropped_and_uncounted() -> None:
    budget = AnswerBytes(64 * MIB, 16 * MIB)
    killed: list[bool] = []
    pipes = _Pipes("main", lambda _: None, lambda: killed.append(True), MIB,
                   budget.reading("upstream main"))
    pipes.pipe_data_received(1, b"x" * (MIB + 1))
    assert killed and budget.total == 0


def test_lines_read_count_toward_the_overall_bound_for_those_over_their_share() -> None:
    """32 MiB in all: a server writing a 20 MiB line leaves Alice, who holds 2 MiB, her
    next answer; Bob, who holds 14 MiB, meets the bound past his fair share of 16 MiB
    (without the line, 20 MiB in all, he would not)."""
    budget = AnswerBytes(32 * MIB, 24 * MIB)
    budget.take("alice", 2 * MIB)
    budget.take("bob", 14 * MIB)
    budget.reading("upstream main")(20 * MIB)
    budget.take("alice", 2 * MIB)
    with pytest.raises(AnswersOverBudget, match=r"limits\.max_inflight_bytes"):
        budget.take("bob", 4 * MIB)


def test_a_line_read_is_no_principal_of_the_fair_share() -> None:
    """A second look: the upstream's line counted as one more holder, so Alice alone,
    under her share of 64 MiB, was refused while Bob's 36 MiB line was read."""
    budget = AnswerBytes(64 * MIB, 48 * MIB)
    budget.take("alice", 30 * MIB)
    budget.reading("upstream main")(36 * MIB)
    budget.take("alice", 10 * MIB)  # 40 of 64: alone, she is under her share
    assert budget.held["alice"] == 40 * MIB and budget.total == 76 * MIB
