"""The guard's parts composed (downstream/guard.py): each door's checks in order, each
refusal's answer, count and audit event, and what every response carries. In process, on
mocked requests; tests/e2e/test_transport.py and test_operator_surfaces.py drive the same
through a gateway."""

from __future__ import annotations

from typing import Any
from unittest import mock

from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from structlog.testing import capture_logs

from gateway.auth import Authenticator
from gateway.downstream.boundary import OPERATOR, PRINCIPAL
from gateway.downstream.guard import Guard
from gateway.observability.counters import Counters
from gateway.settings.load import from_mapping

TOKEN, ADMIN = "t" * 32, "a" * 32
BASE: dict[str, Any] = {
    "upstreams": {"main": {"command": "x"}},
    "auth": {"bearer_tokens": [TOKEN], "admin_tokens": [ADMIN], "failures_per_minute": 2},
    "security": {"allowed_hosts": ["gateway.example"],
                 "allowed_origins": ["http://localhost"]},
}


def guard_for(raw: dict[str, Any] = BASE) -> tuple[Guard, Counters]:
    conf = from_mapping(raw)
    counters = Counters()
    return Guard.of(conf, counters, Authenticator(conf.auth)), counters


def request(path: str = "/mcp", method: str = "POST", token: str | None = TOKEN,
            peer: str = "10.0.0.1", **headers: str) -> web.Request:
    headers.setdefault("Host", "gateway.example")
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    transport = mock.Mock()
    transport.get_extra_info.side_effect = lambda name, default=None: (
        (peer, 40000) if name == "peername" else default)
    return make_mocked_request(method, path, headers=headers, transport=transport)


def rejected(counters: Counters) -> dict[tuple[str, str | None], int]:
    """mcp_gateway_rejections_total by (reason, cause)."""
    return {key: n for key, n in counters.rejections.items() if n}


async def test_a_client_that_passes_is_recorded_and_gets_nothing_from_the_guard() -> None:
    guard, counters = guard_for()
    passing = request()
    assert await guard.caller(passing) is None
    assert passing[PRINCIPAL].owner
    assert rejected(counters) == {}


async def test_the_host_is_checked_first_then_encoding_then_origin_then_credentials() -> None:
    guard, counters = guard_for()
    everything_wrong = dict(Host="evil.example", Origin="http://evil.example")
    refused = await guard.caller(request(token=None, **everything_wrong,
                                         **{"Content-Encoding": "gzip"}))
    assert refused is not None and refused.status == 421
    refused = await guard.caller(request(token=None, Origin="http://evil.example",
                                         **{"Content-Encoding": "gzip"}))
    assert refused is not None and refused.status == 415
    refused = await guard.caller(request(token=None, Origin="http://evil.example"))
    assert refused is not None and refused.status == 403
    assert rejected(counters) == {("host", None): 1, ("origin", None): 1}


async def test_a_preflight_from_an_allowed_origin_is_answered_without_a_credential() -> None:
    guard, _ = guard_for()
    preflight = request(method="OPTIONS", token=None, Origin="http://localhost:6274",
                        **{"Access-Control-Request-Headers": "mcp-session-id"})
    answer = await guard.caller(preflight)
    assert answer is not None and answer.status == 204
    assert answer.headers["Access-Control-Allow-Headers"] == "mcp-session-id"
    await guard.on_prepare(preflight, answer)
    assert answer.headers["Access-Control-Allow-Origin"] == "http://localhost:6274"


async def test_a_missing_token_is_challenged_and_audited_but_never_charged() -> None:
    guard, counters = guard_for()
    for _ in range(3):  # more than failures_per_minute
        missing = request(token=None)
        with capture_logs() as logs:
            answer = await guard.caller(missing)
            assert answer is not None and answer.status == 401
            await guard.on_prepare(missing, answer)
        assert answer.headers["WWW-Authenticate"] == "Bearer"
        assert [e["reason"] for e in logs if e["event"] == "auth.failed"] == ["missing"]
    assert rejected(counters) == {("auth", "missing"): 3}


async def test_wrong_tokens_spend_the_address_s_failures_then_it_is_throttled() -> None:
    guard, counters = guard_for()
    for _ in range(2):
        answer = await guard.caller(request(token="wrong" * 8))
        assert answer is not None and answer.status == 401
    with capture_logs() as logs:
        answer = await guard.caller(request())  # a valid token, too: nothing is learnt
    assert answer is not None and answer.status == 429
    assert int(answer.headers["Retry-After"]) >= 1
    assert [(e["reason"], e["remote"]) for e in logs] == [("rate", "10.0.0.1")]
    assert await guard.caller(request(peer="10.0.0.2")) is None  # another address
    assert rejected(counters) == {("auth", "wrong"): 2, ("auth", "rate"): 1}


async def test_doors_probes_are_open_operators_routes_take_operators() -> None:
    guard, counters = guard_for()
    assert await guard.admit(request("/healthz", "GET", token=None, Host="evil.example")) \
        is None
    assert await guard.admit(request("/readyz", "GET", token=None)) is None
    with capture_logs() as logs:
        refused = await guard.admit(request("/metrics", "GET"))  # a client's token
    assert refused is not None and refused.status == 403
    assert [e["reason"] for e in logs] == ["operator"]
    detail = request("/readyz?detail", "GET", token=None)
    refused = await guard.admit(detail)
    assert refused is not None and refused.status == 401
    operator = request("/status", "GET", token=ADMIN)
    assert await guard.admit(operator) is None
    assert operator[OPERATOR] is True
    refused = await guard.admit(request("/anything", "GET", token=None))
    assert refused is not None and refused.status == 401  # a catch-all route's guard
    assert rejected(counters) == {("auth", "operator"): 1, ("auth", "missing"): 2}


async def test_the_operator_listener_shares_the_failed_auth_limit() -> None:
    conf = from_mapping({**BASE, "listen": {"operator_port": 0}})
    guard = Guard.of(conf, Counters(), Authenticator(conf.auth))
    listener = guard.for_listener(conf)  # as app.py makes it
    for _ in range(2):
        await guard.caller(request(token="wrong" * 8))
    refused = await listener.admit(request("/metrics", "GET", token=ADMIN, Host="10.1.2.3"))
    assert refused is not None and refused.status == 429
