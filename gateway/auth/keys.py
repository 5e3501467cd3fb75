"""One issuer's signing keys: found through its metadata (RFC 8414, else OIDC discovery),
fetched from its `jwks_uri`, kept, and fetched again when they age or a token names a key
id not among them (at most every `key_refresh_s`, a second at least: a stream of made-up key
ids cannot make the gateway hammer the issuer). The key set is bounded; one fetch runs at a
time. A discovered `jwks_uri` is held to the issuers' rule: https, or http to loopback
only, unless `allow_http` (keys fetched in clear can be swapped on the way).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import jwt
from yarl import URL

from gateway.auth.fetch import Fetcher, unavailable
from gateway.errors import AuthUnavailable, Unauthorized
from gateway.settings.rules import transport_allowed

MAX_AGE_S = 3600.0  # known keys are fetched again this often (rotation without a restart)
RETRY_AFTER_FAILURE_S = 1.0  # a failed fetch answers at once for this long, then retries
MAX_KEYS = 64


def metadata_urls(issuer: str) -> list[str]:
    """RFC 8414 section 3.1 (well-known between host and path), then OIDC Discovery 1.0
    (appended to the issuer)."""
    url = URL(issuer)
    path = url.path.rstrip("/")
    root = url.with_path("/").with_query(None)
    return [str(root.with_path(f"/.well-known/oauth-authorization-server{path}")),
            f"{issuer.rstrip('/')}/.well-known/openid-configuration"]


class IssuerKeys:
    def __init__(self, issuer: str, fetcher: Fetcher, refresh_s: float,
                 allow_http: bool = False) -> None:
        self.issuer = issuer
        self.fetcher = fetcher
        self.refresh_s = refresh_s
        self.allow_http = allow_http
        self.jwks_uri: str | None = None
        self.keys: dict[str | None, dict[str, Any]] = {}  # kid -> JWK
        self.fetched_at = -float("inf")
        self.failed_at = -float("inf")
        self._built: dict[tuple[str | None, str], jwt.PyJWK] = {}
        self._lock = asyncio.Lock()

    async def key(self, kid: str | None, alg: str) -> jwt.PyJWK:
        """The key that signed a token with header `kid`/`alg`: Unauthorized when the issuer
        does not publish it, AuthUnavailable when the issuer cannot be asked."""
        now = time.monotonic()
        fetched = True
        if now - self.fetched_at > MAX_AGE_S or (
                self._find(kid) is None and now - self.fetched_at >= self.refresh_s):
            fetched = await self._refresh()
        jwk = self._find(kid)
        if jwk is None:
            if not fetched:  # perhaps a new key: the issuer's fault, not the caller's
                raise AuthUnavailable()  # the failed fetch was logged, with its URL
            raise Unauthorized("Unauthorized: the token is signed with a key its issuer does "
                               "not publish", "unknown_key")
        return self._built.get((kid, alg)) or self._build(kid, alg, jwk)

    def _build(self, kid: str | None, alg: str, jwk: dict[str, Any]) -> jwt.PyJWK:
        try:
            built = jwt.PyJWK(jwk, algorithm=alg)
        except (jwt.PyJWKError, jwt.InvalidKeyError):
            raise Unauthorized(f"Unauthorized: the token's algorithm {alg} does not fit its "
                               "key", "algorithm") from None
        if built.algorithm_name != alg:  # the JWK names its own algorithm: it wins
            raise Unauthorized(f"Unauthorized: the token's algorithm {alg} is not its key's",
                               "algorithm")
        self._built[kid, alg] = built
        return built

    def _find(self, kid: str | None) -> dict[str, Any] | None:
        if kid is not None or len(self.keys) != 1:
            return self.keys.get(kid) if kid is not None else None
        return next(iter(self.keys.values()))  # no kid, one key: that one (RFC 7517 4.5)

    async def _refresh(self) -> bool:
        """Fetch the keys again (once, whoever else asks meanwhile); False if that failed
        (the keys held so far stay usable while the issuer is away)."""
        asked = time.monotonic()
        async with self._lock:
            if self.fetched_at >= asked:
                return True  # fetched while this one waited
            if time.monotonic() - self.failed_at < RETRY_AFTER_FAILURE_S:
                return False
            try:
                await self._fetch()
            except AuthUnavailable:
                self.failed_at = time.monotonic()
                return False
            return True

    async def _fetch(self) -> None:
        if self.jwks_uri is None:
            self.jwks_uri = await self._discover()
        doc = await self.fetcher.get(self.jwks_uri)
        found = doc.get("keys")
        if not isinstance(found, list):
            raise unavailable(self.jwks_uri, "not a JWK set")
        keys = {k.get("kid"): k for k in found[:MAX_KEYS]
                if isinstance(k, dict) and k.get("use", "sig") == "sig"
                and isinstance(k.get("kty"), str)}
        self.keys, self._built = keys, {}
        self.fetched_at = time.monotonic()

    async def _discover(self) -> str:
        for url in metadata_urls(self.issuer):
            try:
                meta = await self.fetcher.get(url)
            except AuthUnavailable:
                continue
            # RFC 8414 3.3: the metadata's issuer MUST be the one it was found for.
            jwks_uri = meta.get("jwks_uri")
            if meta.get("issuer") != self.issuer or not isinstance(jwks_uri, str) or \
                    not jwks_uri.startswith(("https://", "http://")):
                unavailable(url, f"not metadata of {self.issuer} with a jwks_uri")
                continue
            if not transport_allowed(jwks_uri, self.allow_http):
                unavailable(url, "its jwks_uri is plain http beyond loopback "
                                 "(auth.oauth.allow_http)")
                continue
            return jwks_uri
        raise AuthUnavailable()  # each URL's failure was logged, with its reason


__all__ = ["IssuerKeys", "metadata_urls"]
