"""Checks of one key's value, which the schema names in its `Annotated` types (pydantic runs
them where it validates, so that an error names the key), and the loopback test they share
with the gateway (auth/keys.py, schema's properties).

Pure: no I/O, and pydantic_core is imported only when pydantic builds its validators (in the
process that validates, never in one that serves: gateway/settings/__init__.py).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

# Asymmetric signatures only: `none` is no signature, and an HS* key would be the issuer's
# public key used as a shared secret (the classic algorithm-confusion attack).
SIGNING_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384",
                      "ES512", "EdDSA")
MIN_TOKEN_CHARS = 32  # static tokens served beyond loopback (128 bits as hex)


class Rule:
    """A check of one key's value (`before`: a rewrite of it), run where pydantic validates,
    so that its error names that key."""

    __slots__ = ("before", "rule")

    def __init__(self, rule: Callable[[Any], Any], before: bool = False) -> None:
        self.rule, self.before = rule, before

    def __get_pydantic_core_schema__(self, source: Any, handler: Callable[[Any], Any]) -> Any:
        from pydantic_core import core_schema

        wrap = (core_schema.no_info_before_validator_function if self.before
                else core_schema.no_info_after_validator_function)
        return wrap(self.rule, handler(source))


class Matches:
    """A string key's regular expression (pydantic's own check and error wording)."""

    __slots__ = ("pattern",)

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern

    def __get_pydantic_core_schema__(self, source: Any, handler: Callable[[Any], Any]) -> Any:
        return {**handler(source), "pattern": self.pattern}


def none_if_empty(value: Any) -> Any:
    """A key left empty (`${HOSTNAME:-}` with the variable unset) reads as not given."""
    return None if value == "" else value


EmptyIsNull = Rule(none_if_empty, before=True)


def asymmetric(value: list[str]) -> list[str]:
    """JWT signature algorithms: asymmetric ones only (SIGNING_ALGORITHMS)."""
    for alg in value:
        if alg not in SIGNING_ALGORITHMS:
            raise ValueError(f"{alg!r} is not accepted: use asymmetric algorithms among "
                             f"{', '.join(SIGNING_ALGORITHMS)}")
    return value


def http_urls(value: list[str]) -> list[str]:
    for issuer in value:
        if not issuer.startswith(("https://", "http://")):
            raise ValueError(f"{issuer!r} is not an http(s) URL")
    return value


def host_names(value: list[str] | None) -> list[str] | None:
    """Host header values: a name or name:port, never a URL."""
    for host in value or ():
        if not host or "/" in host or "@" in host:
            raise ValueError(f"{host!r} is not a host name or host:port (no scheme, no path)")
    return value


def addresses(value: list[str]) -> list[str]:
    """IP addresses or CIDRs; an empty entry (`${VAR:-}` unset) is skipped."""
    for item in value:
        if item:
            try:
                ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise ValueError(f"{item!r} is not an IP address or CIDR") from None
    return value


def host_ports(value: list[str]) -> list[str]:
    for item in value:
        host, _, port = item.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"{item!r} is not host:port")
    return value


def transport_allowed(url: str, allow_http: bool) -> bool:
    """Whether credentials may go to `url`: https, plain http to a loopback host
    (127.0.0.0/8, ::1, localhost), or any http when the operator opted in."""
    scheme, _, rest = url.partition("://")
    if scheme.lower() == "https" or allow_http:
        return True
    host = urlsplit(f"http://{rest}").hostname or ""
    return scheme.lower() == "http" and loopback(host)


def loopback(host: str) -> bool:
    """Whether `host` is this machine: `localhost` or a loopback address (a name may
    resolve anywhere)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def http_url(value: str) -> str:
    """An http(s) URL with a host (a webhook's)."""
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL with a host: {value!r}")
    return value


def url_prefix(value: str) -> str:
    """An http(s) URL prefix: a scheme at least (`https://`), perhaps a host and a path."""
    if not value.startswith(("http://", "https://")):
        raise ValueError(f"not an http(s) URL prefix: {value!r}")
    return value


WEBHOOK_SECRET_BYTES = (24, 64)  # Standard Webhooks: a whsec_ secret of 24 to 64 bytes


def webhook_secret_bytes(text: str) -> bytes | None:
    """The key of a Standard Webhooks secret (`whsec_` and the base64 of 24 to 64 bytes);
    None when it is not one."""
    import base64
    import binascii

    if not text.startswith("whsec_"):
        return None
    try:
        raw = base64.b64decode(text.removeprefix("whsec_"), validate=True)
    except (binascii.Error, ValueError):
        return None
    low, high = WEBHOOK_SECRET_BYTES
    return raw if low <= len(raw) <= high else None


def webhook_secret(value: Any) -> Any:
    """A Standard Webhooks secret. The error never quotes it."""
    if webhook_secret_bytes(value.get_secret_value()) is None:
        low, high = WEBHOOK_SECRET_BYTES
        raise ValueError(f"a webhook secret is whsec_ and the base64 of {low}-{high} bytes "
                         "(e.g. whsec_$(head -c 32 /dev/urandom | base64))")
    return value
