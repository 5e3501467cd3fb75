"""A request's `Authorization` header to a `Principal`: a static bearer token (compared in
constant time; the token's digest is its owner), else an OAuth access token (its issuer and
subject are the owner, see tokens.py). With neither configured every caller is one
anonymous owner (docs/security.md: bind to loopback then).

With a shared store, owners are written where the store's operator reads them: there an
owner is a keyed digest (HMAC with the owner-digest key of replica.secret, keyring.py), so
that no one can try candidate tokens or subjects against it offline.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from gateway.auth.fetch import Fetcher
from gateway.auth.principal import ANONYMOUS, Principal
from gateway.auth.resource import ProtectedResource
from gateway.auth.token_exchange import TokenExchanger
from gateway.errors import Unauthorized
from gateway.keyring import keyed_digest
from gateway.observability import owner_hash
from gateway.settings.schema import Auth, TokenExchange

if TYPE_CHECKING:
    from gateway.auth.tokens import AccessTokens


@dataclass(frozen=True, slots=True)
class Named:
    """A named static token's principal: its name, its scopes (None: every one) and the
    owner its calls and tasks are counted under."""

    name: str
    scopes: frozenset[str] | None
    owner: str


class Authenticator:
    def __init__(self, conf: Auth, tool_scopes: frozenset[str] = frozenset(),
                 owner_key: bytes | None = None) -> None:
        self.enabled = conf.enabled
        self.owner_key = owner_key  # None: owners as plain digests (nothing shares them)
        # Each static token, and what its principal carries: its scopes (None: every one)
        # and its name (audit events' `subject`).
        self.static = [(t.token.encode(), None if t.scopes is None else frozenset(t.scopes),
                        t.name) for t in conf.static_tokens if t.token]
        oauth = conf.oauth
        self.fetcher = Fetcher(oauth.fetch_timeout_ms / 1000 if oauth else 5.0)
        self.tokens: AccessTokens | None = None
        if oauth is not None:
            # Imported here: PyJWT's asymmetric algorithms load parts of OpenSSL that cost
            # ~9 MiB resident, which a gateway without OAuth should not carry.
            from gateway.auth.tokens import AccessTokens
            self.tokens = AccessTokens(oauth, self.fetcher)
        self.resource = ProtectedResource(oauth, tool_scopes) if oauth else None
        self.required = frozenset(oauth.scopes) if oauth else frozenset()

    async def authenticate(self, header: str | None) -> Principal:
        """Unauthorized (401) or AuthUnavailable (503) unless the header carries a
        credential this gateway accepts. The scopes every request needs (`required`) are the
        guard's to check, once it has recorded who called."""
        if not self.enabled:
            return ANONYMOUS
        token = bearer_token(header)
        given = token.encode()
        # Every one compared (constant time), whichever matches: no early exit to time.
        matched = [(scopes, name) for t, scopes, name in self.static
                   if hmac.compare_digest(given, t)]
        if matched:
            scopes, name = matched[0]
            return Principal(self._static_owner(token), scopes, subject=name)
        if self.tokens is None:
            raise Unauthorized("Unauthorized: a valid bearer token is required", "wrong")
        principal = await self.tokens.principal(token)
        if self.owner_key is None:
            return principal
        return replace(principal, owner=keyed_digest(self.owner_key, principal.owner))

    def _static_owner(self, token: str) -> str:
        """A static token's owner. Without a key: the digest of the header as earlier
        releases took it: tasks stored by them keep their owner across an upgrade."""
        header = f"Bearer {token}"
        return keyed_digest(self.owner_key, header) if self.owner_key is not None \
            else owner_hash(header)

    def named(self) -> list[Named]:
        """The static tokens given a name, as operator pages show them (issue 53: the name
        labels the principal; the token is never shown)."""
        return [Named(name, scopes, self._static_owner(token.decode()))
                for token, scopes, name in self.static if name is not None]

    def exchanger(self, conf: TokenExchange | None) -> TokenExchanger | None:
        """An upstream's token exchange, sharing this authenticator's HTTP client."""
        return None if conf is None else TokenExchanger(conf, self.fetcher)

    async def close(self) -> None:
        await self.fetcher.close()


def bearer_token(header: str | None) -> str:
    """The token of an `Authorization: Bearer ...` header; Unauthorized when there is none."""
    if not header:
        raise Unauthorized("Unauthorized: a valid bearer token is required", "missing")
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Unauthorized("Unauthorized: send the token as 'Authorization: Bearer ...'",
                           "malformed")
    return token


__all__ = ["Authenticator", "bearer_token"]
