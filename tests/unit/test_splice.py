"""A pass-through answer's id is replaced in its bytes exactly, or not at all (the caller then
dumps the parsed message): hostile ids and results never make a client read another id."""

from __future__ import annotations

import json
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_correlator import Owner, call, connect

from gateway.protocol.jsonrpc import RequestId
from gateway.protocol.splice import replace_id
from gateway.upstream.mock import MockSink
from gateway.upstream.stdio import _Pipes

HOSTILE_IDS: list[RequestId] = ['a"b', "\\", '\\"}', "\u00e9\u4e2d\U0001f600", "\n", "",
                                '","id":1', 0, -1, 2**53, "id"]
keys = st.sampled_from(["id", "ID", "i\"d", "\\id", "idx", "x", "text", "\u0069d ", "é"])
scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**63 - 1),
                    st.floats(allow_nan=False, allow_infinity=False),
                    st.text(max_size=8), st.sampled_from(['"id"', '"id":7', "}", "\\u0069"]))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(keys, inner, max_size=3)), max_leaves=8)
new_ids = st.one_of(st.sampled_from(HOSTILE_IDS), st.integers(-2**63, 2**63 - 1), st.text())


def dump(value: Any, ws: st.DataObject, ascii_: bool) -> str:
    """`value` as JSON with whitespace drawn around every token."""
    space = lambda: ws.draw(st.sampled_from(["", " ", "\t", "  "]))  # noqa: E731
    if isinstance(value, dict):
        members = [f"{space()}{json.dumps(k, ensure_ascii=ascii_)}{space()}:{space()}"
                   f"{dump(v, ws, ascii_)}{space()}" for k, v in value.items()]
        return "{" + ",".join(members) + space() + "}"
    if isinstance(value, list):
        return "[" + ",".join(space() + dump(v, ws, ascii_) + space() for v in value) + "]"
    return json.dumps(value, ensure_ascii=ascii_)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.integers(1, 2**40), new_ids, values,
       st.dictionaries(keys.filter(lambda k: k != "id"), values, max_size=3),
       st.integers(0, 5), st.booleans())
def test_a_splice_reads_as_the_message_with_the_new_id(
        ws: st.DataObject, old: int, new: RequestId, result: Any,
        extra: dict[str, Any], place: int, ascii_: bool) -> None:
    members = [("jsonrpc", "2.0"), ("result", {"content": result}), *extra.items()]
    members.insert(min(place, len(members)), ("id", old))
    data = dump(dict(members), ws, ascii_).encode()
    out = replace_id(data, old, new)
    if out is None:
        return  # not certain: the caller dumps the parsed message instead
    expected = {**orjson.loads(data), "id": new}
    assert json.loads(out) == expected  # the stdlib keeps the last of duplicate keys
    assert orjson.loads(out) == expected
    assert b"\n" not in out and b"\r" not in out  # one SSE data line


@given(new_ids)
def test_the_sdks_shapes_are_spliced(new: RequestId) -> None:
    """The Python SDK writes jsonrpc, id, result; the TypeScript SDK result, jsonrpc, id."""
    result = {"content": [{"type": "text", "text": "x" * 1000}], "isError": False}
    for msg in ({"jsonrpc": "2.0", "id": 17, "result": result},
                {"result": result, "jsonrpc": "2.0", "id": 17}):
        for data in (orjson.dumps(msg), json.dumps(msg).encode(),
                     json.dumps(msg, indent=None, separators=(", ", ": ")).encode()):
            out = replace_id(data, 17, new)
            assert out is not None and orjson.loads(out) == {**msg, "id": new}
            assert replace_id(memoryview(data), 17, new) == out


def test_uncertain_places_are_left_to_the_parser() -> None:
    for data in (
        b'{"jsonrpc":"2.0","id":17,"result":{},"id":17}',  # a duplicate: the last one wins
        b'{"jsonrpc":"2.0","result":{"id":3},"id":17}',  # "id" nested too
        b'{"jsonrpc":"2.0","\\u0069d":17,"result":{}}',  # an escaped key reads "id"
        b'{"jsonrpc":"2.0","id":17.0,"result":{}}',  # not written plainly
        b'{"jsonrpc":"2.0","id":1.7e1,"result":{}}',
        b'{"jsonrpc":"2.0","id":18,"result":{}}',  # not the id routed on
        b'{"jsonrpc":"2.0",\r\n"id":17,"result":{}}',  # a line break: not one SSE line
        b'{"result":{"a":[1,{"b":2}]},"id":17 ,"x":1}',  # in the middle, after nesting
    ):
        assert replace_id(data, 17, "c") is None, data


def test_an_id_written_inside_a_string_before_the_real_one_stays() -> None:
    data = b'{"jsonrpc":"2.0","result":{"text":"\\"id\\":17"},"id":17}'
    assert orjson.loads(replace_id(data, 17, "c") or b"") == {
        "jsonrpc": "2.0", "result": {"text": '"id":17'}, "id": "c"}


def test_a_key_ending_in_id_is_not_the_id() -> None:
    data = b'{"result":{},"jsonrpc":"2.0","x\\"id":17}'
    assert orjson.loads(data).get("id") is None
    assert replace_id(data, 17, "c") is None


class BytesSink(MockSink):
    """A sink that writes bytes, as a legacy session's exchange does."""

    def __init__(self) -> None:
        super().__init__()
        self.spliced: list[bytes] = []

    def on_spliced(self, msg: dict[str, Any], data: bytes) -> None:
        self.spliced.append(data)
        self.on_response(msg)


async def test_an_answer_reaches_its_call_as_the_servers_bytes_under_the_callers_id() -> None:
    conn, _ = await connect()
    alice, bob = BytesSink(), BytesSink()
    a = conn.request(call("slow", 'a"\u00e9'), Owner("a"), alice)
    b = conn.request(call("slow", 7), Owner("b"), bob)
    pipes = _Pipes("mock", conn.on_message, lambda: None, 1 << 20)
    big = "y" * 300_000
    lines = (b'{"result":{"content":[{"type":"text","text":"%s"}]},"jsonrpc":"2.0","id":%d}\n'
             % (big.encode(), b.upstream_id) +
             b'{"jsonrpc":"2.0","id":%d,"result":{"modes":["id"]}}\n' % a.upstream_id)
    for start in range(0, len(lines), 65536):  # as a pipe delivers it: in chunks
        pipes.pipe_data_received(1, lines[start:start + 65536])
    assert orjson.loads(bob.spliced[0]) == {
        "result": {"content": [{"type": "text", "text": big}]}, "jsonrpc": "2.0", "id": 7}
    assert bob.responses[0]["id"] == 7
    assert alice.spliced == []  # "id" inside its result: parsed and dumped instead
    assert alice.responses[0] == {"jsonrpc": "2.0", "id": 'a"\u00e9',
                                  "result": {"modes": ["id"]}}
    assert not pipes.out
