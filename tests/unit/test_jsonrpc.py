"""JSON-RPC classification: what the gateway accepts as a message at all."""

from __future__ import annotations

import pytest

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
