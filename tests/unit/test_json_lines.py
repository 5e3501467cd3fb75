"""An upstream's chunked application/json answer read line by line (upstream/http_post.py):
a message a line is delivered as each line ends; a document pretty-printed over many lines
is parsed when it can be whole, not at each of its lines (that was quadratic: 28 s of a
blocked event loop for 800 KB sent a line a chunk)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gateway.protocol import jsonrpc
from gateway.upstream import http_post


class Chunked:
    """What _json_lines reads of an aiohttp response: its content, chunk by chunk."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.content = self
        self.chunks = chunks

    async def iter_any(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk


async def read(chunks: list[bytes], monkeypatch: pytest.MonkeyPatch) -> tuple[list[Any], int]:
    parses = 0
    real = jsonrpc.loads

    def counted(data: Any) -> Any:
        nonlocal parses
        parses += 1
        return real(data)

    monkeypatch.setattr(jsonrpc, "loads", counted)
    got: list[Any] = []
    ok = await http_post._json_lines(Chunked(chunks), lambda m: got.append(real(m)) is None,  # type: ignore[arg-type]
                                     1 << 20)
    assert ok
    return got, parses


async def test_a_pretty_printed_answer_is_parsed_once_not_at_every_line(monkeypatch) -> None:
    answer = {"jsonrpc": "2.0", "id": 1, "result": {"items": list(range(2000))}}
    lines = [line + b"\n" for line in json.dumps(answer, indent=2).encode().split(b"\n")]
    assert len(lines) > 2000
    got, parses = await read(lines, monkeypatch)
    assert got == [answer]
    assert parses <= 4  # its first line ("{"), its last ("}"), and the delivery


async def test_a_message_a_line_is_delivered_as_each_line_ends(monkeypatch) -> None:
    messages = [{"jsonrpc": "2.0", "method": "notifications/message", "params": {"n": n}}
                for n in range(3)] + [{"jsonrpc": "2.0", "id": 1, "result": {}}]
    got, _ = await read([json.dumps(m).encode() + b"\n" for m in messages], monkeypatch)
    assert got == messages
