"""MRTR rounds of modern clients' calls (spec 2026-07-28, MRTR): the state a round hands
the client, sealed and bound to its caller and request, and the checks a retry passes
before the call it resumes is touched. The parked calls themselves are mrtr.py's; the
exchanges that carry rounds to the client are modern.py's.

A retry's requestState is opened once, at the era's boundary, before its request is
decided (`Rounds.opened`; the MCP SDK's request-state boundary): what it was issued for is
checked there against the request, and what it says travels on as a frozen fact, in the
router's `Resume` for the gateway's own round, beside the request for a modern upstream's.
Apart from sealing (the key) and the parked calls `claim` and `ask` reach, the checks are
pure: tests/unit/test_rounds.py.

Two kinds of state go out: the gateway's own rounds (a legacy server asked for input: its
call is parked here, `k` absent) and a modern upstream's rounds (its own `requestState`,
sealed as `k: "up"`: the server sees one client, the gateway, so it cannot tell whose state
comes back; docs/architecture.md, "Tenancy"; spec MRTR: requestState is
attacker-controlled).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from gateway import errors
from gateway.downstream.mrtr import NOT_ISSUED, Parked, ParkedCalls, Sealer, digest, digest_of
from gateway.observability import log
from gateway.observability.counters import Counters
from gateway.protocol import jsonrpc, mcp
from gateway.protocol.jsonrpc import Message, RequestId
from gateway.router import OwnRound

# Methods the gateway always answers itself: no round has them, and a requestState they
# carry goes nowhere, so it is not opened. Anything else a modern route may forward, and
# the server must never be handed the gateway's seal.
NOT_ROUNDS = frozenset({mcp.DISCOVER, mcp.LISTEN})


class Answerable(Protocol):
    """The request a round answers (an exchange)."""

    def answer(self, msg: Message, status: int = 200) -> None: ...


@dataclass(frozen=True, slots=True)
class Elsewhere:
    """The retry's call is parked on another replica: hand the retry there (handoff.py)."""

    replica: str
    url: str | None


@dataclass(frozen=True, slots=True)
class TheirRound:
    """A retry of a modern upstream's own round: the server's own state, out of the
    gateway's seal, which goes to the server in place of the sealed one."""

    state: object


class Rounds:
    """One upstream's MRTR rounds for modern clients, parked on this replica."""

    def __init__(self, sealer: Sealer, parked: ParkedCalls, replica: str, replica_url: str,
                 upstream: str, counters: Counters) -> None:
        self.sealer = sealer
        self.parked = parked
        self.replica = replica
        self.replica_url = replica_url  # sealed into requestState: see handoff.py
        self.upstream = upstream
        self.counters = counters

    # -- a modern upstream's own rounds ----------------------------------------------------
    def seal_state(self, msg: Message, principal: str, method: str,
                   asked: dict[str, Any] | str) -> None:
        """A modern upstream's own input_required round goes to the client with its
        requestState sealed by the gateway, bound to the caller's principal and request."""
        result = msg.get("result")
        if isinstance(result, dict) and result.get("resultType") == "input_required" and \
                "requestState" in result:
            result["requestState"] = self.sealer.seal(
                s=result["requestState"], o=principal, m=method, d=digest_of(method, asked),
                k="up")

    # -- a retry's state, opened once ------------------------------------------------------
    def opened(self, msg: Message, principal: str, modern_route: bool
               ) -> OwnRound | TheirRound | None:
        """What a request's requestState says, opened and checked against the request,
        before it is decided; None when it carries none the gateway reads. Forged, expired,
        another principal's, or issued for another request: InvalidParams (spec MRTR:
        requestState is attacker-controlled), and another principal's, or a modern
        upstream's issued for another request, as any state this gateway did not issue."""
        method, params = msg["method"], msg.get("params")
        if not isinstance(params, dict) or "requestState" not in params or \
                method in NOT_ROUNDS:
            return None
        ours = method in mcp.MRTR_METHODS
        if not (ours or modern_route):
            return None  # a bridged request the gateway never asked for input: not its state
        state = self.sealer.open(params["requestState"], principal)
        issued = state.get("m") == method and state.get("d") == digest(method, params)
        if state.get("k") == "up" and modern_route:  # the server's own round
            if not issued:
                raise errors.InvalidParams(NOT_ISSUED)
            return TheirRound(state.get("s"))
        if not ours:  # a modern route's request no round of the gateway's has
            raise errors.InvalidParams(NOT_ISSUED)
        if not issued:
            raise errors.InvalidParams("Invalid requestState: it was issued for a different "
                                       "request; retry with the original method and params")
        return _own(state)

    # -- the gateway's rounds (a legacy server asked for input) ----------------------------
    def ask(self, ex: Answerable, parked: Parked, client_id: RequestId) -> None:
        """Park `parked` for one more round and answer `ex` with the InputRequiredResult
        that says so; or, its principal having no parked call to give way (the gateway's
        bound is others'), cancel the call and answer 429."""
        round_ = parked.next_round()
        try:
            self.parked.park(parked)
        except errors.TooManyRequests as exc:
            self.counters.reject("parked")
            log.warning("mrtr.refused", upstream=self.upstream, reason=exc.message)
            parked.abandon("too many calls waiting for input")
            ex.answer(exc.to_message(client_id), exc.http_status)
            return
        # The replica's address travels sealed with the state: a retry reaching another
        # replica is handed here without asking the store (which may be away meanwhile).
        state = self.sealer.seal(p=parked.id, r=round_, o=parked.owner,
                                 m=parked.request.method,
                                 d=digest_of(parked.request.method, parked.request.asked),
                                 x=self.replica, u=self.replica_url)
        ex.answer(jsonrpc.result(client_id, {"resultType": "input_required",
                                             "inputRequests": parked.requests(),
                                             "requestState": state}))

    def claim(self, retry: OwnRound, params: dict[str, Any]) -> Parked | Elsewhere:
        """The parked call a retry of the gateway's own round resumes (its state opened
        and checked by `opened`), its answers (`params`' inputResponses) sent upstream; or
        where it is parked. Every check happens before the parked call is touched, so a
        bad retry (InvalidParams) leaves it waiting for a good one."""
        if retry.replica is not None and retry.replica != self.replica:
            return Elsewhere(retry.replica, retry.url)
        parked = self.parked.get(retry.parked)
        if parked is None:
            raise errors.InvalidParams("Invalid requestState: that request is no longer "
                                       "waiting for input; send it again without requestState")
        if retry.round != parked.round:
            raise errors.InvalidParams("Invalid requestState: it was already used")
        answers = params.get("inputResponses", {})
        if not isinstance(answers, dict) or any(
                not isinstance(answers[k], dict) for k in parked.asked if k in answers):
            raise errors.InvalidParams("Invalid params: inputResponses must map each input "
                                       "request's key to its result object")
        self.parked.take(parked.id)
        parked.answer(answers)
        return parked

    def close(self) -> None:
        self.parked.close()


def _own(state: dict[str, Any]) -> OwnRound:
    """A round of the gateway's own as its opened state names it (a field of another kind
    names nothing: the retry then finds no parked call)."""
    parked, round_, replica, url = (state.get(k) for k in ("p", "r", "x", "u"))
    return OwnRound(parked if isinstance(parked, str) else None,
                    round_ if isinstance(round_, int) else None,
                    replica if isinstance(replica, str) else None,
                    url if isinstance(url, str) else None)
