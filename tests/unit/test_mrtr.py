"""requestState sealing: genuine states open, anything else is refused with a clear reason."""

from __future__ import annotations

import base64

import orjson
import pytest

from gateway.downstream.mrtr import Sealer, digest
from gateway.errors import InvalidParams


def test_a_sealed_state_opens_to_its_payload() -> None:
    sealer = Sealer(b"k" * 32, ttl_s=60)
    payload = sealer.open(sealer.seal(p="abc", r=2, o="owner"), "owner")
    assert (payload["p"], payload["r"], payload["o"]) == ("abc", 2, "owner")


@pytest.mark.parametrize("token", [
    None, "", 42, "é", "a.b.c", "e30.AAAA", "no-dot", "A" * 40])
def test_foreign_shapes_are_refused(token) -> None:
    with pytest.raises(InvalidParams, match="not a state this gateway issued"):
        Sealer(b"k" * 32, 60).open(token, "owner")


def test_another_key_a_flipped_bit_or_another_owner_get_what_a_forged_state_gets() -> None:
    """Tampered, sealed elsewhere or another principal's: one answer, the same as junk's,
    and for another principal's even once it expired (Bob learns nothing of Alice's)."""
    token = Sealer(b"k" * 32, 60).seal(p="x", o="alice")
    flipped = token[:20] + ("A" if token[20] != "A" else "B") + token[21:]
    expired = Sealer(b"k" * 32, -5).seal(p="x", o="alice")
    for sealer, state, who in ((Sealer(b"j" * 32, 60), token, "alice"),
                               (Sealer(b"k" * 32, 60), flipped, "alice"),
                               (Sealer(b"k" * 32, 60), token, "bob"),
                               (Sealer(b"k" * 32, 60), expired, "bob")):
        with pytest.raises(InvalidParams) as refused:
            sealer.open(state, who)
        assert refused.value.message == "Invalid requestState: not a state this gateway issued"


def test_a_state_tells_the_client_nothing() -> None:
    """Issue 30: requestState is encrypted, not only signed: a client decodes neither the
    replica's address nor the parked call's id from it."""
    sealer = Sealer(b"k" * 32, 60)
    token = sealer.seal(p="parked-call-id", u="http://10.0.0.5:8080", o="owner-digest")
    raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    for secret in (b"parked-call-id", b"10.0.0.5", b"owner-digest", b"exp"):
        assert secret not in raw
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(raw)
    assert sealer.seal(p="x") != sealer.seal(p="x")  # a fresh nonce each time


def test_expired_states_are_refused() -> None:
    sealer = Sealer(b"k" * 32, ttl_s=-5)
    with pytest.raises(InvalidParams, match="expired"):
        sealer.open(sealer.seal(p="x", o="owner"), "owner")


def test_digest_ignores_envelope_and_mrtr_fields_only() -> None:
    base = {"name": "t", "arguments": {"a": 1}}
    same = {**base, "_meta": {"x": 1}, "inputResponses": {}, "requestState": "s"}
    assert digest("tools/call", base) == digest("tools/call", same)
    assert digest("tools/call", base) != digest("tools/call", {**base, "arguments": {"a": 2}})
    assert digest("tools/call", base) != digest("prompts/get", base)
