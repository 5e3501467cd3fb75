"""The one table of HTTP statuses for modern error responses (protocol/mcp.py), row by row
against the spec's words, and every path that answers a modern client held to it."""

from __future__ import annotations

import typing

import pytest

from gateway import errors
from gateway.downstream import shapes
from gateway.observability.counters import Counters
from gateway.protocol import jsonrpc, mcp

# (code, status, where the spec says so: spec 2026-07-28)
ROWS = [
    (-32700, 400, "Streamable HTTP, Sending Messages: a body it cannot accept"),
    (-32600, 400, "Streamable HTTP, Sending Messages: a body it cannot accept"),
    (-32601, 404, "Streamable HTTP, Protocol Version Header: unimplemented method"),
    (-32602, 400, "basic, Per-request protocol fields: missing _meta field"),
    (-32020, 400, "Streamable HTTP, Server Validation: HeaderMismatch"),
    (-32021, 400, "basic, Per-request protocol fields: MissingRequiredClientCapability"),
    (-32022, 400, "Streamable HTTP, Protocol Version Header: UnsupportedProtocolVersion"),
    (-32603, 200, "an internal error is the server's answer to a request it took"),
    (-32000, 200, "legacy implementation-defined range: no meaning assumed"),
    (-32002, 200, "legacy resource-not-found (bridged to -32602 first, see below)"),
    (1234, 200, "an application's own code"),
]


@pytest.mark.parametrize(("code", "status", "why"), ROWS)
def test_each_code_has_its_status(code: int, status: int, why: str) -> None:
    assert mcp.modern_error_status({"code": code, "message": "x"}) == status, why


@pytest.mark.parametrize("error", [None, "oops", {"code": "-32601"}, {"code": True}, {}])
def test_a_malformed_error_is_a_plain_answer(error: object) -> None:
    assert mcp.modern_error_status(error) == 200


@pytest.mark.parametrize("cls", [errors.ParseError, errors.InvalidRequest,
                                 errors.InvalidParams, errors.MethodNotFound,
                                 errors.HeaderMismatch, errors.MissingCapability,
                                 errors.UnsupportedModernVersion])
def test_the_gateways_own_errors_follow_the_table(cls: type[errors.GatewayError]) -> None:
    assert cls.http_status == mcp.MODERN_ERROR_STATUS[cls.code]


@pytest.mark.parametrize(("code", "status"), [(c, s) for c, s, _ in ROWS])
def test_an_upstreams_error_reaches_a_modern_client_with_the_tables_status(
        code: int, status: int) -> None:
    """Forwarded or bridged, the same table; a legacy -32002 is -32602 (400) by then: the
    modern era never emits -32002 (spec 2026-07-28 basic, Error Codes)."""
    msg = jsonrpc.error(3, code, "said the server")
    out, got = shapes.modern_response("tools/call", msg, None, 1000, "shared")
    if code == mcp.LEGACY_RESOURCE_NOT_FOUND:
        assert (out["error"]["code"], got) == (-32602, 400)
    else:
        assert (out["error"]["code"], got) == (code, status)
    assert out["error"]["message"] == "said the server"


def test_a_legacy_resource_not_found_is_bridged_with_its_uri() -> None:
    """sep-2164: -32602, and the URI asked for in data.uri."""
    msg = jsonrpc.error(4, mcp.LEGACY_RESOURCE_NOT_FOUND, "Resource not found",
                        {"reason": "gone"})
    out, status = shapes.modern_response("resources/read", msg, None, 1000, "shared",
                                         "test://missing")
    assert status == 400
    assert out["error"]["code"] == -32602
    assert out["error"]["data"] == {"reason": "gone", "uri": "test://missing"}
    # A server that named the URI itself keeps its own.
    named = jsonrpc.error(5, -32602, "not found", {"uri": "test://its-own"})
    out, _ = shapes.modern_response("resources/read", named, None, 1000, "shared", "test://x")
    assert out["error"]["data"]["uri"] == "test://its-own"


def test_each_kind_of_upstream_failure_says_its_own_reason_as_a_json_rpc_response() -> None:
    """A client reads why an upstream failed in the error's data `reason`: one kind of
    UpstreamError per reason, each carried at HTTP 200 as the server's answer would be."""
    kinds = [k for k in _descendants(errors.UpstreamError) if "failure" in vars(k)]
    assert {k.failure for k in kinds} == set(typing.get_args(errors.UpstreamFailure))
    assert len({k.failure for k in kinds}) == len(kinds)
    for kind in kinds:
        out = kind("main", "it failed", exitCode=3).to_message(7)
        # -32603, but a refusal the caller may retry (a bound: -32000, with retryAfterMs)
        assert out["id"] == 7 and out["error"]["code"] == kind.code
        assert kind.code == jsonrpc.INTERNAL_ERROR or "retryAfterMs" in out["error"]["data"]
        assert out["error"]["data"].items() >= {"upstream": "main", "reason": kind.failure,
                                                "exitCode": 3}.items()
        assert kind.http_status == 200


def _descendants(cls: type) -> list[type]:
    """The kinds under a category, and under categories (errors.py draws the tree)."""
    return [d for sub in cls.__subclasses__() for d in (sub, *_descendants(sub))]


def test_each_kind_of_upstream_failure_is_of_one_category() -> None:
    """unavailable / broken / timeout / shutdown: the handshake (upstream/handshake.py)
    and the eras decide by category, never by a list of kinds."""
    categories = (errors.UpstreamUnavailable, errors.UpstreamBroken, errors.UpstreamTimeout,
                  errors.UpstreamShutdown)
    assert set(errors.UpstreamError.__subclasses__()) == set(categories)
    for kind in _descendants(errors.UpstreamError):
        if "failure" in vars(kind):
            assert sum(issubclass(kind, c) for c in categories) == 1, kind


def test_a_kind_that_names_only_its_code_takes_the_tables_status() -> None:
    """errors.py states no status a code already implies (mcp.MODERN_ERROR_STATUS): a
    kind that names its code alone answers with that code's status; one that names its
    own status keeps it."""

    class Derived(errors.GatewayError):
        code = jsonrpc.METHOD_NOT_FOUND

    class Own(errors.GatewayError):
        code = jsonrpc.METHOD_NOT_FOUND
        http_status = 503

    assert (Derived.http_status, Own.http_status) == (404, 503)
    assert errors.AnswersOverBudget.http_status == errors.TooManyProcesses.http_status == 200


def test_only_an_auth_refusal_has_a_cause() -> None:
    """rejections{reason="auth", cause}: the cause is the auth refusals' alone; other
    refusals are counted by reason."""
    counters = Counters()
    counters.refused(errors.Unauthorized("no", "expired"))
    counters.refused(errors.TooManyFailures(1.0))
    counters.refused(errors.PayloadTooLarge("big"))
    assert counters.shown() == {"rejections.auth:expired": 1, "rejections.auth:rate": 1,
                                "rejections.body_too_large": 1}
    assert not hasattr(errors.PayloadTooLarge("big"), "cause")
    assert all(issubclass(k, errors.AuthRefusal)
               for k in _descendants(errors.GatewayError) if k.reason == "auth")
