"""Per-message decisions that need no I/O: version negotiation, what the gateway answers
itself, and how an initialize result is built from the upstream's.

Transports carry the decisions out; nothing here knows HTTP.
"""

from __future__ import annotations

from typing import Any

from gateway.protocol import mcp

# Requests the gateway answers itself instead of forwarding.
LOCAL_REQUESTS = frozenset({mcp.PING})
# Client notifications that concern the gateway's own link with the upstream, not the server.
SWALLOWED_NOTIFICATIONS = frozenset({mcp.INITIALIZED})


def negotiate(requested: Any) -> str:
    """spec (lifecycle, Version Negotiation): the same version if supported, else our latest."""
    return requested if requested in mcp.LEGACY_VERSIONS else mcp.LATEST_LEGACY


def initialize_result(upstream: dict[str, Any], version: str) -> dict[str, Any]:
    """The answer to a client's initialize: the negotiated version, and what the upstream said
    of itself (capabilities, serverInfo, instructions and any other field), untouched."""
    return {**upstream, "protocolVersion": version}


def shares_subscription(method: str, uri: Any, others_subscribed: bool) -> bool:
    """Whether a (un)subscribe is answered locally: the upstream holds one subscription per URI
    for all sessions, so only the first subscribe and the last unsubscribe go upstream."""
    return isinstance(uri, str) and others_subscribed and method in (mcp.SUBSCRIBE,
                                                                      mcp.UNSUBSCRIBE)
