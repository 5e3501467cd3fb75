"""Multi round-trip requests (spec 2026-07-28, MRTR) bridged onto legacy upstreams.

A legacy server asks the client with a JSON-RPC request (elicitation/create, ...) in the
middle of a call. A modern client cannot receive that: instead the gateway *parks* the
upstream call, answers the client with `resultType: "input_required"`, the server's requests
in `inputRequests`, and a sealed `requestState`; the client's retry carries the answers,
which go upstream under the original ids, and the parked call resumes.

`requestState` is the payload encrypted with AES-256-GCM (a random nonce, then the
ciphertext and its tag, base64url): the client learns nothing from it (not the replica
holding the call, nor where that replica is reached), and no one without the key makes one
that opens. The payload binds the parked call, its round, the caller's auth context, the
method and a digest of the params, and an expiry (spec MRTR, Server Requirements: "MUST
protect its integrity", "SHOULD include the authenticated principal, a short expiry, an
identifier for the originating request"). Single use is enforced here, server-side: each
round of a parked call accepts exactly one state, so a replayed one is refused.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import itertools
import secrets
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import orjson

from gateway import errors
from gateway.keyring import Cipher
from gateway.protocol import jsonrpc, mcp
from gateway.protocol.jsonrpc import Message, RequestId
from gateway.upstream.correlator import Call, Host

STATE_FIELDS = ("inputResponses", "requestState")
AAD = b"mcp-task-gateway requestState"
MIN_STATE_BYTES = 12 + 16 + 2  # a nonce, a tag, and the smallest JSON object


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Sealer:
    """Seals and opens `requestState` with one AES-256-GCM key (derived from the replicas'
    secret, or random per start)."""

    def __init__(self, key: bytes | None, ttl_s: float) -> None:
        self.cipher = Cipher(key or secrets.token_bytes(32))
        self.ttl_s = ttl_s

    def seal(self, **payload: Any) -> str:
        body = orjson.dumps({**payload, "exp": int(time.time() + self.ttl_s)})
        return _b64(self.cipher.encrypt(body, AAD))

    def open(self, token: Any, owner: str) -> dict[str, Any]:
        """The payload of a genuine, unexpired state issued to `owner`; InvalidParams for
        anything else. Garbled, tampered and another principal's states get one answer, the
        owner checked before the expiry: Bob learns nothing of Alice's (not even whether it
        has expired)."""
        try:
            sealed = _unb64(token) if isinstance(token, str) else None
        except (binascii.Error, ValueError):
            sealed = None
        body = None if sealed is None or len(sealed) < MIN_STATE_BYTES else \
            self.cipher.decrypt(sealed, AAD)
        payload: dict[str, Any] = {} if body is None else orjson.loads(body)  # ours: it parses
        if payload.get("o") != owner:
            raise errors.InvalidParams(NOT_ISSUED)
        if payload.get("exp", 0) < time.time():
            raise errors.InvalidParams("Invalid requestState: it has expired; send the "
                                       "request again without it")
        return payload


NOT_ISSUED = "Invalid requestState: not a state this gateway issued"


def digest(method: str, params: dict[str, Any]) -> str:
    """What identifies "the same request" across retries: method and params minus the
    envelope and the MRTR fields (spec MRTR: the retry repeats the original request)."""
    salient = {k: v for k, v in params.items() if k not in STATE_FIELDS and k != "_meta"}
    raw = orjson.dumps([method, salient], option=orjson.OPT_SORT_KEYS)
    return _b64(hashlib.sha256(raw).digest()[:16])


@dataclass(eq=False)
class Parked:
    """An upstream call waiting for its client's answers between two HTTP requests.

    While parked it is the call's `Sink`: more server requests queue up as inputs, and a
    response that arrives meanwhile (the server gave up waiting) is kept for the retry.
    """

    id: str
    call: Call
    owner: str  # hash of the caller's auth context
    method: str
    digest: str
    round: int = 0
    inputs: dict[str, tuple[RequestId, dict[str, Any]]] = field(default_factory=dict)
    response: Message | None = None
    timer: asyncio.TimerHandle | None = None
    done: Callable[[], None] | None = None  # releases the call's process when it is over
    policy: Any = None  # the task policy of the call, carried across rounds
    own_progress: bool = False  # the gateway, not the client, asked for progress
    _keys: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    used: set[str] = field(default_factory=set)
    takes_mrtr: ClassVar[bool] = False

    @property
    def conn(self) -> Host:
        return self.call.conn

    def add_input(self, msg: Message) -> None:
        # keys are unique for the life of the call, across its rounds (spec MRTR)
        key = mcp.input_key(msg, next(self._keys), self.used)
        self.inputs[key] = (msg["id"], {"method": msg["method"],
                                        "params": msg.get("params", {})})

    def requests(self) -> dict[str, dict[str, Any]]:
        return {key: request for key, (_, request) in self.inputs.items()}

    def answer(self, responses: dict[str, Any]) -> None:
        """Send the answers the client gave upstream, under the server's own ids; inputs
        not answered stay pending, keys the gateway never asked are ignored (spec MRTR,
        Error Handling: ignore what is not recognized)."""
        for key in [k for k in self.inputs if k in responses]:
            asked_id, _ = self.inputs.pop(key)
            self.conn.reply(asked_id, jsonrpc.result(asked_id, responses[key]),
                            self.call.owner)

    # -- Sink while parked -----------------------------------------------------------------
    def on_message(self, msg: Message) -> None:
        if "id" in msg and "method" in msg:
            self.add_input(msg)

    def on_response(self, msg: Message) -> None:
        self.response = msg

    def on_refused(self, capability: str) -> None:
        pass  # the retry's exchange hears of the call's end


class ParkedCalls:
    """Parked calls by id: bounded in number (in all, and per principal) and in time; a
    dropped one is cancelled upstream.

    At a bound only the newcomer's own principal gives way (issue 29): its oldest parked
    call is dropped, or, holding none while others fill the gateway's bound, it is refused.
    """

    def __init__(self, max_parked: int, timeout_s: float, per_principal: int | None = None
                 ) -> None:
        self.max_parked = max_parked
        self.per_principal = per_principal or max_parked
        self.timeout_s = timeout_s
        self._by_id: OrderedDict[str, Parked] = OrderedDict()
        self._held: Counter[str] = Counter()  # parked calls per principal

    def __len__(self) -> int:
        return len(self._by_id)

    def park(self, parked: Parked) -> None:
        """Park `parked`; TooManyRequests when its principal has nothing to give way."""
        owner = parked.owner
        while self._held[owner] >= self.per_principal or len(self._by_id) >= self.max_parked:
            oldest = next((p for p in self._by_id.values() if p.owner == owner), None)
            if oldest is None:
                raise errors.TooManyRequests(
                    "Too many calls waiting for input: the gateway holds its maximum; answer "
                    "or abandon one, or retry later", {"maxParked": self.max_parked})
            self.drop(oldest.id, "too many calls of this client waiting for input")
        self._by_id[parked.id] = parked
        self._held[owner] += 1
        parked.conn.park(parked.call, parked)
        parked.timer = asyncio.get_running_loop().call_later(
            self.timeout_s, self.drop, parked.id, "the client never answered")

    def get(self, parked_id: Any) -> Parked | None:
        return self._by_id.get(parked_id) if isinstance(parked_id, str) else None

    def take(self, parked_id: str) -> Parked | None:
        """Remove and return a parked call for resuming."""
        parked = self._by_id.pop(parked_id, None)
        if parked is not None:
            self._held[parked.owner] -= 1
            if self._held[parked.owner] <= 0:
                del self._held[parked.owner]
            parked.conn.unpark(parked.call)
            if parked.timer is not None:
                parked.timer.cancel()
        return parked

    def drop(self, parked_id: str, why: str) -> None:
        parked = self.take(parked_id)
        if parked is not None:
            parked.conn.cancel(parked.call, why)
            if parked.done is not None:
                parked.done()

    def close(self) -> None:
        for parked_id in list(self._by_id):
            self.drop(parked_id, "the gateway is shutting down")
