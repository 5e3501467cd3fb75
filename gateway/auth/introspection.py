"""Opaque access tokens, checked by the authorization server (RFC 7662 introspection).

The answer is held to the same rules as a JWT's claims: active; the one issuer this
endpoint vouches for (`introspection.issuer`, else the first of `issuers`; an answer naming
another is refused: one endpoint must not speak for every issuer's users); this gateway in
`aud` (RFC 8707: the confused-deputy rule; a JWT must carry it, and so must an answer unless
`require_audience` is turned off); and not expired. The caller (`AccessTokens`) remembers
the result no longer than the token lives.
"""

from __future__ import annotations

import base64
import time
from typing import Any
from urllib.parse import quote_plus

from gateway.auth.fetch import Fetcher
from gateway.auth.principal import Principal
from gateway.errors import Unauthorized
from gateway.settings.schema import Introspection, OAuth

CACHE_S = 60.0


class Introspector:
    def __init__(self, conf: Introspection, oauth: OAuth, fetcher: Fetcher) -> None:
        self.url = conf.url
        self.auth = client_auth(conf.client_id, conf.client_secret.get_secret_value())
        self.issuer = conf.issuer or oauth.issuers[0]
        self.require_audience = conf.require_audience
        self.audience = {oauth.resource, oauth.resource.rstrip("/")}
        self.leeway_s = oauth.leeway_s
        self.fetcher = fetcher

    async def principal(self, token: str) -> Principal:
        answer = await self.fetcher.post_form(
            self.url, {"token": token, "token_type_hint": "access_token"}, self.auth)
        if answer.get("active") is not True:
            raise Unauthorized("Unauthorized: the token is not active", "inactive")
        issuer = answer.get("iss", self.issuer)
        if issuer != self.issuer:
            raise Unauthorized("Unauthorized: the token's issuer is not accepted", "issuer")
        if ("aud" in answer or self.require_audience) and \
                not self.audience & _listed(answer.get("aud")):
            raise Unauthorized("Unauthorized: the token was not issued for this resource",
                               "audience")
        exp = answer.get("exp")
        if isinstance(exp, int | float) and exp + self.leeway_s < time.time():
            raise Unauthorized("Unauthorized: the token has expired", "expired")
        # Remembered until the token expires, and no longer than a minute: a revoked token
        # is refused soon after.
        until = time.time() + CACHE_S
        return Principal.of_claims(issuer, answer,
                                   min(until, exp) if isinstance(exp, int | float) else until)


def client_auth(client_id: str, secret: str) -> str:
    """HTTP Basic client authentication as RFC 6749 section 2.3.1 has it: both parts
    form-urlencoded first (which HTTP Basic alone does not do)."""
    pair = f"{quote_plus(client_id)}:{quote_plus(secret)}"
    return "Basic " + base64.b64encode(pair.encode()).decode()


def _listed(aud: Any) -> set[str]:
    if isinstance(aud, str):
        return {aud}
    return {a for a in aud if isinstance(a, str)} if isinstance(aud, list) else set()


__all__ = ["Introspector"]
