"""The pieces behind the operator's surfaces (issue 29, item 5): the Host allow-list and its
defaults, and who is an operator."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from multidict import CIMultiDict

from gateway.auth import Authenticator
from gateway.auth.operators import Operators
from gateway.downstream.peers import Clients, Hosts, split
from gateway.errors import OperatorOnly, Unauthorized
from gateway.settings import ConfigError
from gateway.settings.load import from_mapping, load

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
    # Issue 41: with client auth, a loopback peer is no operator by being one (a proxy on
    # the same host makes every client one); nobody is, on the gateway's port.
    assert await admitted(unnamed, None, local=True) == "Unauthorized"
    assert await admitted(unnamed, "Bearer nope", local=True) == "Unauthorized"
    assert await admitted(unnamed, "Bearer client", local=True) == "OperatorOnly"
    assert await admitted(unnamed, "Bearer client", local=False) == "OperatorOnly"
    # On the operator listener of its own, loopback peers are while no operator is named.
    listener = Operators(unnamed_conf, Authenticator(unnamed_conf), listener=True)
    assert await admitted(listener, None, local=True) == "admitted"
    assert await admitted(listener, "Bearer client", local=False) == "OperatorOnly"
    named_listener = Operators(conf, Authenticator(conf), listener=True)
    assert await admitted(named_listener, None, local=True) == "Unauthorized"
    assert await admitted(named_listener, "Bearer admin", local=False) == "admitted"
    no_auth_conf = from_mapping(UPSTREAM).auth
    no_auth = Operators(no_auth_conf, Authenticator(no_auth_conf))
    assert await admitted(no_auth, None, local=True) == "admitted"
    assert await admitted(no_auth, None, local=False) == "OperatorOnly"
    only_admins = from_mapping({**UPSTREAM, "auth": {"admin_tokens": ["admin"]}}).auth
    no_clients = Operators(only_admins, Authenticator(only_admins))
    assert await admitted(no_clients, "Bearer admin", local=False) == "admitted"
    assert await admitted(no_clients, "Bearer other", local=True) == "Unauthorized"


def test_admin_scopes_and_the_older_admin_scope_both_name_operators() -> None:
    oauth = {"resource": "http://127.0.0.1:8080/mcp", "issuers": ["http://127.0.0.1:9000"]}
    both = from_mapping({**UPSTREAM, "auth": {"oauth": {
        **oauth, "admin_scopes": ["ops", "sre"], "admin_scope": "gateway:admin"}}}).auth
    assert both.oauth is not None
    assert both.oauth.operator_scopes == {"ops", "sre", "gateway:admin"}
    assert both.operators
    neither = from_mapping({**UPSTREAM, "auth": {"oauth": oauth}}).auth
    assert not neither.operators


class Peer:
    """What Clients reads of a request: its socket peer and its headers."""

    def __init__(self, remote: str, *forwarded: str) -> None:
        self.remote = remote
        self.headers = CIMultiDict(("X-Forwarded-For", f) for f in forwarded)


@pytest.mark.parametrize(("trusted", "remote", "forwarded", "client"), [
    ([], "127.0.0.1", ["203.0.113.7"], "127.0.0.1"),  # never believed by default
    (["127.0.0.1"], "127.0.0.1", ["203.0.113.7"], "203.0.113.7"),
    (["127.0.0.1"], "127.0.0.1", [], "127.0.0.1"),
    (["127.0.0.1"], "10.0.0.9", ["203.0.113.7"], "10.0.0.9"),  # not from the proxy
    # the client's own words are to the left of what the proxy appended
    (["127.0.0.1"], "127.0.0.1", ["198.51.100.1, 203.0.113.7"], "203.0.113.7"),
    # issue 49: one hop exactly. A client inside a trusted range (10.1.2.3, on a LAN behind
    # the proxy) that writes Alice's address to the left is charged itself, not Alice.
    (["127.0.0.1", "10.0.0.0/8"], "127.0.0.1", ["203.0.113.7, 10.1.2.3"], "10.1.2.3"),
    (["127.0.0.1", "10.0.0.0/8"], "10.1.2.3", ["203.0.113.7"], "203.0.113.7"),
    (["127.0.0.1"], "127.0.0.1", ["198.51.100.1", "203.0.113.7"], "203.0.113.7"),
    (["127.0.0.1"], "127.0.0.1", ["not-an-address"], "127.0.0.1"),
    (["127.0.0.0/8", ""], "127.0.0.1", ["127.0.0.2"], "127.0.0.2"),  # a trusted address too
    (["::1"], "::1", ["2001:db8::5"], "2001:db8::5"),
    (["127.0.0.1"], "127.0.0.1", ["203.0.113.7:41000"], "203.0.113.7"),  # ip:port
    (["127.0.0.1"], "127.0.0.1", ["[2001:db8::5]:41000"], "2001:db8::5"),
])
def test_the_client_behind_a_trusted_proxy(trusted: list[str], remote: str,
                                           forwarded: list[str], client: str) -> None:
    assert Clients(trusted).address(Peer(remote, *forwarded)) == client  # type: ignore[arg-type]


def test_trusted_proxies_are_addresses() -> None:
    from_mapping({**UPSTREAM, "security": {"trusted_proxies": ["127.0.0.1", "10.0.0.0/8",
                                                                "::1", ""]}})
    with pytest.raises(ConfigError, match=r"security.trusted_proxies: .*not an IP address"):
        from_mapping({**UPSTREAM, "security": {"trusted_proxies": ["haproxy"]}})


def test_the_operator_listener_serves_loopback_names_and_addresses_wherever_bound() -> None:
    """Issue 41, second look: bound wide, the operator listener served any Host (a DNS
    rebinding page could read it); it serves the loopback names, allowed_hosts and any IP
    address (a scraper reaching a pod by its address), never another name."""
    wide = {**UPSTREAM, "listen": {"host": "0.0.0.0", "operator_port": 9090},
            "auth": {"bearer_tokens": ["t" * 32]},
            "security": {"allowed_hosts": ["mcp.example.com"]}}
    served = ["localhost", "127.0.0.1", "[::1]", "mcp.example.com"]
    assert from_mapping(wide).operator_hosts == served
    exposed = {**wide, "listen": {**wide["listen"], "operator_host": "0.0.0.0"}}
    assert from_mapping(exposed).operator_hosts == served
    bare = {**exposed, "security": {}}
    hosts = Hosts(from_mapping(bare).operator_hosts, addresses=True)
    for host in ("localhost:9090", "10.1.2.3:9090", "[fd00::1]:9090", "10.1.2.3"):
        assert hosts.allows(host), host
    for host in ("evil.example:9090", "10.1.2.3.evil.example", "[not-an-address]:9090"):
        assert not hosts.allows(host), host
    assert not Hosts(["localhost"]).allows("10.1.2.3:9090")  # the gateway's port: names


def test_the_operator_port_is_not_the_gateway_port() -> None:
    with pytest.raises(ConfigError, match="operator_port must differ"):
        from_mapping({**UPSTREAM, "listen": {"port": 9000, "operator_port": 9000}})


ROOT = Path(__file__).parents[2]


def test_the_shipped_files_give_operators_a_way_in(monkeypatch) -> None:
    """Issue 41: the container as docs/container.md (once README) runs it reads an operator's
    token, which the page names; HAProxy sends the client's address and the replicas behind
    it believe it."""
    for name, value in (("GATEWAY_TOKEN", "t" * 32), ("GATEWAY_ADMIN_TOKEN", "a" * 32),
                        ("GATEWAY_SECRET", "s" * 32)):
        monkeypatch.setenv(name, value)
    assert load(ROOT / "config" / "docker.yaml").auth.admin_tokens == ["a" * 32]
    assert "GATEWAY_ADMIN_TOKEN" in (ROOT / "docs" / "container.md").read_text().split(
        "# Running in a container", 1)[1].split("\n## ", 1)[0]
    haproxy = (ROOT / "deploy" / "haproxy.cfg").read_text()
    assert re.search(r"^\s+option forwardfor$", haproxy, re.M)
    for name in ("gateway.yaml", "gateway.sentinel.yaml"):
        replica = load(ROOT / "deploy" / name)
        assert "127.0.0.1" in replica.security.trusted_proxies
        assert replica.auth.failures_per_minute > 0
    oauth = yaml.safe_load((ROOT / "config" / "oauth.yaml").read_text())["auth"]["oauth"]
    idp = (ROOT / "tests" / "node" / "idp.mjs").read_text()
    assert oauth["admin_scopes"] == ["gateway:admin"]
    assert "const ADMIN_SCOPE = 'gateway:admin';" in idp and "secret('operator')" in idp
