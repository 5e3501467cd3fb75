"""The modern era's per-request envelope (spec 2026-07-28 basic: General fields; Streamable
HTTP: Standard Headers, Value Encoding, Custom Headers): its checks against the body, each
with the spec's error, the `Caller` a valid request stands for, and `ModernRequest`, the
frozen description of a request its era decided, which its exchange and its parked call
are built from.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from gateway import errors
from gateway.downstream.boundary import principal_of
from gateway.protocol import mcp
from gateway.protocol.jsonrpc import Message, RequestId
from gateway.tasks.curation import Curation
from gateway.tasks.dialects import Lacking, extension
from gateway.tasks.policy import Policy
from gateway.upstream.catalogue import Catalogue
from gateway.upstream.correlator import Host


class Caller:
    """The `Owner` of one modern request: what its `_meta` declared, nothing remembered."""

    __slots__ = ("capabilities", "key", "level", "log_level", "principal")
    modern = True  # a modern-only upstream's input_required rounds reach it as they are

    def __init__(self, principal: str, capabilities: dict[str, Any], log_level: Any) -> None:
        # The owner is the auth context (docs/architecture.md, Tenancy): requests of one
        # never guess across to another's. Capabilities stay per request.
        self.key = f"modern:{principal}"
        self.principal = principal
        self.capabilities = capabilities
        self.level = log_level if log_level in mcp.LOG_LEVELS else None  # as asked
        self.log_level = (mcp.LOG_LEVELS.index(log_level) if log_level in mcp.LOG_LEVELS
                          else None)

    def accepts(self, method: str) -> bool:
        cap = mcp.CLIENT_CAPABILITY_FOR.get(method)
        return cap is not None and cap in self.capabilities

    def deliver(self, msg: Message) -> None:
        pass  # a modern client receives nothing outside its requests' own streams

    def expect_reply(self, asked_id: str, host: Host) -> None:
        pass  # answers come back as inputResponses, matched by the parked call

    def is_subscribed(self, uri: str) -> bool:
        return False

    def without_tasks(self) -> Caller:
        """This caller as a modern upstream hears it where the gateway decides about tasks:
        without the tasks extension, so the upstream makes no task of its own."""
        return Caller(self.principal, extension.without(self.capabilities), self.level)


@dataclass(frozen=True, slots=True)
class ModernRequest:
    """One modern request forwarded upstream, as its era decided it: whole before its
    exchange is built, and never changed after (an MRTR retry is described anew, from its
    parked call's: `dataclasses.replace`)."""

    id: RequestId  # the client's, which every answer to it carries
    caller: Caller  # the `Owner` its call is sent for
    method: str
    # The client's params as sent: what a retry repeats. Their digest (mrtr.digest) is taken
    # only when a round is sealed, for the few calls that ask for input (never changed:
    # the upstream is sent a new dict, shapes.to_upstream); a parked call keeps only that
    # digest (mrtr.Parked), and so does the request of its retry.
    asked: dict[str, Any] | str
    tool: str  # a tools/call's tool (str of its name, "" for none)
    uri: str | None  # resources/read: named in a not-found error (sep-2164)
    modern: bool  # its route speaks the server's own modern wire: its rounds come back
    policy: Policy | None = None  # the router let the call become a task (TaskCall)
    hidden: Lacking | None = None  # tools/list: the tools the caller may not call
    own_progress: bool = False  # the gateway asked for progress, not the client
    push: dict[str, Any] | None = None  # a webhook the call asks for its task (push/client.py)
    masked: str | None = None  # a call of a name no client may call: the name (curation.py)


def check(request: web.Request, msg: Message, catalogue: Catalogue,
          curation: Curation | None = None) -> Caller:
    """The caller of a modern request whose envelope and headers agree with its body;
    the spec's error for the first thing that does not (`curation`: the names clients call
    the upstream's tools by)."""
    params = msg.get("params")
    if params is not None and not isinstance(params, dict):
        raise errors.InvalidParams("Invalid params: params must be an object")
    meta = (params or {}).get("_meta")
    if not isinstance(meta, dict) or not isinstance(meta.get(mcp.META_VERSION), str):
        raise errors.InvalidParams(f"Invalid params: _meta[{mcp.META_VERSION!r}] is "
                                   "required on every request")
    version = meta[mcp.META_VERSION]
    header = _header(request, mcp.H_PROTOCOL)
    if header != version:
        said = (f"{errors.shown(header)} does not match" if header is not None
                else "is missing; it must match")
        raise errors.HeaderMismatch(f"Header mismatch: {mcp.H_PROTOCOL} {said} the body's "
                                    f"protocol version {errors.shown(version)}")
    if version not in mcp.MODERN_VERSIONS:
        raise errors.UnsupportedModernVersion(
            "Unsupported protocol version", {"supported": list(mcp.SUPPORTED_VERSIONS),
                                             "requested": version})
    caps = meta.get(mcp.META_CAPABILITIES)
    if not isinstance(caps, dict):
        raise errors.InvalidParams(f"Invalid params: _meta[{mcp.META_CAPABILITIES!r}] is "
                                   "required on every request")
    method = msg["method"]
    if _header(request, mcp.H_METHOD) != method:
        raise errors.HeaderMismatch(f"Header mismatch: {mcp.H_METHOD} does not match the "
                                    f"body's method {errors.shown(method)}")
    if method not in mcp.MODERN_METHODS and method not in extension.METHODS:
        raise errors.MethodNotFound(f"Method not found: {method}")
    field = mcp.NAME_FIELD.get(method)
    header_name = _header(request, mcp.H_NAME)
    # The tasks extension's own rule: a Mcp-Name that disagrees with taskId is refused;
    # like the SDK's reference server, an absent one is let through (clients in use
    # today, FastMCP among them, do not send it on tasks/*).
    if field is not None and not (header_name is None and method in extension.METHODS):
        named = (params or {}).get(field)
        if _decoded(header_name) != named:
            raise errors.HeaderMismatch(f"Header mismatch: {mcp.H_NAME} does not match "
                                        f"the body's {field} {errors.shown(named)}")
    if method == mcp.TOOLS_CALL:
        _check_param_headers(request, params or {}, catalogue, curation)
    return Caller(principal_of(request).owner, caps, meta.get(mcp.META_LOG_LEVEL))


def _check_param_headers(request: web.Request, params: dict[str, Any], catalogue: Catalogue,
                         curation: Curation | None) -> None:
    """spec 2026-07-28 Streamable HTTP, Server Behavior for Custom Headers: each argument
    the tool mirrors in an `Mcp-Param-*` header must be there and match the body (known
    from the upstream's tools/list, by the server's name of the tool; unknown ones are only
    passed on)."""
    tool = str(params.get("name"))
    if curation is not None and curation.active:
        tool = curation.server_name(tool) or tool
    wanted = catalogue.param_headers.get(tool)
    for path, part in (wanted or {}).items():
        value: Any = params.get("arguments")
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        name = mcp.H_PARAM + part
        raw = _header(request, name)
        if raw is None and value is None:
            continue
        if raw is None or _decoded(raw, name) != mcp.header_text(value):
            raise errors.HeaderMismatch(f"Header mismatch: {name} does not match the "
                                        f"body's argument {'.'.join(path)!r}")


def _header(request: web.Request, name: str) -> str | None:
    value = request.headers.get(name)
    return value.strip() if value is not None else None


def _decoded(value: str | None, header: str = mcp.H_NAME) -> str | None:
    """spec 2026-07-28 Streamable HTTP, Value Encoding: `=?base64?...?=` carries UTF-8."""
    if value is None or not (value.startswith("=?base64?") and value.endswith("?=")):
        return value
    try:
        return base64.b64decode(value[9:-2], validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        raise errors.HeaderMismatch(f"Header mismatch: {header} is not valid base64"
                                    ) from None
