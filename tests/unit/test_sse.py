"""SSE stream buffers: bounded in events and in bytes; the newest event always stays."""

from __future__ import annotations

from gateway.downstream.sse import Stream


def test_the_buffer_is_bounded_in_bytes_and_keeps_the_newest() -> None:
    stream = Stream("1", replay=1000, max_bytes=3000)
    for _ in range(10):
        stream.push(b"x" * 1000)
    assert [seq for seq, _ in stream.buffer] == [8, 9, 10] and stream.bytes == 3000
    stream.push(b"y" * 5000, last=True)  # bigger than the bound: kept alone, not dropped
    assert [seq for seq, _ in stream.buffer] == [11] and stream.bytes == 5000
    assert stream.since(9) == [(11, b"y" * 5000)] and stream.closed


def test_the_buffer_is_bounded_in_events() -> None:
    stream = Stream("1", replay=100)
    for i in range(500):
        stream.push(b"%d" % i)
    assert len(stream.buffer) == 100 and stream.buffer[0][0] == 401
    assert stream.bytes == sum(len(d) for _, d in stream.buffer)
