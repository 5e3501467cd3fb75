"""Upstream input is checked once, at the boundary: a malformed line is dropped alone, and
every other message of the same read still reaches its call, however the bytes are cut."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_correlator import Owner, Sink, call, connect

from gateway.upstream.stdio import _Pipes

# Lines that are JSON-RPC in name only: each once broke routing (a type error in the
# reader lost the rest of its read), or would be taken for what it is not.
MALFORMED = [
    b'{"jsonrpc":"2.0","id":{"a":1},"result":{}}',
    b'{"jsonrpc":"2.0","id":[1],"result":{}}',
    b'{"jsonrpc":"2.0","id":true,"result":{}}',
    b'{"jsonrpc":"2.0","method":5}',
    b'{"jsonrpc":"2.0","method":null,"id":3}',
    b'{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":[1]}}',
    b'{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":{"x":1}}}',
    b'{"jsonrpc":"2.0","method":"notifications/resources/updated","params":{"uri":{"x":1}}}',
    b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":[1]}}',
    b'{"jsonrpc":"2.0","method":"notifications/message","params":[1,2]}',
    b'{"jsonrpc":"2.0","method":"roots/list","id":4,"params":"x"}',
    b'{"jsonrpc":"2.0","id":1,"result":{},"error":{"code":1,"message":"both"}}',
    b'{"id":1,"result":{"no":"jsonrpc"}}',
    b'[1,2,3]', b'"text"', b"{not json", b"\xff\xfe",
]
junk = st.binary(max_size=40).map(lambda b: b.replace(b"\n", b" "))
bad_line = st.one_of(st.sampled_from(MALFORMED), junk)


def response(uid: int, n: int) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "id": uid, "result": {"n": n}})


async def scenario(calls: int, bad: list[bytes], order: list[int], cuts: list[int]) -> None:
    conn, _ = await connect()
    sinks = [Sink() for _ in range(calls)]
    uids = [conn.request(call("slow", f"c{i}"), Owner("a"), s).upstream_id
            for i, s in enumerate(sinks)]
    lines = [response(uid, i) for i, uid in enumerate(uids)] + bad
    stream = b"".join(lines[i] + b"\n" for i in order)
    pipes = _Pipes("mock", conn.on_message, lambda: None, 1 << 20)
    edges = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    for start, end in itertools.pairwise(edges):
        pipes.pipe_data_received(1, stream[start:end])
    for i, sink in enumerate(sinks):
        assert [r["id"] for r in sink.responses] == [f"c{i}"]
        assert sink.responses[0]["result"] == {"n": i}
    assert not pipes.out  # nothing handled stays in the buffer


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_each_valid_response_reaches_its_call_whatever_surrounds_it(data: Any) -> None:
    calls = data.draw(st.integers(1, 6))
    bad = data.draw(st.lists(bad_line, max_size=12))
    order = data.draw(st.permutations(range(calls + len(bad))))
    cuts = data.draw(st.lists(st.integers(0, 10_000), max_size=8))
    asyncio.run(scenario(calls, bad, list(order), cuts))


async def test_a_message_read_in_parts_is_let_go_as_bytes_before_its_call_hears_it() -> None:
    """A big answer comes in many reads: its bytes are handed to the link whole, which
    empties them once parsed, so its call's client is not served while they are held too
    (issue 54: a 1 MiB answer was held as read, parsed and serialized at once)."""
    conn, _ = await connect()
    handed: list[bytes | bytearray | memoryview] = []
    held_when_answered: list[int] = []

    class Watching(Sink):
        def on_response(self, msg: dict[str, Any]) -> None:
            held_when_answered.extend(len(data) for data in handed)
            super().on_response(msg)

    sink = Watching()
    uid = conn.request(call("slow", "c0"), Owner("a"), sink).upstream_id
    line = orjson.dumps({"jsonrpc": "2.0", "id": uid, "result": {"text": "x" * 300_000}})
    pipes = _Pipes("mock", lambda data: handed.append(data) or conn.on_message(data),
                   lambda: None, 1 << 20)
    for start in range(0, len(line), 65_536):
        pipes.pipe_data_received(1, line[start:start + 65_536])
    pipes.pipe_data_received(1, b"\n")
    assert [r["result"]["text"] for r in sink.responses] == ["x" * 300_000]
    assert held_when_answered == [0] and not pipes.out
