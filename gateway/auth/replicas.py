"""How a replica vouches for a client's request it hands to another (downstream/handoff.py):
with the replicas' shared secret, never with the client's credential (issue 41, item 7).

Before, a relayed MRTR retry carried the client's `Authorization` header to whatever
address the holder's lease key in the store named: anyone who could write to the store
collected tokens. Now the relaying replica sends a seal instead, in `Mcp-Gateway-Relayed`:
the principal it authenticated (owner, scopes, issuer and subject digests; never the token)
encrypted and authenticated with a key derived from `replica.secret` (keyring "relay"),
bound to the replica it is for, the request's path, its headers that say what it is
(`binding`) and a digest
of its body (the requestState in it included), valid for RELAY_TTL_S and once: that replica
takes the principal from a seal that opens the first time, on a POST whose body has that
digest, and refuses (401) any other. A client cannot make one; one seen on the wire
vouches for nothing else, not even the same request sent again, to that replica or another.
A replica remembers the seals it opened for as long as they could open (their expiry, and
SKEW_S for clocks that differ); with MAX_OPENED remembered, it refuses new ones rather than
forget one (relays are rare: a client meets "send it again without requestState").
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import secrets
import time
from collections.abc import Mapping
from typing import Any, NamedTuple

import orjson
from cachetools import TTLCache

from gateway.auth.principal import Principal
from gateway.keyring import Cipher
from gateway.protocol import mcp

RELAY_TTL_S = 30.0  # a relay is sent at once: a seal older than this vouches for nothing
AAD = b"mcp-task-gateway relay "
BOUND = (mcp.H_METHOD, mcp.H_NAME, mcp.H_PROTOCOL)  # a relayed request's headers a seal binds
SKEW_S = 30.0  # how far replicas' clocks may differ
MAX_OPENED = 65_536  # seals remembered as used


class Vouched(NamedTuple):
    """What an opened seal says: who calls, and the digest of the body it was sealed for
    (`digest`); the body read is checked against it."""

    principal: Principal
    body: str


class ReplicaSeals:
    """Seals a principal for a relayed request, and opens such seals."""

    def __init__(self, key: bytes | None, me: str = "") -> None:
        """`me`: this replica's id, which a seal it opens must name."""
        # Without a shared secret there is no other replica: a random key opens nothing
        # another process sealed.
        self.cipher = Cipher(key or secrets.token_bytes(32))
        self.me = me
        self.opened: TTLCache[str, bool] = TTLCache(MAX_OPENED, RELAY_TTL_S + 2 * SKEW_S)

    def seal(self, principal: Principal, to: str, binding: str, body: bytes) -> str:
        """The seal of `principal` for replica `to` and the request `binding` names (see
        `binding`) whose body is `body`, usable once."""
        expires = time.time() + RELAY_TTL_S
        if principal.expires_at is not None:
            expires = min(expires, principal.expires_at)
        scopes = None if principal.scopes is None else sorted(principal.scopes)
        body = orjson.dumps({"o": principal.owner, "s": scopes, "i": principal.issuer,
                             "u": principal.subject, "x": expires, "b": digest(body),
                             "n": secrets.token_urlsafe(16)})
        sealed = self.cipher.encrypt(body, AAD + orjson.dumps([to, binding]))
        return base64.urlsafe_b64encode(sealed).rstrip(b"=").decode()

    def open(self, token: str, binding: str) -> Vouched | None:
        """What a genuine, unexpired seal for this request says, the first time it is
        opened; None else."""
        try:
            sealed = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        except (binascii.Error, ValueError):
            return None
        body = self.cipher.decrypt(sealed, AAD + orjson.dumps([self.me, binding]))
        if body is None:
            return None
        held: dict[str, Any] = orjson.loads(body)  # ours: it parses
        # Not expired, and not so far ahead that it could outlive its place in `opened`.
        fresh = time.time() <= held["x"] <= time.time() + RELAY_TTL_S + SKEW_S
        if not fresh or held["n"] in self.opened or len(self.opened) >= MAX_OPENED:
            return None
        self.opened[held["n"]] = True
        scopes = None if held["s"] is None else frozenset(held["s"])
        return Vouched(Principal(held["o"], scopes, held["i"], held["u"], held["x"]),
                       held["b"])


def binding(path: str, headers: Mapping[str, str]) -> str:
    """What a seal is bound to: the request's path and its headers that say what it is
    (Mcp-Method, Mcp-Name, MCP-Protocol-Version)."""
    return orjson.dumps([path, *(headers.get(h) for h in BOUND)]).decode()


def digest(body: bytes | bytearray) -> str:
    """What a seal holds of the body it vouches for."""
    return hashlib.sha256(body).hexdigest()


__all__ = ["RELAY_TTL_S", "ReplicaSeals", "Vouched", "binding", "digest"]
