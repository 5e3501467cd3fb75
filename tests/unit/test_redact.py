"""URLs as the gateway shows them (issue 29, item 5): without userinfo, query or fragment,
alone or inside an error's text."""

from __future__ import annotations

import pytest

from gateway import redact
from gateway.errors import StoreUnavailable, UpstreamConnectionFailed


@pytest.mark.parametrize(("given", "shown"), [
    ("https://user:pa55@api.example.com:8443/mcp?api_key=k#frag",
     "https://api.example.com:8443/mcp"),
    ("http://:only-password@host/", "http://host/"),
    ("http://a@b@host/p", "http://host/p"),  # userinfo is up to the last @
    ("http://host/mcp?token=x", "http://host/mcp"),
    ("http://host#section", "http://host"),
    ("http://user:pw@host?k=v", "http://host"),
    ("redis://:s3cret@redis.internal:6379/0", "redis://redis.internal:6379/0"),
    ("http://[::1]:8080/mcp?k=v", "http://[::1]:8080/mcp"),
    ("http://host/users/@me", "http://host/users/@me"),  # an @ in the path is no userinfo
    ("/relative?k=v", "/relative"),
])
def test_a_url_is_shown_without_userinfo_query_or_fragment(given: str, shown: str) -> None:
    assert redact.url(given) == shown


def test_urls_inside_text_are_shown_so() -> None:
    text = ("0, message='', url='http://gw:pw@127.0.0.1:9/mcp?api_key=k' then "
            "URL(\"https://u:p@h/x#f\") and <http://h/?q=1>; plain words stay")
    assert redact.text(text) == ("0, message='', url='http://127.0.0.1:9/mcp' then "
                                 "URL(\"https://h/x\") and <http://h/>; plain words stay")


def test_upstream_errors_never_carry_a_url() -> None:
    """Not its credentials, nor where it is: clients read the upstream's name."""
    error = UpstreamConnectionFailed("main", "upstream 'main': url='http://u:pw@h/mcp?api_key=k'")
    assert error.message == "upstream 'main': url='<url>'"
    assert "pw" not in str(error.to_message(1)) and "h/mcp" not in str(error.to_message(1))


def test_store_errors_never_carry_credentials() -> None:
    error = StoreUnavailable("Error connecting to redis://:pw@store:6379/0?x=1")
    assert "pw" not in error.message and "store" not in error.message.lower().replace(
        "task store", "")  # nor where the store is: that is for the operator's log
    assert "pw" not in error.detail and "store:6379/0" in error.detail
