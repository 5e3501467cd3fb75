"""Wire shapes of the two client eras: pure translations between what the upstream said
and what a legacy session or a modern client is answered. No decisions (router.py), no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.protocol import jsonrpc, mcp
from gateway.tasks.dialects import core, extension


def initialize_result(upstream: dict[str, Any], version: str) -> dict[str, Any]:
    """The answer to a client's initialize: the negotiated version, and what the upstream said
    of itself (capabilities, serverInfo, instructions and any other field), untouched, except
    that a 2025-11-25 session gets the gateway's core tasks in place of any the upstream has
    (the gateway serves tasks/* for it; the upstream never sees a task request)."""
    out = {**upstream, "protocolVersion": version}
    if core.offered(version):
        out["capabilities"] = {**upstream.get("capabilities", {}), "tasks": core.CAPABILITY}
    return out


def discover_result(upstream: dict[str, Any], ttl_ms: int, scope: str) -> dict[str, Any]:
    """server/discover, answered from what the upstream said at its initialize, plus the
    tasks extension the gateway serves."""
    caps = dict(upstream.get("capabilities", {}))
    caps["extensions"] = {**(caps.get("extensions") or {}), extension.EXTENSION: {}}
    result: dict[str, Any] = {
        "resultType": "complete", "supportedVersions": list(mcp.SUPPORTED_VERSIONS),
        "capabilities": caps,
        "_meta": {mcp.META_SERVER_INFO: upstream.get("serverInfo", {})},
        "ttlMs": ttl_ms, "cacheScope": scope}
    if "instructions" in upstream:
        result["instructions"] = upstream["instructions"]
    return result


def to_upstream(params: dict[str, Any], modern_upstream: bool = False) -> dict[str, Any]:
    """A modern request's params as the upstream should see them: without the modern
    envelope keys (the connection stamps its own), without the MRTR fields unless the
    upstream is modern-only (a legacy one never asked: the gateway answered those), and
    without `task`, which the tasks extension says to ignore (a 2025-11-25 upstream would
    make a task of its own), and without a client's webhook (the gateway's: push/client.py);
    all else untouched."""
    drop = ("task",) if modern_upstream else ("inputResponses", "requestState", "task")
    out = {k: v for k, v in params.items() if k not in drop}
    meta = out.get("_meta")
    if isinstance(meta, dict):
        meta = {k: v for k, v in meta.items()
                if k not in mcp.MODERN_META_KEYS and k != mcp.META_WEBHOOK}
        if meta:
            out["_meta"] = meta
        else:
            del out["_meta"]
    return out


def private(msg: dict[str, Any]) -> dict[str, Any]:
    """A result no cache may share across authorization contexts (`cacheScope`)."""
    result = msg.get("result")
    if isinstance(result, dict):
        result["cacheScope"] = "private"
    return msg


def modern_response(method: str, msg: dict[str, Any], server_info: Any, ttl_ms: int,
                    scope: str, uri: Any = None) -> tuple[dict[str, Any], int]:
    """An upstream's response made modern, with its HTTP status: every result carries
    `resultType` and serverInfo, cacheable ones carry caching hints; an error's status is
    the one table's (`mcp.modern_error_status`), after -32002 (resource not found, legacy)
    became -32602 (see `resource_not_found`; `uri`: what resources/read asked for)."""
    error = msg.get("error")
    if isinstance(error, dict):
        reading = method == mcp.RESOURCES_READ
        if error.get("code") == mcp.LEGACY_RESOURCE_NOT_FOUND or (
                reading and error.get("code") == jsonrpc.INVALID_PARAMS):
            msg["error"] = error = resource_not_found(error, uri if reading else None)
        return msg, mcp.modern_error_status(error)
    result = msg.get("result")
    if isinstance(result, dict):
        result.setdefault("resultType", "complete")
        if method in mcp.CACHEABLE_METHODS:
            result.setdefault("ttlMs", ttl_ms)
            result.setdefault("cacheScope", scope)
        meta = result.get("_meta")
        if server_info and (meta is None or isinstance(meta, dict)):
            result["_meta"] = {mcp.META_SERVER_INFO: server_info, **(meta or {})}
    return msg, 200


def resource_not_found(error: dict[str, Any], uri: Any) -> dict[str, Any]:
    """A legacy -32002 (resource not found) as the modern era says it: -32602, with the
    URI asked for in `data.uri` (spec 2026-07-28 resources, Error Handling, SEP-2164) unless
    the server named it already."""
    data = error.get("data")
    data = {**data} if isinstance(data, dict) else {} if data is None else {"detail": data}
    if isinstance(uri, str):
        data.setdefault("uri", uri)
    return {**error, "code": jsonrpc.INVALID_PARAMS, **({"data": data} if data else {})}


def log_wanted(level: Any, wanted: int | None) -> bool:
    """spec 2026-07-28 logging: only for requests that set a level, at or above it."""
    if wanted is None:
        return False
    rank = mcp.LOG_LEVELS.index(level) if level in mcp.LOG_LEVELS else len(mcp.LOG_LEVELS)
    return rank >= wanted


def hide_tools(msg: dict[str, Any], hidden: Callable[[str], object]) -> dict[str, Any]:
    """A tools/list answer without the tools for which `hidden(name)` is true (a caller sees
    only the tools its token's scopes let it call)."""
    result = msg.get("result")
    if isinstance(result, dict) and isinstance(tools := result.get("tools"), list):
        result["tools"] = [t for t in tools
                           if not (isinstance(t, dict) and hidden(str(t.get("name", ""))))]
    return msg
