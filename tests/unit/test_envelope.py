"""The modern era's per-request envelope (downstream/envelope.py `check`, pure): each check
against the body with the spec's error (spec 2026-07-28 basic: General fields; Streamable
HTTP: Standard Headers, Value Encoding, Custom Headers), and the Caller of a valid one."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from aiohttp.test_utils import make_mocked_request

from gateway import errors
from gateway.auth import ANONYMOUS
from gateway.downstream.envelope import check
from gateway.protocol import jsonrpc, mcp
from gateway.protocol.jsonrpc import Message
from gateway.settings.schema import ToolEntry
from gateway.tasks.curation import Curation
from gateway.upstream.catalogue import Catalogue

VERSION = mcp.MODERN_VERSIONS[0]


def body(method: str = "tools/list", meta: Any = None, **params: Any) -> Message:
    meta = {mcp.META_VERSION: VERSION, mcp.META_CAPABILITIES: {}} if meta is None else meta
    return jsonrpc.request(1, method, {**params, "_meta": meta})


def headers_for(msg: Message, **extra: str) -> dict[str, str]:
    """The headers a well-behaved client sends with `msg`, changed by `extra`."""
    out = {mcp.H_PROTOCOL: VERSION, mcp.H_METHOD: msg["method"]}
    field = mcp.NAME_FIELD.get(msg["method"])
    if field is not None and isinstance(msg["params"].get(field), str):
        out[mcp.H_NAME] = msg["params"][field]
    out.update({k.replace("_", "-"): v for k, v in extra.items()})
    return {k: v for k, v in out.items() if v != "-"}  # "-": leave the header out


def checked(msg: Message, catalogue: Catalogue | None = None, **headers: str) -> Any:
    request = make_mocked_request("POST", "/mcp", headers=headers_for(msg, **headers))
    return check(request, msg, catalogue or Catalogue())


def refused(msg: Message, catalogue: Catalogue | None = None,
            **headers: str) -> errors.GatewayError:
    with pytest.raises(errors.GatewayError) as caught:
        checked(msg, catalogue, **headers)
    return caught.value


def test_a_valid_request_stands_for_its_caller() -> None:
    caps = {"extensions": {"io.modelcontextprotocol/tasks": {}}}
    caller = checked(body(meta={mcp.META_VERSION: VERSION, mcp.META_CAPABILITIES: caps,
                                mcp.META_LOG_LEVEL: "warning"}))
    assert (caller.principal, caller.key) == (ANONYMOUS.owner, f"modern:{ANONYMOUS.owner}")
    assert caller.capabilities is caps
    assert (caller.level, caller.log_level) == ("warning", mcp.LOG_LEVELS.index("warning"))
    assert checked(body()).level is None  # none asked, or one not in the spec's list
    assert checked(body(meta={mcp.META_VERSION: VERSION, mcp.META_CAPABILITIES: {},
                              mcp.META_LOG_LEVEL: "loud"})).log_level is None


@pytest.mark.parametrize("meta", [
    "not an object", {}, {mcp.META_VERSION: 20260728, mcp.META_CAPABILITIES: {}}])
def test_the_protocol_version_in_meta_is_required(meta: Any) -> None:
    """spec (basic, Per-request protocol fields): -32602 and 400."""
    error = refused(body(meta=meta))
    assert (error.code, error.http_status) == (jsonrpc.INVALID_PARAMS, 400)
    assert mcp.META_VERSION in error.message


def test_params_must_be_an_object() -> None:
    msg = jsonrpc.request(1, "tools/list", ["positional"])
    assert isinstance(refused(msg), errors.InvalidParams)


@pytest.mark.parametrize(("header", "said"), [("-", "is missing"),
                                              ("2025-11-25", "does not match")])
def test_the_version_header_must_match_the_body(header: str, said: str) -> None:
    """spec (Streamable HTTP, Protocol Version Header): -32020 HeaderMismatch, 400."""
    error = refused(body(), MCP_Protocol_Version=header)
    assert isinstance(error, errors.HeaderMismatch) and error.http_status == 400
    assert said in error.message


def test_a_version_the_gateway_does_not_speak_is_refused_naming_those_it_does() -> None:
    msg = body(meta={mcp.META_VERSION: "2099-01-01", mcp.META_CAPABILITIES: {}})
    error = refused(msg, MCP_Protocol_Version="2099-01-01")
    assert isinstance(error, errors.UnsupportedModernVersion)
    assert error.data == {"supported": list(mcp.SUPPORTED_VERSIONS), "requested": "2099-01-01"}


def test_client_capabilities_are_required() -> None:
    error = refused(body(meta={mcp.META_VERSION: VERSION}))
    assert isinstance(error, errors.InvalidParams) and mcp.META_CAPABILITIES in error.message


def test_the_method_header_must_match_and_name_a_modern_method() -> None:
    assert isinstance(refused(body(), Mcp_Method="tools/call"), errors.HeaderMismatch)
    assert isinstance(refused(body(), Mcp_Method="-"), errors.HeaderMismatch)
    for method in ("initialize", "tasks/result", "tasks/list"):
        error = refused(body(method))
        assert isinstance(error, errors.MethodNotFound) and error.http_status == 404


def test_the_name_header_must_match_the_named_field() -> None:
    """spec (Streamable HTTP, Standard Headers): Mcp-Name mirrors the tool's name (the
    resource's uri, the task's id), plain or base64-encoded (Value Encoding)."""
    call = body("tools/call", name="café")
    encoded = "=?base64?" + base64.b64encode("café".encode()).decode() + "?="
    assert checked(call, Mcp_Name=encoded).principal == ANONYMOUS.owner
    assert isinstance(refused(call, Mcp_Name="other"), errors.HeaderMismatch)
    assert isinstance(refused(call, Mcp_Name="-"), errors.HeaderMismatch)
    assert "not valid base64" in refused(call, Mcp_Name="=?base64?%%%?=").message
    read = body("resources/read", uri="test://a")
    assert isinstance(refused(read, Mcp_Name="test://b"), errors.HeaderMismatch)


def test_on_the_tasks_extension_a_name_header_may_be_absent_but_not_wrong() -> None:
    """Its own rule: a Mcp-Name that disagrees with taskId is refused; an absent one is
    let through (clients in use today do not send it on tasks/*)."""
    get = body("tasks/get", taskId="t1")
    assert checked(get, Mcp_Name="-").principal == ANONYMOUS.owner
    assert checked(get).principal == ANONYMOUS.owner
    assert isinstance(refused(get, Mcp_Name="t2"), errors.HeaderMismatch)


def test_arguments_mirrored_in_param_headers_must_match() -> None:
    """spec (Streamable HTTP, Custom Headers): an x-mcp-header argument the upstream's
    tools/list named must come in its Mcp-Param-* header too, equal to the body's."""
    catalogue = Catalogue()
    catalogue.param_headers["deploy"] = {("region",): "Region", ("opts", "dry"): "Dry"}

    def call(**arguments: Any) -> Message:
        return body("tools/call", name="deploy", arguments=arguments)

    both = call(region="eu", opts={"dry": True})
    assert checked(both, catalogue, Mcp_Param_Region="eu", Mcp_Param_Dry="true")
    assert checked(call(), catalogue)  # neither in the body nor in headers
    for region, dry in (("us", "true"), ("eu", "false"), ("-", "true")):
        error = refused(both, catalogue, Mcp_Param_Region=region, Mcp_Param_Dry=dry)
        assert isinstance(error, errors.HeaderMismatch)
    # A tool the catalogue knows no headers of: nothing to check.
    assert checked(body("tools/call", name="other", arguments={"region": "eu"}), catalogue)


def test_a_renamed_tools_param_headers_are_checked_by_its_server_name() -> None:
    catalogue = Catalogue()
    catalogue.param_headers["deploy"] = {("region",): "Region"}
    curation = Curation([{"deploy": ToolEntry(name="ship")}])
    msg = body("tools/call", name="ship", arguments={"region": "eu"})
    request = make_mocked_request("POST", "/mcp",
                                  headers=headers_for(msg, Mcp_Param_Region="us"))
    with pytest.raises(errors.HeaderMismatch):
        check(request, msg, catalogue, curation)
