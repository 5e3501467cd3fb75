"""Keys derived from the replicas' shared secret (`replica.secret`): one key per use, each
derived with HKDF-SHA256 under its own label, so that no key ever serves two purposes and
none of them is the secret itself.

    channel        seals (encrypts and authenticates) the replicas' channel messages
    record-seal    the HMAC over each task record held in a shared store
    result-enc     encrypts a record's result and the rest of its fields at rest (AES-GCM)
    owner-digest   the keyed digest that stands for an owner in a shared store
    request-state  encrypts MRTR requestState (AES-GCM)
    session-record encrypts and authenticates legacy sessions' records (AES-GCM)
    relay          seals the principal a replica vouches for on a relayed request (AES-GCM)
    snapshot       encrypts and seals a memory store's snapshot file

AES-GCM here always takes a random 96-bit nonce per message, sent in front of the
ciphertext (`nonce || ciphertext || tag`): at well under 2**32 messages per key the chance
of a repeated nonce stays negligible (NIST SP 800-38D, 8.3).

`cryptography` is imported on first use: it costs a process ~7 MiB resident, which a
one-process gateway that never parks an MRTR call need not carry.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from typing import Any

NONCE_BYTES = 12
LABELS = frozenset({"channel", "record-seal", "result-enc", "owner-digest", "request-state",
                    "session-record", "relay", "snapshot", "webhooks"})


def derive(secret: bytes, label: str) -> bytes:
    """The 256-bit key of `label` (one of LABELS) under `secret`."""
    if label not in LABELS:
        raise ValueError(f"unknown key label {label!r}")
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
                info=b"mcp-task-gateway " + label.encode()).derive(secret)


class Cipher:
    """AES-256-GCM with a random nonce per message; `aad` binds a ciphertext to where it
    belongs (a task's id and owner, say), so it cannot be moved elsewhere."""

    def __init__(self, key: bytes) -> None:
        if len(key) != 32:
            raise ValueError("an AES-256 key is 32 bytes")
        self._key = key
        self._made: Any = None

    @property
    def _aead(self) -> Any:
        if self._made is None:
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM
            self._made = AESGCM(self._key)
        return self._made

    def encrypt(self, plain: bytes, aad: bytes = b"") -> bytes:
        nonce = os.urandom(NONCE_BYTES)
        return nonce + bytes(self._aead.encrypt(nonce, plain, aad))

    def decrypt(self, data: bytes, aad: bytes = b"") -> bytes | None:
        """The plaintext of a genuine ciphertext; None for anything else."""
        from cryptography.exceptions import InvalidTag

        if len(data) < NONCE_BYTES + 16:
            return None
        try:
            return bytes(self._aead.decrypt(data[:NONCE_BYTES], data[NONCE_BYTES:], aad))
        except InvalidTag:
            return None


def keyed_digest(key: bytes, text: str) -> str:
    """A 128-bit HMAC-SHA256 digest of `text`, as hex: without the key, no one can tell
    which text it stands for by trying candidates."""
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()[:32]


def fields(*parts: bytes) -> bytes:
    """An unambiguous encoding of `parts` (each length-prefixed), to authenticate them as
    one."""
    return b"".join(len(p).to_bytes(8, "big") + p for p in parts)


__all__ = ["LABELS", "Cipher", "derive", "fields", "keyed_digest"]
