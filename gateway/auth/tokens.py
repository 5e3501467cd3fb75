"""OAuth access tokens to `Principal`s: JWTs checked against their issuer's keys (PyJWT does
the cryptography and the claim rules), opaque tokens by RFC 7662 introspection. A checked
token is remembered (bounded) until it expires, at most `MAX_CACHE_S`, so a client's
requests after the first cost a hash and a lookup. A refused one is remembered too, for
`REFUSED_CACHE_S` (bounded): the same bogus token sent again is refused the same way without
asking the authorization server again (an introspection call per request otherwise). An
authorization server that could not be asked (AuthUnavailable) is never remembered.

The rules (MCP authorization spec, Access Token Privilege Restriction and Token Audience
Binding; RFC 8725 JWT best practices):
- only asymmetric algorithms of `auth.oauth.algorithms` (never `none`, never HS*);
- `iss` one of `auth.oauth.issuers`, the key from that issuer's published set;
- `aud` names this gateway (`auth.oauth.resource`, RFC 8707): a token minted for another
  resource is refused, so the gateway is never a confused deputy;
- `exp` required, `exp` and `nbf` with `leeway_s`;
- with `require_at_jwt`, the header's `typ` is `at+jwt` (RFC 9068 section 4: an ID token
  or another JWT the issuer signs is not an access token).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import replace

import jwt
from cachetools import TLRUCache, TTLCache

from gateway.auth.fetch import Fetcher
from gateway.auth.introspection import Introspector
from gateway.auth.keys import IssuerKeys
from gateway.auth.principal import Principal
from gateway.errors import AuthCause, Unauthorized, shown
from gateway.settings.rules import SIGNING_ALGORITHMS
from gateway.settings.schema import OAuth

MAX_CACHE_S = 300.0
REFUSED_CACHE_S = 10.0  # a refused token is refused again without a check this long
REFUSED_CACHED = 10_000
# Refusals that time or a key rotation may mend soon: never remembered (an unknown key is
# bounded by `key_refresh_s` already).
UNREMEMBERED: frozenset[AuthCause] = frozenset({"unknown_key", "not_yet_valid"})
# RFC 9068 section 4: "at+jwt", or the full media type (compared without case, RFC 7515 4.1.9).
AT_JWT = frozenset({"at+jwt", "application/at+jwt"})

# PyJWT's refusals, by what they mean to the caller (the audit `cause`).
_CAUSES: tuple[tuple[type[Exception], AuthCause, str], ...] = (
    (jwt.ExpiredSignatureError, "expired", "the token has expired"),
    (jwt.ImmatureSignatureError, "not_yet_valid", "the token is not valid yet"),
    (jwt.InvalidAudienceError, "audience", "the token was not issued for this resource"),
    (jwt.InvalidIssuerError, "issuer", "the token's issuer is not accepted"),
    (jwt.InvalidSignatureError, "signature", "the token's signature does not verify"),
    (jwt.MissingRequiredClaimError, "claims", "the token lacks a required claim"),
    (jwt.InvalidAlgorithmError, "algorithm", "the token's algorithm is not accepted"),
    (jwt.InvalidTokenError, "malformed", "the token is not a well-formed JWT"),
)


class AccessTokens:
    def __init__(self, conf: OAuth, fetcher: Fetcher) -> None:
        self.conf = conf
        self.issuers = {i: IssuerKeys(i, fetcher, conf.key_refresh_s, conf.allow_http)
                        for i in conf.issuers}
        # Never `none` nor HS*, whatever built the settings (from_mapping refuses them too).
        self.algorithms = frozenset(conf.algorithms) & frozenset(SIGNING_ALGORITHMS)
        self.audience = sorted({conf.resource, conf.resource.rstrip("/")})
        self.introspector = (Introspector(conf.introspection, conf, fetcher)
                             if conf.introspection is not None else None)
        self._cache: TLRUCache[bytes, Principal] | None = (
            TLRUCache(conf.cache_tokens, _lifetime, time.time) if conf.cache_tokens else None)
        # token digest -> (message, cause) of its refusal
        self._refused: TTLCache[bytes, tuple[str, AuthCause]] = TTLCache(
            REFUSED_CACHED, REFUSED_CACHE_S)

    async def principal(self, token: str) -> Principal:
        """The principal `token` stands for; Unauthorized (401) when it is not valid here,
        AuthUnavailable (503) when its issuer cannot be asked."""
        key = hashlib.sha256(token.encode()).digest()
        if self._cache is not None and (known := self._cache.get(key)) is not None:
            return known
        if (refused := self._refused.get(key)) is not None:
            raise Unauthorized(*refused)
        try:
            found = await self._check(token)
        except Unauthorized as exc:
            if exc.cause not in UNREMEMBERED:
                self._refused[key] = (exc.message, exc.cause)
            raise
        found = replace(found, token=token)
        if self._cache is not None:
            self._cache[key] = found
        return found

    async def _check(self, token: str) -> Principal:
        if token.count(".") == 2:
            return await self._jwt(token)
        if self.introspector is not None:
            return await self.introspector.principal(token)
        raise Unauthorized("Unauthorized: the access token is not a JWT", "malformed")

    async def _jwt(self, token: str) -> Principal:
        try:  # parsed once unchecked, for what picks the key; then checked with it
            unverified = jwt.decode_complete(token, options={"verify_signature": False})
        except jwt.InvalidTokenError:
            raise Unauthorized("Unauthorized: the token is not a well-formed JWT",
                               "malformed") from None
        header, payload = unverified["header"], unverified["payload"]
        alg, kid = header.get("alg"), header.get("kid")
        issuer = payload.get("iss") if isinstance(payload, dict) else None
        if alg not in self.algorithms:
            raise Unauthorized(f"Unauthorized: the token's algorithm {shown(alg)} is "
                               "not accepted", "algorithm")
        typ = header.get("typ")
        if self.conf.require_at_jwt and not (isinstance(typ, str) and typ.lower() in AT_JWT):
            raise Unauthorized("Unauthorized: the token is not an access token (its typ "
                               "must be at+jwt)", "typ")
        if not isinstance(issuer, str) or (keys := self.issuers.get(issuer)) is None:
            raise Unauthorized("Unauthorized: the token's issuer is not accepted", "issuer")
        key = await keys.key(kid if isinstance(kid, str) else None, alg)
        try:
            claims = jwt.decode(token, key, algorithms=[alg], audience=self.audience,
                                issuer=issuer, leeway=self.conf.leeway_s,
                                options={"require": ["exp", "iss", "aud"]})
        except jwt.InvalidTokenError as exc:
            raise _refusal(exc) from None
        exp = claims.get("exp")
        return Principal.of_claims(issuer, claims,
                                   float(exp) if isinstance(exp, int | float) else None)


def _refusal(exc: Exception) -> Unauthorized:
    for kind, cause, text in _CAUSES:
        if isinstance(exc, kind):
            return Unauthorized(f"Unauthorized: {text}", cause)
    return Unauthorized("Unauthorized: the token is not valid", "malformed")


def _lifetime(_key: bytes, principal: Principal, now: float) -> float:
    """A checked token is remembered until it expires, and never longer than MAX_CACHE_S."""
    until = now + MAX_CACHE_S
    return until if principal.expires_at is None else min(until, principal.expires_at)


__all__ = ["AccessTokens"]
