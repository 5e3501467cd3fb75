"""A JSON-RPC message's id replaced in its bytes: a pass-through answer is not dumped again.

The caller has parsed the message already (it routes by it), so `data` is valid JSON, an
object, whose top-level id is `old`. What is left to be certain of is where that id is in
the bytes: `replace_id` says None whenever a bounded scan cannot prove it, and the caller
then dumps the parsed message as before. Certain means (docs/architecture.md, Tenancy: ids
are rewritten exactly):

- `"id"` occurs once in the bytes and no `\\u` escape does: no other key, at any depth and
  however escaped, reads "id" (a duplicate top-level id would win in the client's parser);
- that occurrence is a top-level key: reached from the opening brace over members whose
  values are scalars (the Python SDK writes `jsonrpc` then `id` first), or it is the last
  member, its number followed by nothing but the closing brace (the TypeScript SDK writes
  `id` last);
- its value is the number `old` written plainly (not `17.0`, not `1.7e1`);
- the message holds no line break: it may go out as one SSE `data:` line.
"""

from __future__ import annotations

from typing import Final

import orjson

from gateway.protocol.jsonrpc import RequestId

_WS: Final = frozenset(b" \t\n\r")  # RFC 8259 section 2: insignificant whitespace
_SCALAR: Final = frozenset(b"-+.0123456789eEtrufalsn")  # numbers, true, false, null
_END_OF_NUMBER: Final = frozenset(b" \t\n\r,}")
LEAD_MEMBERS: Final = 8  # members scanned before the id from the front, at most


def replace_id(data: bytes | memoryview, old: int, new: RequestId) -> bytes | None:
    """`data` with its top-level id `old` replaced by `new`, or None when not certain."""
    raw = data if isinstance(data, bytes) else bytes(data)
    if raw.count(b'"id"') != 1 or b"\\u" in raw or b"\n" in raw or b"\r" in raw:
        return None
    key = raw.find(b'"id"')
    start = _after(raw, key + 4, ord(":"))
    if start < 0:
        return None
    end = start
    while end < len(raw) and raw[end] in b"-0123456789":
        end += 1
    if end == len(raw) or raw[end] not in _END_OF_NUMBER or \
            raw[start:end] != str(old).encode():
        return None
    if not (_leads(raw, key) or _last(raw, key, end)):
        return None
    view = memoryview(raw)
    return b"".join((view[:start], orjson.dumps(new), view[end:]))


def _ws(raw: bytes, i: int) -> int:
    while i < len(raw) and raw[i] in _WS:
        i += 1
    return i


def _after(raw: bytes, i: int, char: int) -> int:
    """The position past `char` and the whitespace around it, from `i`; -1 if not there."""
    if i < 0:
        return -1
    i = _ws(raw, i)
    return _ws(raw, i + 1) if i < len(raw) and raw[i] == char else -1


def _leads(raw: bytes, key: int) -> bool:
    """Whether `key` is a top-level key reached from the opening brace over members whose
    keys have no escapes and whose values are scalars (no nesting to follow)."""
    i = _after(raw, 0, ord("{"))
    for _ in range(LEAD_MEMBERS):
        if i == key:
            return True
        if i < 0 or i > key or raw[i] != ord('"'):
            return False
        i = _after(raw, _string_end(raw, i), ord(":"))
        if i < 0:
            return False
        i = _after(raw, _scalar_end(raw, i), ord(","))
    return False


def _string_end(raw: bytes, i: int) -> int:
    """Past the string opening at `i`, when it has no escapes; else -1 (uncertain)."""
    close = raw.find(b'"', i + 1)
    return -1 if close < 0 or raw.find(b"\\", i + 1, close) >= 0 else close + 1


def _scalar_end(raw: bytes, i: int) -> int:
    """Past the scalar value at `i` (a string without escapes, a number, true, false,
    null); -1 for anything else (an object or array: not followed here)."""
    if i < 0 or i >= len(raw):
        return -1
    if raw[i] == ord('"'):
        return _string_end(raw, i)
    end = i
    while end < len(raw) and raw[end] in _SCALAR:
        end += 1
    return end if end > i else -1


def _last(raw: bytes, key: int, end: int) -> bool:
    """Whether the id is the object's last member: its number is followed only by the
    closing brace. A number there is a token, so the `:` before it is structural and the
    string before that is a key; its opening quote is at `key` unless escaped."""
    close = _ws(raw, end)
    return close < len(raw) and raw[close] == ord("}") and _ws(raw, close + 1) == len(raw) \
        and key > 0 and raw[key - 1] != ord("\\")
