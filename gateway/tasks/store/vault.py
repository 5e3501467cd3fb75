"""What protects task records in a shared store from whoever can read or write the store
(its operator, anyone with its password) but does not hold `replica.secret`.

A record is stored as its fields (`rec`, the record's JSON without its result) and its
result (`res`, the result's raw JSON), each encrypted (AES-256-GCM, a random nonce per
write, the task's id and owner as associated data), and a seal: HMAC-SHA256 over the id,
the owner and both ciphertexts as stored. A read checks the seal, then decrypts; a record
that fails either (rewritten, moved to another id or owner, its result swapped or dropped)
is refused: the store answers as if it did not hold it, and says so in an audit event
(`task.record_refused`, the task id and why, never the data).

What a seal cannot tell: a record put back as it was earlier in the same task's life (a
genuine, older sealed state), or one deleted.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

import orjson

from gateway.keyring import Cipher, derive, fields
from gateway.observability import log
from gateway.tasks.model import Task


class Refused(Exception):
    """A record that fails its seal or does not decrypt; the message says which."""


class Vault:
    def __init__(self, secret: bytes) -> None:
        self._seal_key = derive(secret, "record-seal")
        self._cipher = Cipher(derive(secret, "result-enc"))

    def close(self, task_id: str, owner: str, rec: bytes, res: bytes
              ) -> tuple[bytes, bytes, bytes]:
        """(rec, res, seal) as stored: both encrypted (no result stays b""), sealed
        together."""
        aad = fields(task_id.encode(), owner.encode())
        rec = self._cipher.encrypt(rec, b"rec" + aad)
        res = self._cipher.encrypt(res, b"res" + aad) if res else b""
        return rec, res, self._seal(task_id, owner, rec, res)

    def open(self, task_id: str, owner: bytes | None, rec: bytes, res: bytes | None,
             seal: bytes | None) -> tuple[bytes, bytes]:
        """The plaintext (rec, res) of a genuine record held under `task_id`; Refused
        otherwise."""
        if owner is None or seal is None:
            raise Refused("unsealed")
        who, res = owner.decode(errors="replace"), res or b""
        if not hmac.compare_digest(seal, self._seal(task_id, who, rec, res)):
            raise Refused("seal")
        aad = fields(task_id.encode(), who.encode())
        plain = self._cipher.decrypt(rec, b"rec" + aad)
        result = self._cipher.decrypt(res, b"res" + aad) if res else b""
        if plain is None or result is None:
            raise Refused("decryption")
        return plain, result

    def _seal(self, task_id: str, owner: str, rec: bytes, res: bytes) -> bytes:
        data = fields(task_id.encode(), owner.encode(), rec, res)
        return hmac.new(self._seal_key, data, hashlib.sha256).digest()


def refused(task_id: str, why: str) -> None:
    """The audit event of a record the store will not hand out."""
    log.warning("task.record_refused", audit=True, task=task_id[:64], why=why)


def _decode(rec: bytes | str, res: bytes | str | None) -> Task:
    return Task(**{**orjson.loads(rec), "result": res or None})


class Stored:
    """A record as the store holds it: sealed and encrypted with a vault, else as it is
    (a store given no secret: tests, and the bench's measure of what sealing costs)."""

    def __init__(self, vault: Vault | None) -> None:
        self.vault = vault

    def close(self, task: Task, rec: bytes, res: bytes) -> tuple[bytes, bytes, bytes]:
        """(rec, res, seal) to write."""
        if self.vault is None:
            return rec, res, b""
        return self.vault.close(task.id, task.owner, rec, res)

    def open(self, task_id: str, held: list[Any]) -> Task | None:
        """The task of a hash's (rec, res, owner, seal); None where it holds none, or one
        that fails its seal (an audit event says so)."""
        rec, res, owner, seal = held
        if rec is None:
            return None
        if self.vault is None:
            return _decode(rec, res)
        try:
            rec, res = self.vault.open(task_id, owner, rec, res, seal)
            task = _decode(rec, res)
        except Refused as exc:
            refused(task_id, str(exc))
            return None
        except (ValueError, TypeError):  # sealed, yet not a record: never written by us
            refused(task_id, "unreadable")
            return None
        if task.id != task_id or task.owner != owner.decode():
            refused(task_id, "misplaced")
            return None
        return task


__all__ = ["Refused", "Stored", "Vault", "refused"]
