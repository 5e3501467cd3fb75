"""Pure protocol helpers: JSON-RPC message classification, MCP header annotations."""

from __future__ import annotations

import pytest

from gateway.protocol import jsonrpc, mcp
from gateway.protocol.jsonrpc import classify


@pytest.mark.parametrize(("msg", "kind"), [
    ({"jsonrpc": "2.0", "id": 1, "method": "ping"}, "request"),
    ({"jsonrpc": "2.0", "id": "a", "method": "ping", "params": {}}, "request"),
    ({"jsonrpc": "2.0", "method": "notifications/initialized"}, "notification"),
    ({"jsonrpc": "2.0", "id": 1, "result": {}}, "response"),
    ({"jsonrpc": "2.0", "id": 1, "error": {"code": 1, "message": "x"}}, "response"),
    ({"jsonrpc": "2.0", "id": None, "method": "ping"}, None),
    ({"jsonrpc": "2.0", "id": True, "method": "ping"}, None),
    ({"jsonrpc": "2.0", "id": 1.5, "method": "ping"}, None),
    ({"jsonrpc": "2.0", "id": 1, "result": {}, "error": {}}, None),
    ({"jsonrpc": "2.0", "id": 1}, None),
    ({"id": 1, "method": "ping"}, None),
    ([], None),
    ("ping", None),
])
def test_classify(msg, kind) -> None:
    assert classify(msg) == kind


def test_x_mcp_header_paths_follow_properties_only() -> None:
    schema = {"type": "object", "properties": {
        "region": {"type": "string", "x-mcp-header": "Region"},
        "where": {"type": "object", "properties": {
            "zone": {"type": "integer", "x-mcp-header": "Zone"}}},
        "many": {"type": "array", "items": {"type": "object", "properties": {
            "hidden": {"type": "string"}}}}}}
    assert mcp.header_params(schema) == {("region",): "Region", ("where", "zone"): "Zone"}
    assert [mcp.header_text(v) for v in ("us", 42, True, False)] == ["us", "42", "true", "false"]


def test_nesting_is_bounded_whatever_the_size_says() -> None:
    """A level takes two bytes at least: only messages of 2 * MAX_DEPTH bytes or more can be
    too deep, and those are walked (issue 22: the common small message is not)."""
    for depth, deep in ((jsonrpc.MAX_DEPTH, False), (jsonrpc.MAX_DEPTH + 1, True)):
        raw = b"[" * depth + b"]" * depth
        assert jsonrpc.too_deep(jsonrpc.loads(raw), len(raw)) is deep
    wide = {"a": [[1]] * 1000}  # big, shallow
    assert not jsonrpc.too_deep(wide, len(jsonrpc.dumps(wide)))
