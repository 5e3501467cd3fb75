"""What a trace span records of an answer that failed (semconv error.type), decided without
the OpenTelemetry SDK: the gateway marks every answer with it, traced or not."""

from __future__ import annotations

from conftest import loaded_by

from gateway.errors import UpstreamTimeout
from gateway.observability.tracing import OTHER_ERROR, TOOL_ERROR, error_type


def test_a_json_rpc_error_is_its_code_never_its_words() -> None:
    assert error_type({"error": {"code": -32602, "message": "bad key=alice-secret"}}) == "-32602"
    assert error_type({"error": {"code": "x", "message": "?"}}) == OTHER_ERROR


def test_an_upstream_failure_is_its_reason_and_a_forged_reason_is_not() -> None:
    assert error_type(UpstreamTimeout("main", "no answer").to_message(7)) == "timeout"
    forged = {"error": {"code": -32000, "data": {"upstream": "main", "reason": "alice-secret"}}}
    assert error_type(forged) == "-32000"  # a server's own `reason` is its words


def test_a_tools_is_error_result_is_a_tool_error() -> None:
    assert error_type({"result": {"content": [], "isError": True}}) == TOOL_ERROR
    assert error_type({"result": {"content": [], "isError": "yes"}}) is None
    assert error_type({"result": {"content": []}}) is None
    assert error_type({"result": []}) is None


def test_the_sdk_is_not_loaded_by_the_request_path() -> None:
    assert loaded_by("import gateway.observability.tracing, gateway.downstream.exchange",
                     ("opentelemetry", "opentelemetry.trace")) == []
