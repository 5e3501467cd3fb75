"""Idempotency keys: a tools/call sent with the HTTP header `Idempotency-Key` (the IETF
httpapi draft's header, Stripe's shape; both eras ride HTTP) runs once for its owner.

A keyed call is always a task (docs/clients.md, Retries): its record is what the key
remembers, in whichever store holds tasks, for as long as the task is kept (its ttl, or
until its owner has read it and a newer task needed the room); then the key is forgotten.
So a key costs what a task costs and counts in the same bounds, and replicas sharing a
store share their keys.

`CallKey` is what the store is given: a `slot` (the key, scoped to its owner and hashed,
so Bob's key is never Alice's and the store holds no client string) and the `digest` of the
call it names (upstream, tool and arguments), which a retry must repeat.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.errors import BadIdempotencyKey
from gateway.tasks.model import Dialect

HEADER = "Idempotency-Key"
MAX_CHARS = 255  # as Stripe's keys; the draft sets no bound, a gateway must


@dataclass(frozen=True, slots=True)
class CallKey:
    key: str  # as the client sent it (errors name it)
    slot: str  # what the store binds: the owner's key, hashed
    digest: str  # the call it names

    @classmethod
    def of(cls, owner: str, key: str, upstream: str, dialect: Dialect, params: dict[str, Any]
           ) -> CallKey:
        """`owner`'s key `key` for the tools/call of `params` to `upstream`: the tool's
        name and arguments name the call (its `_meta`, progress token and task request do
        not: a retry may change them), and so does the dialect its task renders in (a
        retry in the other era names another call: it could not read that task)."""
        call = [upstream, dialect, params.get("name"), params.get("arguments")]
        return cls(key, _hash([owner, key]), _hash(call))


def parse(values: list[str]) -> str | None:
    """The key of a request's `Idempotency-Key` headers (None without one): an sf-string
    as the draft writes it (`"..."`), or bare as Stripe's clients send it; 1 to 255
    visible ASCII characters (spaces inside quotes). BadIdempotencyKey otherwise (400)."""
    if not values:
        return None
    if len(values) > 1:
        raise BadIdempotencyKey("Bad Idempotency-Key: send one")
    raw = values[0]
    quoted = len(raw) >= 2 and raw[0] == raw[-1] == '"'
    key = raw[1:-1].replace('\\"', '"').replace("\\\\", "\\") if quoted else raw
    lowest = " " if quoted else "!"
    if not 0 < len(key) <= MAX_CHARS or any(not lowest <= c <= "~" for c in key):
        raise BadIdempotencyKey(
            f"Bad Idempotency-Key: 1 to {MAX_CHARS} visible ASCII characters, bare or as "
            'a quoted string ("...")')
    return key


def _hash(value: list[Any]) -> str:
    return hashlib.sha256(orjson.dumps(value, option=orjson.OPT_SORT_KEYS)).hexdigest()[:32]


__all__ = ["HEADER", "MAX_CHARS", "CallKey", "parse"]
