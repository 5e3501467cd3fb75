"""The pieces behind the operator's surfaces (issue 29, item 5): the Host allow-list and its
defaults, and who is an operator."""

from __future__ import annotations

import pytest

from gateway.auth import Authenticator
from gateway.auth.operators import Operators
from gateway.downstream.peers import Hosts, split
from gateway.errors import OperatorOnly, Unauthorized
from gateway.settings import ConfigError, from_mapping

UPSTREAM = {"upstreams": {"main": {"command": "x"}}}


@pytest.mark.parametrize(("host", "parts"), [
    ("localhost:8080", ("localhost", "8080")), ("localhost", ("localhost", None)),
    ("[::1]:8080", ("[::1]", "8080")), ("[::1]", ("[::1]", None)),
    ("localhost.:80", ("localhost", "80")), ("example.com:", ("example.com:", None)),
])
def test_host_values_split_into_name_and_port(host: str, parts: tuple[str, str | None]
                                              ) -> None:
    assert split(host) == parts


def test_host_allow_list() -> None:
    hosts = Hosts(["localhost", "127.0.0.1", "[::1]", "mcp.example.com:8443"])
    for served in ("localhost", "LOCALHOST:1234", "127.0.0.1:80", "[::1]:9",
                   "mcp.example.com:8443", None):
        assert hosts.allows(served), served
    for refused in ("evil.example", "evil.example:8443", "localhost.evil.example",
                    "mcp.example.com", "mcp.example.com:443", "127.0.0.2", "::1", ""):
        assert not hosts.allows(refused), refused
    assert Hosts(None).allows("evil.example")


def test_allowed_hosts_default_to_loopback_names_when_bound_to_loopback() -> None:
    assert from_mapping(UPSTREAM).allowed_hosts == ["localhost", "127.0.0.1", "[::1]"]
    for host in ("localhost", "::1", "127.0.0.5"):
        assert from_mapping({**UPSTREAM, "listen": {"host": host}}).allowed_hosts == [
            "localhost", "127.0.0.1", "[::1]"]
    beyond = {**UPSTREAM, "listen": {"host": "0.0.0.0"}, "auth": {"bearer_tokens": ["t" * 32]}}
    assert from_mapping(beyond).allowed_hosts is None  # no check unless configured
    named = {**beyond, "security": {"allowed_hosts": ["mcp.example.com"]}}
    assert from_mapping(named).allowed_hosts == ["mcp.example.com"]
    anyone = {**UPSTREAM, "security": {"allowed_hosts": ["*"]}}
    assert from_mapping(anyone).allowed_hosts is None
    with pytest.raises(ConfigError, match=r"security.allowed_hosts: .*not a host name"):
        from_mapping({**UPSTREAM, "security": {"allowed_hosts": ["https://mcp.example.com"]}})


def test_an_admin_token_cannot_be_a_client_token() -> None:
    with pytest.raises(ConfigError, match="auth: a token is in both"):
        from_mapping({**UPSTREAM, "auth": {"bearer_tokens": ["t"], "admin_tokens": ["t"]}})


async def admitted(operators: Operators, header: str | None, local: bool) -> str:
    try:
        await operators.admit(header, local)
    except (Unauthorized, OperatorOnly) as exc:
        return type(exc).__name__
    return "admitted"


async def test_who_is_an_operator() -> None:
    conf = from_mapping({**UPSTREAM, "auth": {"bearer_tokens": ["client"],
                                              "admin_tokens": ["", "admin"]}}).auth
    named = Operators(conf, Authenticator(conf))
    assert await admitted(named, "Bearer admin", local=False) == "admitted"
    assert await admitted(named, "Bearer client", local=True) == "OperatorOnly"
    assert await admitted(named, None, local=True) == "Unauthorized"
    assert await admitted(named, "Bearer ", local=True) == "Unauthorized"
    assert await admitted(named, "Bearer nope", local=True) == "Unauthorized"
    unnamed_conf = from_mapping({**UPSTREAM, "auth": {"bearer_tokens": ["client"]}}).auth
    unnamed = Operators(unnamed_conf, Authenticator(unnamed_conf))
    assert await admitted(unnamed, None, local=True) == "admitted"
    assert await admitted(unnamed, "Bearer client", local=False) == "OperatorOnly"
    only_admins = from_mapping({**UPSTREAM, "auth": {"admin_tokens": ["admin"]}}).auth
    no_clients = Operators(only_admins, Authenticator(only_admins))
    assert await admitted(no_clients, "Bearer admin", local=False) == "admitted"
    assert await admitted(no_clients, "Bearer other", local=True) == "Unauthorized"
