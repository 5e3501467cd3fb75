"""RFC 8693 token exchange for upstreams that need the caller's identity: the caller's access
token (checked, see tokens.py) is traded at the authorization server for one meant for the
upstream, so the caller's own token never leaves the gateway (MCP authorization spec:
token passthrough is forbidden). Exchanged tokens are kept until they expire (bounded).
"""

from __future__ import annotations

import hashlib
import time

from cachetools import TLRUCache

from gateway.auth.fetch import Fetcher, unavailable
from gateway.auth.introspection import client_auth
from gateway.settings.schema import TokenExchange

GRANT = "urn:ietf:params:oauth:grant-type:token-exchange"
ACCESS_TOKEN = "urn:ietf:params:oauth:token-type:access_token"
CACHED = 10_000
EXPIRY_MARGIN_S = 10.0  # an exchanged token is traded again this long before it expires
DEFAULT_LIFETIME_S = 60.0  # when the server does not say how long it lives


class TokenExchanger:
    def __init__(self, conf: TokenExchange, fetcher: Fetcher) -> None:
        self.conf = conf
        self.fetcher = fetcher
        self.auth = client_auth(conf.client_id, conf.client_secret.get_secret_value())
        self._cache: TLRUCache[bytes, tuple[str, float]] = TLRUCache(
            CACHED, lambda _k, v, _now: v[1], time.time)

    async def token_for(self, subject_token: str) -> str:
        """The upstream's token for the caller whose access token is `subject_token`;
        AuthUnavailable (503) when the server does not trade it."""
        key = hashlib.sha256(subject_token.encode()).digest()
        if (known := self._cache.get(key)) is not None:
            return known[0]
        form = {"grant_type": GRANT, "subject_token": subject_token,
                "subject_token_type": ACCESS_TOKEN, "requested_token_type": ACCESS_TOKEN}
        if self.conf.audience:
            form["audience"] = self.conf.audience
        if self.conf.scope:
            form["scope"] = self.conf.scope
        answer = await self.fetcher.post_form(self.conf.url, form, self.auth)
        token, lifetime = answer.get("access_token"), answer.get("expires_in")
        if not isinstance(token, str) or not token:
            raise unavailable(self.conf.url, "no access_token in the exchange's answer")
        seconds = float(lifetime) if isinstance(lifetime, int | float) else DEFAULT_LIFETIME_S
        self._cache[key] = (token, time.time() + seconds - EXPIRY_MARGIN_S)
        return token


__all__ = ["TokenExchanger"]
