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
