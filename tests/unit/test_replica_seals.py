"""auth/replicas.py: the principal one replica vouches for on a relayed request opens only
for the same request, under the same secret, while fresh, once; it never holds the token."""

from __future__ import annotations

import time

from gateway.auth.principal import Principal
from gateway.auth.replicas import MAX_OPENED, RELAY_TTL_S, ReplicaSeals, binding, digest
from gateway.keyring import derive

KEY = derive(b"a secret every replica shares", "relay")
ALICE = Principal("owner-a", frozenset({"read"}), "https://idp", "subj", None, token="tok")
HERE = binding("/mcp", {"Mcp-Method": "tools/call", "Mcp-Name": "ask",
                        "MCP-Protocol-Version": "2026-07-28"})
BODY = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"requestState":"s"}}'


def test_a_seal_opens_for_its_request_under_the_shared_secret_only() -> None:
    seal = ReplicaSeals(KEY, "r0").seal(ALICE, "r0", HERE, BODY)
    opened = ReplicaSeals(KEY, "r0").open(seal, HERE)
    assert opened is not None and opened.principal.owner == "owner-a"
    assert opened.principal.scopes == {"read"} and opened.body == digest(BODY)
    assert opened.principal.token is None and "tok" not in seal
    assert ReplicaSeals(KEY, "r0").open(seal, binding("/mcp", {
        "Mcp-Method": "tools/call", "Mcp-Name": "echo",
        "MCP-Protocol-Version": "2026-07-28"})) is None
    assert ReplicaSeals(KEY, "r0").open(seal, binding("/mcp", {
        "Mcp-Method": "tools/call", "Mcp-Name": "ask",
        "MCP-Protocol-Version": "2025-11-25"})) is None  # another era
    assert ReplicaSeals(KEY, "r1").open(seal, HERE) is None  # for another replica
    assert ReplicaSeals(None).open(seal, HERE) is None  # another secret
    assert ReplicaSeals(KEY, "r0").open("not a seal!", HERE) is None


def test_a_seal_opens_once() -> None:
    """A relay seen on the wire cannot be sent again, even whole, within its 30 s."""
    seals = ReplicaSeals(KEY, "r0")
    seal = seals.seal(ALICE, "r0", HERE, BODY)
    assert seals.open(seal, HERE) is not None
    assert seals.open(seal, HERE) is None
    assert seals.open(seals.seal(ALICE, "r0", HERE, BODY), HERE) is not None  # a new relay opens


def test_a_seal_lasts_no_longer_than_the_relay_nor_the_principal(monkeypatch) -> None:
    seals = ReplicaSeals(KEY, "r0")
    seal = seals.seal(ALICE, "r0", HERE, BODY)
    now = time.time()
    monkeypatch.setattr(time, "time", lambda: now + RELAY_TTL_S + 1)
    assert seals.open(seal, HERE) is None
    monkeypatch.undo()
    expiring = Principal("owner-a", None, expires_at=time.time() - 1)
    assert seals.open(seals.seal(expiring, "r0", HERE, BODY), HERE) is None


def test_a_full_memory_of_opened_seals_refuses_rather_than_forgets() -> None:
    """A replica that forgot a seal it opened would open it again: at MAX_OPENED it opens
    no new one until its remembered ones lapse."""
    seals = ReplicaSeals(KEY, "r0")
    for n in range(MAX_OPENED):
        seals.opened[str(n)] = True
    assert seals.open(seals.seal(ALICE, "r0", HERE, BODY), HERE) is None
