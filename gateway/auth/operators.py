"""Who is an operator: who may read the operator's routes (/status, /metrics and
/readyz?detail), which show every owner's live tasks, tools and status messages.

Operators are named apart from MCP clients: by a token of `auth.admin_tokens`, or by an OAuth
access token carrying one of `auth.oauth.admin_scopes`. A client's valid credentials never
make it an operator. A peer on this machine is one only where nothing else can be: with no
auth configured at all, or on the operator listener of its own (`listen.operator_port`)
while no operator credential is configured. With client auth, a loopback peer is not an
operator by being one: a reverse proxy on the same host makes every client a loopback peer
(the HTTP boundary says which peers are local: downstream/peers.py).
"""

from __future__ import annotations

import hmac

from gateway.auth.authenticator import Authenticator, bearer_token
from gateway.errors import OperatorOnly, Unauthorized
from gateway.settings.schema import Auth


class Operators:
    def __init__(self, conf: Auth, auth: Authenticator, *, listener: bool = False) -> None:
        """`listener`: these are the operator listener's, not the gateway's port."""
        self.tokens = [t.encode() for t in conf.admin_tokens if t]
        self.scopes = conf.oauth.operator_scopes if conf.oauth else frozenset()
        self.named = conf.operators
        # Where a loopback peer is an operator: nobody can be one by a credential there.
        self.loopback = not self.named and (listener or not auth.enabled)
        self.auth = auth

    async def admit(self, header: str | None, local: bool) -> None:
        """Nothing when the caller is an operator (`local`: the peer is this machine,
        unproxied). Unauthorized (401) without a credential this gateway accepts;
        OperatorOnly (403) for a valid client's, or where only loopback peers may enter;
        AuthUnavailable (503) when an OAuth token cannot be checked now."""
        if self.loopback:
            if local:
                return
            raise OperatorOnly("Forbidden: operators' routes answer peers on this machine "
                               "only while no auth.admin_tokens or auth.oauth.admin_scopes "
                               "is configured")
        given = bearer_token(header).encode()  # Unauthorized ("missing") without one
        if any(hmac.compare_digest(given, t) for t in self.tokens):
            return
        if not self.auth.enabled:
            raise Unauthorized("Unauthorized: an operator's token is required", "wrong")
        principal = await self.auth.authenticate(header)  # Unauthorized unless valid
        if self.scopes & set(principal.scopes or ()):
            return
        raise OperatorOnly("Forbidden: this is an operator's route; a client's credentials "
                           "do not open it (an operator's are auth.admin_tokens or "
                           "auth.oauth.admin_scopes)")


__all__ = ["Operators"]
