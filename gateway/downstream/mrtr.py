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
from collections.abc import Callable, Collection
from dataclasses import replace
from typing import Any, ClassVar

import orjson

from gateway import errors
from gateway.downstream.envelope import ModernRequest
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

    def seal(self, **payload: object) -> str:
        body = orjson.dumps({**payload, "exp": int(time.time() + self.ttl_s)})
        return _b64(self.cipher.encrypt(body, AAD))

    def open(self, token: object, owner: str) -> dict[str, Any]:
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


def digest_of(method: str, asked: dict[str, Any] | str) -> str:
    """The digest of a request's params (`digest`), or the one taken already (a parked
    call's request keeps only that)."""
    return asked if isinstance(asked, str) else digest(method, asked)


class Parked:
    """An upstream call waiting for its client's answers between two HTTP requests.

    Built whole when its first round is asked, from the call, the request it answers
    (`request`, frozen: owner, method, digest, task policy) and `done`, which releases the
    call's process once it is over; its rounds, its inputs and a response that came
    meanwhile change only by its verbs. While parked it is the call's `Sink`: more server
    requests queue up as inputs, and a response that arrives meanwhile (the server gave up
    waiting) is kept for the retry.
    """

    __slots__ = ("_done", "_inputs", "_keys", "_response", "_round", "_used", "call", "id",
                 "request")
    takes_mrtr: ClassVar[bool] = False

    def __init__(self, call: Call, request: ModernRequest, done: Callable[[], None] | None
                 ) -> None:
        self.id = secrets.token_urlsafe(16)
        self.call = call
        # Kept with its params' digest, not the params: a parked call must not hold a MiB
        # argument, uncounted, for its park's timeout (the upstream has it already).
        self.request = replace(request, asked=digest_of(request.method, request.asked))
        self._done = done
        self._round = 0
        self._inputs: dict[str, tuple[RequestId, dict[str, Any]]] = {}
        self._response: Message | None = None
        self._keys = itertools.count(1)
        self._used: set[str] = set()

    @property
    def conn(self) -> Host:
        return self.call.conn

    @property
    def owner(self) -> str:
        """Hash of the caller's auth context: the only one whose retry resumes it."""
        return self.request.caller.principal

    @property
    def round(self) -> int:
        return self._round

    @property
    def response(self) -> Message | None:
        """The call's response, if it came while parked."""
        return self._response

    @property
    def done(self) -> Callable[[], None] | None:
        """What releases the call's process (a retry's exchange takes it on)."""
        return self._done

    @property
    def asked(self) -> Collection[str]:
        """The keys of the input requests not answered yet."""
        return self._inputs.keys()

    def next_round(self) -> int:
        """One more round is asked: its number, which its requestState carries."""
        self._round += 1
        return self._round

    def add_input(self, msg: Message) -> None:
        # keys are unique for the life of the call, across its rounds (spec MRTR)
        key = mcp.input_key(msg, next(self._keys), self._used)
        self._inputs[key] = (msg["id"], {"method": msg["method"],
                                         "params": msg.get("params", {})})

    def requests(self) -> dict[str, dict[str, Any]]:
        return {key: request for key, (_, request) in self._inputs.items()}

    def answer(self, responses: dict[str, Any]) -> None:
        """Send the answers the client gave upstream, under the server's own ids; inputs
        not answered stay pending, keys the gateway never asked are ignored (spec MRTR,
        Error Handling: ignore what is not recognized)."""
        for key in [k for k in self._inputs if k in responses]:
            asked_id, _ = self._inputs.pop(key)
            self.conn.reply(asked_id, jsonrpc.result(asked_id, responses[key]),
                            self.call.owner)

    def abandon(self, why: str) -> None:
        """Nobody will resume it: the call is cancelled upstream and its process released
        (once)."""
        self.conn.cancel(self.call, why)
        done, self._done = self._done, None
        if done is not None:
            done()

    # -- Sink while parked -----------------------------------------------------------------
    def on_message(self, msg: Message) -> None:
        if "id" in msg and "method" in msg:
            self.add_input(msg)

    def on_response(self, msg: Message) -> None:
        self._response = msg

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
        self._timers: dict[str, asyncio.TimerHandle] = {}  # each one's park_timeout_ms

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
        parked.call.park(parked)
        self._timers[parked.id] = asyncio.get_running_loop().call_later(
            self.timeout_s, self.drop, parked.id, "the client never answered")

    def get(self, parked_id: str | None) -> Parked | None:
        return self._by_id.get(parked_id) if parked_id is not None else None

    def take(self, parked_id: str) -> Parked | None:
        """Remove and return a parked call for resuming."""
        parked = self._by_id.pop(parked_id, None)
        if parked is not None:
            self._held[parked.owner] -= 1
            if self._held[parked.owner] <= 0:
                del self._held[parked.owner]
            parked.call.unpark()
            timer = self._timers.pop(parked_id, None)
            if timer is not None:
                timer.cancel()
        return parked

    def drop(self, parked_id: str, why: str) -> None:
        parked = self.take(parked_id)
        if parked is not None:
            parked.abandon(why)

    def close(self) -> None:
        for parked_id in list(self._by_id):
            self.drop(parked_id, "the gateway is shutting down")
