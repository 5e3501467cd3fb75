"""MRTR rounds of modern clients' calls (spec 2026-07-28, MRTR): the state a round hands
the client, sealed and bound to its caller and request, and the checks a retry passes
before the call it resumes is touched. The parked calls themselves are mrtr.py's; the
exchanges that carry rounds to the client are modern.py's.

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
from gateway.downstream.mrtr import NOT_ISSUED, Parked, ParkedCalls, Sealer, digest
from gateway.observability import log
from gateway.observability.counters import Counters
from gateway.protocol import jsonrpc, mcp
from gateway.protocol.jsonrpc import Message, RequestId


class Answerable(Protocol):
    """The request a round answers (an exchange)."""

    def answer(self, msg: Message, status: int = 200) -> None: ...


@dataclass(frozen=True, slots=True)
class Elsewhere:
    """The retry's call is parked on another replica: hand the retry there (handoff.py)."""

    replica: str
    url: str | None


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
    def seal_state(self, msg: Message, principal: str, method: str, digest_: str) -> None:
        """A modern upstream's own input_required round goes to the client with its
        requestState sealed by the gateway, bound to the caller's principal and request."""
        result = msg.get("result")
        if isinstance(result, dict) and result.get("resultType") == "input_required" and \
                "requestState" in result:
            result["requestState"] = self.sealer.seal(
                s=result["requestState"], o=principal, m=method, d=digest_, k="up")

    def open_state(self, params: dict[str, Any], principal: str, method: str) -> Any:
        """The server's own state inside a retry's requestState. Another principal's
        state, or one issued for another request, is refused as any state this gateway
        did not issue."""
        state = self.sealer.open(params["requestState"], principal)  # forged, expired
        if state.get("k") != "up" or state.get("m") != method or \
                state.get("d") != digest(method, params):
            raise errors.InvalidParams(NOT_ISSUED)
        return state.get("s")

    def gateways_own(self, msg: Message, principal: str) -> bool:
        """Whether a retry carries the state of one of the gateway's own rounds (not a
        modern upstream's). A server of both eras under `isolation: call` answers each
        tools/call on a legacy process of the pool, whose requests become the gateway's
        rounds although modern clients reach the server on its modern link."""
        params = msg.get("params")
        if msg.get("method") not in mcp.MRTR_METHODS or not isinstance(params, dict) or \
                "requestState" not in params:
            return False
        return "k" not in self.sealer.open(params["requestState"], principal)  # or forged

    # -- the gateway's rounds (a legacy server asked for input) ----------------------------
    def ask(self, ex: Answerable, parked: Parked, client_id: RequestId) -> None:
        """Park `parked` for one more round and answer `ex` with the InputRequiredResult
        that says so; or, its principal having no parked call to give way (the gateway's
        bound is others'), cancel the call and answer 429."""
        parked.round += 1
        try:
            self.parked.park(parked)
        except errors.TooManyRequests as exc:
            self.counters.reject("parked")
            log.warning("mrtr.refused", upstream=self.upstream, reason=exc.message)
            parked.conn.cancel(parked.call, "too many calls waiting for input")
            done, parked.done = parked.done, None
            if done is not None:
                done()
            ex.answer(exc.to_message(client_id), exc.http_status)
            return
        # The replica's address travels sealed with the state: a retry reaching another
        # replica is handed here without asking the store (which may be away meanwhile).
        state = self.sealer.seal(p=parked.id, r=parked.round, o=parked.owner,
                                 m=parked.method, d=parked.digest, x=self.replica,
                                 u=self.replica_url)
        ex.answer(jsonrpc.result(client_id, {"resultType": "input_required",
                                             "inputRequests": parked.requests(),
                                             "requestState": state}))

    def claim(self, msg: Message, principal: str) -> Parked | Elsewhere:
        """The parked call a retry with `requestState` resumes, its answers sent upstream;
        or where it is parked. Every check happens before the parked call is touched, so a
        bad retry (InvalidParams) leaves it waiting for a good one."""
        method, params = msg["method"], msg["params"]
        state = self.sealer.open(params["requestState"], principal)
        if state.get("m") != method or state.get("d") != digest(method, params):
            raise errors.InvalidParams("Invalid requestState: it was issued for a different "
                                       "request; retry with the original method and params")
        if state.get("x", self.replica) != self.replica:
            return Elsewhere(state["x"], state.get("u"))
        parked = self.parked.get(state.get("p"))
        if parked is None:
            raise errors.InvalidParams("Invalid requestState: that request is no longer "
                                       "waiting for input; send it again without requestState")
        if state.get("r") != parked.round:
            raise errors.InvalidParams("Invalid requestState: it was already used")
        answers = params.get("inputResponses", {})
        if not isinstance(answers, dict) or any(
                not isinstance(answers[k], dict) for k in parked.inputs if k in answers):
            raise errors.InvalidParams("Invalid params: inputResponses must map each input "
                                       "request's key to its result object")
        self.parked.take(parked.id)
        parked.answer(answers)
        return parked

    def close(self) -> None:
        self.parked.close()
