"""`Principal`: what one authenticated request is, as far as the rest of the gateway cares.

The owner is a digest, never a credential: it is stored in the shared store and shown (cut
short) in logs. An OAuth principal is its (issuer, subject), so every token that principal
is issued, refreshed ones included, owns the same tasks (issue: tasks outlive a refresh).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from gateway.errors import Unauthorized


def digest(*parts: str) -> str:
    """A stable 128-bit digest of `parts`, unambiguous (NUL never occurs in them)."""
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class Principal:
    owner: str  # what tasks, sessions and calls belong to
    # The scopes the credential carries; None: not scoped (a static token, or no auth):
    # every tool is open to it.
    scopes: frozenset[str] | None = None
    issuer: str | None = None
    subject: str | None = None  # a digest of the subject, for audit events
    expires_at: float | None = None  # epoch seconds; caches keep it no longer
    # The OAuth access token itself, only to exchange it for an upstream's (RFC 8693); never
    # shown, never compared, never forwarded.
    token: str | None = field(default=None, repr=False, compare=False)

    def lacks(self, needed: frozenset[str]) -> frozenset[str]:
        """The scopes of `needed` this principal does not hold."""
        if self.scopes is None or not needed:
            return frozenset()
        return needed - self.scopes

    @classmethod
    def of_claims(cls, issuer: str, claims: dict[str, Any], expires_at: float | None
                  ) -> Principal:
        """The principal a checked token's claims (a JWT's, or an introspection answer)
        name: its subject, or for a client-credentials token without one, its client.

        Subjects and client ids are different namespaces (RFC 7662 section 2.2: `sub` is
        the resource owner, `client_id` the client): a client named like a user must not
        own that user's tasks, so a client stands in a namespace of its own. A subject's
        digest is the one earlier releases stored: users' tasks survive an upgrade."""
        subject, client = claims.get("sub"), claims.get("client_id")
        if isinstance(subject, str) and subject:
            owner, shown = digest("oauth", issuer, subject), digest("subject", issuer, subject)
        elif isinstance(client, str) and client:
            owner, shown = digest("oauth-client", issuer, client), digest("client", issuer,
                                                                          client)
        else:
            raise Unauthorized("Unauthorized: the token names no subject", "claims")
        return cls(owner, scopes_of(claims), issuer, shown[:12], expires_at)


def scopes_of(claims: dict[str, Any]) -> frozenset[str]:
    """RFC 9068 / RFC 7662: `scope` is a space-separated string; some issuers send `scp`,
    a list."""
    scope = claims.get("scope")
    if isinstance(scope, str):
        return frozenset(scope.split())
    scp = claims.get("scp")
    if isinstance(scp, list):
        return frozenset(s for s in scp if isinstance(s, str))
    return frozenset()


ANONYMOUS = Principal("anonymous")

__all__ = ["ANONYMOUS", "Principal", "digest", "scopes_of"]
