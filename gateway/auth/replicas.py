"""How a replica vouches for a client's request it hands to another (downstream/handoff.py):
with the replicas' shared secret, never with the client's credential (issue 41, item 7).

Before, a relayed MRTR retry carried the client's `Authorization` header to whatever
address the holder's lease key in the store named: anyone who could write to the store
collected tokens. Now the relaying replica sends a seal instead, in `Mcp-Gateway-Relayed`:
the principal it authenticated (owner, scopes, issuer and subject digests; never the token)
encrypted and authenticated with a key derived from `replica.secret` (keyring "relay"),
bound to the request's path, method and name headers and valid for RELAY_TTL_S. The
receiving replica takes the principal from a seal that opens, and refuses (401) one that
does not: a client cannot make one, and one seen on the wire vouches for nothing else.
"""

from __future__ import annotations

import base64
import binascii
import secrets
import time
from typing import Any

import orjson

from gateway.auth.principal import Principal
from gateway.keyring import Cipher

RELAY_TTL_S = 30.0  # a relay is sent at once: a seal older than this vouches for nothing
AAD = b"mcp-task-gateway relay "


class ReplicaSeals:
    """Seals a principal for a relayed request, and opens such seals."""

    def __init__(self, key: bytes | None) -> None:
        # Without a shared secret there is no other replica: a random key opens nothing
        # another process sealed.
        self.cipher = Cipher(key or secrets.token_bytes(32))

    def seal(self, principal: Principal, binding: str) -> str:
        """The seal of `principal` for the request `binding` names (see `binding`)."""
        expires = time.time() + RELAY_TTL_S
        if principal.expires_at is not None:
            expires = min(expires, principal.expires_at)
        scopes = None if principal.scopes is None else sorted(principal.scopes)
        body = orjson.dumps({"o": principal.owner, "s": scopes, "i": principal.issuer,
                             "u": principal.subject, "x": expires})
        sealed = self.cipher.encrypt(body, AAD + binding.encode())
        return base64.urlsafe_b64encode(sealed).rstrip(b"=").decode()

    def open(self, token: str, binding: str) -> Principal | None:
        """The principal a genuine, unexpired seal for this request names; None else."""
        try:
            sealed = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        except (binascii.Error, ValueError):
            return None
        body = self.cipher.decrypt(sealed, AAD + binding.encode())
        if body is None:
            return None
        held: dict[str, Any] = orjson.loads(body)  # ours: it parses
        if held["x"] < time.time():
            return None
        scopes = None if held["s"] is None else frozenset(held["s"])
        return Principal(held["o"], scopes, held["i"], held["u"], held["x"])


def binding(path: str, method: str | None, name: str | None) -> str:
    """What a seal is bound to: the request's path and its Mcp-Method and Mcp-Name."""
    return orjson.dumps([path, method, name]).decode()


__all__ = ["RELAY_TTL_S", "ReplicaSeals", "binding"]
