"""auth/replicas.py: the principal one replica vouches for on a relayed request opens only
for the same request, under the same secret, while fresh; it never holds the token."""

from __future__ import annotations

import time

from gateway.auth.principal import Principal
from gateway.auth.replicas import RELAY_TTL_S, ReplicaSeals, binding
from gateway.keyring import derive

KEY = derive(b"a secret every replica shares", "relay")
ALICE = Principal("owner-a", frozenset({"read"}), "https://idp", "subj", None, token="tok")
HERE = binding("/mcp", "tools/call", "ask")


def test_a_seal_opens_for_its_request_under_the_shared_secret_only() -> None:
    seal = ReplicaSeals(KEY).seal(ALICE, HERE)
    opened = ReplicaSeals(KEY).open(seal, HERE)
    assert opened is not None and opened.owner == "owner-a" and opened.scopes == {"read"}
    assert opened.token is None and "tok" not in seal
    assert ReplicaSeals(KEY).open(seal, binding("/mcp", "tools/call", "echo")) is None
    assert ReplicaSeals(None).open(seal, HERE) is None  # another secret
    assert ReplicaSeals(KEY).open("not a seal!", HERE) is None


def test_a_seal_lasts_no_longer_than_the_relay_nor_the_principal(monkeypatch) -> None:
    seals = ReplicaSeals(KEY)
    seal = seals.seal(ALICE, HERE)
    now = time.time()
    monkeypatch.setattr(time, "time", lambda: now + RELAY_TTL_S + 1)
    assert seals.open(seal, HERE) is None
    monkeypatch.undo()
    expiring = Principal("owner-a", None, expires_at=time.time() - 1)
    assert seals.open(seals.seal(expiring, HERE), HERE) is None
