"""gateway/auth/ pieces that need no server: where metadata lives, what challenges say,
what a principal lacks and whose it is, failed authentications per address, and that a
gateway without OAuth does not carry PyJWT."""

from __future__ import annotations

import pytest
from conftest import loaded_by
from test_ratelimit import Clock

from gateway.auth.keys import metadata_urls
from gateway.auth.principal import Principal, digest, scopes_of
from gateway.auth.resource import ProtectedResource
from gateway.auth.throttle import FailedAuths
from gateway.errors import TooManyFailures
from gateway.settings.schema import OAuth


def test_metadata_is_looked_for_where_rfc_8414_then_oidc_put_it() -> None:
    assert metadata_urls("https://idp.example.com") == [
        "https://idp.example.com/.well-known/oauth-authorization-server",
        "https://idp.example.com/.well-known/openid-configuration"]
    assert metadata_urls("https://idp.example.com/realms/a/") == [
        "https://idp.example.com/.well-known/oauth-authorization-server/realms/a",
        "https://idp.example.com/realms/a/.well-known/openid-configuration"]


def test_challenges_point_to_the_metadata_of_the_path() -> None:
    resource = ProtectedResource(OAuth(resource="https://gw.example.com/mcp",
                                       issuers=["https://idp.example.com"], scopes=["read"]),
                                 frozenset({"deploy"}))
    assert resource.metadata_url("/mcp") == \
        "https://gw.example.com/.well-known/oauth-protected-resource/mcp"
    assert resource.unauthorized("/mcp", "missing", "x") == (
        'Bearer resource_metadata="https://gw.example.com/.well-known/'
        'oauth-protected-resource/mcp", scope="read"')
    refused = resource.unauthorized("/other", "expired", 'the "token" has expired')
    assert 'error="invalid_token"' in refused
    assert "error_description=\"the 'token' has expired\"" in refused  # no quote breaks out
    assert resource.insufficient_scope("/mcp", ["deploy"], "needs deploy").startswith(
        'Bearer error="insufficient_scope", scope="deploy read"')
    assert resource.document["scopes_supported"] == ["deploy", "read"]
    # A tool's name a client sent, in the description: RFC 6750 3's characters only.
    named = resource.insufficient_scope("/mcp", ["deploy"], 'tool "a\\\"b\u00e9\u2028"')
    description = named.split('error_description="', 1)[1]
    assert description == "tool 'a?'b??'\""
    assert all(" " <= c <= "~" for c in named) and "\\" not in named


def test_a_principal_lacks_only_what_it_does_not_hold() -> None:
    scoped = Principal("o", frozenset({"tools"}))
    assert scoped.lacks(frozenset({"tools", "deploy"})) == {"deploy"}
    assert scoped.lacks(frozenset()) == frozenset()
    assert Principal("static").lacks(frozenset({"deploy"})) == frozenset()  # not scoped
    assert scopes_of({"scope": "a b"}) == {"a", "b"}
    assert scopes_of({"scp": ["a", 3]}) == {"a"}
    assert scopes_of({}) == frozenset()


def test_tokens_stay_out_of_reprs() -> None:
    principal = Principal("o", token="secret-access-token")
    assert "secret-access-token" not in repr(principal)


def test_a_gateway_without_oauth_does_not_load_pyjwt() -> None:
    code = ("from gateway.app import create_app; from gateway.settings.load import from_mapping; "
            "create_app(from_mapping({'upstreams': {'m': {'command': 'x'}}, "
            "'auth': {'bearer_tokens': ['t']}}))")
    assert loaded_by(code, ("jwt",)) == []


def test_clients_and_users_are_owners_in_namespaces_apart() -> None:
    issuer = "https://idp.example.com"
    user = Principal.of_claims(issuer, {"sub": "alice"}, None)
    client = Principal.of_claims(issuer, {"client_id": "alice"}, None)
    both = Principal.of_claims(issuer, {"sub": "alice", "client_id": "app"}, None)
    assert user.owner != client.owner and user.subject != client.subject
    assert both.owner == user.owner
    # What earlier releases stored for a subject: users' tasks survive an upgrade.
    assert user.owner == digest("oauth", issuer, "alice")


def test_an_address_is_refused_once_it_spent_its_failures() -> None:
    clock = Clock()
    failures = FailedAuths(per_minute=3, clock=clock)
    for _ in range(3):
        failures.admit("10.0.0.1")
        failures.failed("10.0.0.1")
    with pytest.raises(TooManyFailures) as refused:
        failures.admit("10.0.0.1")
    assert refused.value.retry_after_s == pytest.approx(20)  # 3 a minute: one per 20 s
    failures.admit("10.0.0.2")  # another address has its own budget
    for i in range(3):  # an IPv6 host counts by its /64 (it holds all of it)
        failures.failed(f"2001:db8:1:2::{i + 1}")
    with pytest.raises(TooManyFailures):
        failures.admit("2001:db8:1:2:ffff::9")
    failures.admit("2001:db8:1:3::1")
    failures.admit(None)  # no peer address known (a unix socket): nothing to count
    clock.now += 20
    failures.admit("10.0.0.1")
    unlimited = FailedAuths(per_minute=0, clock=clock)
    for _ in range(1000):
        unlimited.failed("10.0.0.1")
    unlimited.admit("10.0.0.1")


def test_tokens_never_accept_none_or_hs_algorithms_however_the_settings_were_built() -> None:
    """from_mapping refuses `none` and HS*; settings built another way (an embedder, a test)
    still get only asymmetric algorithms."""
    from gateway.auth.fetch import Fetcher
    from gateway.auth.tokens import AccessTokens

    conf = OAuth(resource="https://gw.example.com/mcp", issuers=["https://idp.example.com"],
                 algorithms=["none", "HS256", "RS256"])
    assert AccessTokens(conf, Fetcher(1)).algorithms == {"RS256"}
