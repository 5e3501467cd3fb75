"""MRTR rounds (downstream/rounds.py): a retry's requestState is opened once and checked
against its request before anything is decided, and a retry of the gateway's own round
passes every check before the parked call it resumes is touched."""

from __future__ import annotations

from typing import Any

import pytest

from gateway import errors, router
from gateway.downstream.envelope import Caller, ModernRequest
from gateway.downstream.mrtr import NOT_ISSUED, Parked, ParkedCalls, Sealer, digest
from gateway.downstream.rounds import Elsewhere, Rounds, TheirRound
from gateway.observability.counters import Counters
from gateway.protocol import jsonrpc, mcp

PARAMS = {"name": "ask", "arguments": {"q": 1}}
DIFFERENT = "it was issued for a different request"


class Conn:
    """What a parked call needs of its connection (the `Host`), recorded; and how many of
    its calls are parked (`Call.park`, `unpark`)."""

    def __init__(self) -> None:
        self.replies: list[tuple[Any, dict[str, Any]]] = []
        self.cancelled: list[str] = []
        self.parked = 0

    def reply(self, asked_id: Any, msg: dict[str, Any], owner: Any) -> None:
        self.replies.append((asked_id, msg))

    def cancel(self, call: Any, why: str) -> None:
        self.cancelled.append(why)



class Call:
    def __init__(self) -> None:
        self.conn = Conn()
        self.owner = None

    def park(self, sink: Any) -> None:
        self.conn.parked += 1

    def unpark(self) -> None:
        self.conn.parked -= 1


class Answers:
    """The request a round answers."""

    def __init__(self) -> None:
        self.answered: list[tuple[dict[str, Any], int]] = []

    def answer(self, msg: dict[str, Any], status: int = 200) -> None:
        self.answered.append((msg, status))


def rounds(replica: str = "r1", max_parked: int = 4, per_principal: int | None = None
           ) -> Rounds:
    return Rounds(Sealer(b"k" * 32, 60), ParkedCalls(max_parked, 60, per_principal),
                  replica, "http://r1:8080", "main", Counters())


def retry(state: str, method: str = mcp.TOOLS_CALL, **params: Any) -> dict[str, Any]:
    return jsonrpc.request(7, method, {**PARAMS, **params, "requestState": state})


def parked_call(owner: str = "alice", released: list[int] | None = None) -> Parked:
    request = ModernRequest(1, Caller(owner, {}, None), mcp.TOOLS_CALL,
                            PARAMS, "ask", None, modern=False)
    done = (lambda: released.append(1)) if released is not None else None
    parked = Parked(Call(), request, done)  # type: ignore[arg-type]
    parked.add_input(jsonrpc.request("gw-1", "elicitation/create", {"message": "name?"}))
    return parked


def asked(r: Rounds, parked: Parked) -> str:
    """Park `parked` for a round; the requestState its answer hands the client."""
    ex = Answers()
    r.ask(ex, parked, 1)
    (msg, status), = ex.answered
    assert status == 200 and msg["result"]["resultType"] == "input_required"
    return str(msg["result"]["requestState"])


# -- opened: once, before deciding ---------------------------------------------------------
async def test_a_round_of_the_gateways_own_opens_to_the_fact_the_router_is_handed() -> None:
    r = rounds()
    parked = parked_call()
    state = asked(r, parked)
    for modern_route in (False, True):  # on either era's route: its call is parked here
        fact = r.opened(retry(state), "alice", modern_route)
        assert fact == router.OwnRound(parked.id, 1, "r1", "http://r1:8080")


def test_what_carries_no_state_the_gateway_reads_is_not_opened() -> None:
    r = rounds()
    assert r.opened(jsonrpc.request(1, mcp.TOOLS_CALL, PARAMS), "alice", True) is None
    # The gateway answers these itself: what they carry goes nowhere.
    for method in (mcp.DISCOVER, mcp.LISTEN):
        assert r.opened(retry("junk", method), "alice", True) is None
    # A bridged request no round can have (tools/list) goes on without its opening.
    assert r.opened(retry("junk", mcp.TOOLS_LIST), "alice", False) is None


@pytest.mark.parametrize("modern_route", [False, True])
def test_a_forged_or_another_principals_state_is_one_refusal(modern_route: bool) -> None:
    r = rounds()
    alices = r.sealer.seal(p="x", r=1, o="alice", m=mcp.TOOLS_CALL,
                           d=digest(mcp.TOOLS_CALL, PARAMS))
    for state, who in (("bm90IGEgc3RhdGU", "alice"), (alices, "bob")):
        with pytest.raises(errors.InvalidParams) as refused:
            r.opened(retry(state), who, modern_route)
        assert refused.value.message == NOT_ISSUED


async def test_a_state_for_another_request_is_refused() -> None:
    r = rounds()
    state = asked(r, parked_call())
    with pytest.raises(errors.InvalidParams, match=DIFFERENT):
        r.opened(retry(state, arguments={"q": 2}), "alice", False)
    with pytest.raises(errors.InvalidParams, match=DIFFERENT):
        r.opened(retry(state, "prompts/get"), "alice", False)


def test_a_modern_upstreams_round_comes_out_of_the_seal_for_its_request_only() -> None:
    r = rounds()
    answer = {"result": {"resultType": "input_required", "requestState": "server's own"}}
    r.seal_state(answer, "alice", mcp.TOOLS_CALL, PARAMS)
    sealed = answer["result"]["requestState"]
    assert sealed != "server's own"
    assert r.opened(retry(sealed), "alice", True) == TheirRound("server's own")
    # Issued for another request: as any state the gateway did not issue.
    with pytest.raises(errors.InvalidParams) as refused:
        r.opened(retry(sealed, arguments={"q": 2}), "alice", True)
    assert refused.value.message == NOT_ISSUED
    # On a bridged route it names no call parked here: the retry finds none.
    fact = r.opened(retry(sealed), "alice", False)
    assert fact == router.OwnRound(None, None, None, None)
    with pytest.raises(errors.InvalidParams, match="no longer waiting"):
        r.claim(fact, PARAMS)


def test_a_modern_routes_request_no_round_has_is_refused_its_state() -> None:
    """It might go to the server: never with the gateway's seal, nor with a state that is
    not the server's own."""
    r = rounds()
    for method in (mcp.TOOLS_LIST, "tasks/get"):
        state = r.sealer.seal(o="alice", m=method, d=digest(method, PARAMS))
        with pytest.raises(errors.InvalidParams) as refused:
            r.opened(retry(state, method), "alice", True)
        assert refused.value.message == NOT_ISSUED


def test_only_input_required_results_are_sealed() -> None:
    r = rounds()
    done = {"result": {"resultType": "complete", "requestState": "kept"}}
    r.seal_state(done, "alice", mcp.TOOLS_CALL, "d")
    assert done["result"]["requestState"] == "kept"


# -- claim: every check before the parked call is touched ----------------------------------
async def test_a_retry_resumes_its_call_with_its_answers_once() -> None:
    r = rounds()
    parked = parked_call()
    fact = r.opened(retry(asked(r, parked)), "alice", False)
    assert isinstance(fact, router.OwnRound)
    answer = {"action": "accept", "content": {"name": "Ada"}}
    key, = parked.asked
    assert r.claim(fact, {**PARAMS, "inputResponses": {key: answer}}) is parked
    assert parked.call.conn.replies == [("gw-1", jsonrpc.result("gw-1", answer))]
    assert len(r.parked) == 0 and parked.call.conn.parked == 0
    with pytest.raises(errors.InvalidParams, match="no longer waiting"):
        r.claim(fact, PARAMS)  # single use: the state's call is no longer parked


async def test_a_bad_retry_leaves_its_call_waiting_for_a_good_one() -> None:
    r = rounds()
    parked = parked_call()
    fact = r.opened(retry(asked(r, parked)), "alice", False)
    assert isinstance(fact, router.OwnRound)
    key, = parked.asked
    for bad in ([1], {key: "not an object"}):
        with pytest.raises(errors.InvalidParams, match="inputResponses must map"):
            r.claim(fact, {**PARAMS, "inputResponses": bad})
    stale = router.OwnRound(fact.parked, 0, fact.replica, fact.url)
    with pytest.raises(errors.InvalidParams, match="already used"):
        r.claim(stale, PARAMS)
    assert len(r.parked) == 1 and parked.call.conn.replies == []


def test_a_round_parked_on_another_replica_is_handed_there() -> None:
    fact = router.OwnRound("p", 1, "r2", "http://r2:8080")
    assert rounds("r1").claim(fact, PARAMS) == Elsewhere("r2", "http://r2:8080")


# -- ask: parked, or refused at its principal's bound ---------------------------------------
async def test_a_round_past_the_principals_bound_cancels_its_call_and_answers_429() -> None:
    r = rounds(max_parked=1)
    asked(r, parked_call("alice"))
    released: list[int] = []
    bobs = parked_call("bob", released)
    ex = Answers()
    r.ask(ex, bobs, 9)  # Alice's call fills the gateway: Bob has none to give way
    (msg, status), = ex.answered
    assert status == 429 and msg["id"] == 9
    assert bobs.call.conn.cancelled == ["too many calls waiting for input"]
    assert released == [1]
    bobs.abandon("again")  # released once only
    assert released == [1]
