"""gateway/settings/rules.py: the checks of one key's value, pure, called as functions (their
wording through a whole file is tests/unit/test_settings.py's)."""

from __future__ import annotations

import re

import pytest

from gateway.settings import rules


@pytest.mark.parametrize(("host", "loopback"), [
    ("localhost", True), ("127.0.0.1", True), ("127.9.9.9", True), ("::1", True),
    ("[::1]", True), ("0.0.0.0", False), ("10.0.0.1", False), ("::", False),
    ("localhost.example", False), ("gateway", False), ("", False)])
def test_loopback_is_this_machine_only(host: str, loopback: bool) -> None:
    assert rules.loopback(host) is loopback


@pytest.mark.parametrize(("url", "allow_http", "allowed"), [
    ("https://idp.example", False, True), ("HTTPS://idp.example", False, True),
    ("http://127.0.0.1:9000/jwks", False, True), ("http://[::1]/x", False, True),
    ("http://localhost/x", False, True), ("http://idp.example", False, False),
    ("http://idp.example", True, True), ("ftp://127.0.0.1/x", False, False),
    ("ftp://idp.example", True, True)])  # the opt-in takes the operator's word for it
def test_credentials_go_over_https_or_to_this_machine(url: str, allow_http: bool,
                                                      allowed: bool) -> None:
    assert rules.transport_allowed(url, allow_http) is allowed


@pytest.mark.parametrize(("rule", "good", "bad", "says"), [
    (rules.asymmetric, ["RS256", "EdDSA"], ["RS256", "HS256"], "'HS256' is not accepted"),
    (rules.http_urls, ["https://a", "http://b"], ["idp.example"], "is not an http(s) URL"),
    (rules.host_names, ["gw.example", "gw:8080", "[::1]"], ["https://gw"], "no scheme"),
    (rules.addresses, ["10.0.0.0/8", "::1", ""], ["10.0.0.0/33"], "not an IP address or CIDR"),
    (rules.host_ports, ["s1:26379", "[::1]:26379"], ["s1"], "'s1' is not host:port"),
])
def test_a_rule_returns_a_good_value_and_names_a_bad_one(rule, good, bad, says) -> None:
    assert rule(good) == good
    with pytest.raises(ValueError, match=re.escape(says)):
        rule(bad)


def test_host_names_may_be_left_out() -> None:
    assert rules.host_names(None) is None


def test_an_empty_value_reads_as_not_given() -> None:
    assert rules.none_if_empty("") is None
    assert rules.none_if_empty("gw-1") == "gw-1"
    assert rules.none_if_empty(0) == 0


def test_the_accepted_algorithms_are_asymmetric() -> None:
    assert not any(alg.startswith("HS") or alg == "none" for alg in rules.SIGNING_ALGORITHMS)
