"""Who is an operator: who may read the operator's routes (/status, /metrics and
/readyz?detail), which show every owner's live tasks, tools and status messages.

Operators are named apart from MCP clients: by a token of `auth.admin_tokens`, or by an OAuth
access token carrying `auth.oauth.admin_scope`. A client's valid credentials never make it
an operator. With neither configured, the peers on this machine are (the HTTP boundary says
which those are: downstream/peers.py).
"""

from __future__ import annotations

import hmac

from gateway.auth.authenticator import Authenticator, bearer_token
from gateway.errors import OperatorOnly, Unauthorized
from gateway.settings import Auth


class Operators:
    def __init__(self, conf: Auth, auth: Authenticator) -> None:
        self.tokens = [t.encode() for t in conf.admin_tokens if t]
        self.scope = conf.oauth.admin_scope if conf.oauth else None
        self.named = conf.operators
        self.auth = auth

    async def admit(self, header: str | None, local: bool) -> None:
        """Nothing when the caller is an operator. Unauthorized (401) without a credential
        this gateway accepts; OperatorOnly (403) for a valid client's; AuthUnavailable (503)
        when an OAuth token cannot be checked now."""
        if not self.named:
            if local:
                return
            raise OperatorOnly("Forbidden: operators' routes answer peers on this machine "
                               "only while no auth.admin_tokens or auth.oauth.admin_scope "
                               "is configured")
        given = bearer_token(header).encode()
        if any(hmac.compare_digest(given, t) for t in self.tokens):
            return
        if not self.auth.enabled:
            raise Unauthorized("Unauthorized: an operator's token is required", "wrong")
        principal = await self.auth.authenticate(header)  # Unauthorized unless valid
        if self.scope is not None and self.scope in (principal.scopes or ()):
            return
        raise OperatorOnly("Forbidden: this is an operator's route; a client's credentials "
                           "do not open it")


__all__ = ["Operators"]
