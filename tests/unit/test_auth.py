"""gateway/auth/ pieces that need no server: where metadata lives, what challenges say,
what a principal lacks, and that a gateway without OAuth does not carry PyJWT."""

from __future__ import annotations

from conftest import loaded_by

from gateway.auth.keys import metadata_urls
from gateway.auth.principal import Principal, scopes_of
from gateway.auth.resource import ProtectedResource
from gateway.settings import OAuth


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
    code = ("from gateway.app import create_app; from gateway.settings import from_mapping; "
            "create_app(from_mapping({'upstreams': {'m': {'command': 'x'}}, "
            "'auth': {'bearer_tokens': ['t']}}))")
    assert loaded_by(code, ("jwt",)) == []
