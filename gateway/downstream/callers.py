"""Who a request's credentials name, recorded on the request for the rest of its path: a
client's principal (gateway/auth/; for a request another replica relayed, the one that
replica vouches for), held to the scopes every request needs; or an operator, on the
operators' routes (auth/operators.py). Refusals are raised as the `AuthRefusal` that names
them; the guard answers them.
"""

from __future__ import annotations

from aiohttp import web

from gateway import errors
from gateway.auth import Authenticator, Principal
from gateway.auth.operators import Operators
from gateway.auth.replicas import ReplicaSeals, binding
from gateway.downstream.boundary import OPERATOR, PRINCIPAL, RELAYED_BODY
from gateway.downstream.peers import local_peer
from gateway.protocol import mcp


class Callers:
    def __init__(self, auth: Authenticator, operators: Operators,
                 seals: ReplicaSeals | None = None) -> None:
        """`seals`: what another replica vouches for on a relayed retry."""
        self.auth = auth
        self.operators = operators
        self.seals = seals or ReplicaSeals(None)

    async def identify(self, request: web.Request) -> None:
        """Records the client's principal (`PRINCIPAL`) before its scopes are checked, so
        that a refusal's audit event names who. Unauthorized (401), AuthUnavailable (503),
        InsufficientScope (403) for a token without a scope every request needs."""
        relayed = request.headers.get(mcp.H_RELAYED)
        if relayed is None:
            principal = await self.auth.authenticate(request.headers.get(mcp.H_AUTH))
        else:
            principal = self._vouched(request, relayed)
        request[PRINCIPAL] = principal
        if lacking := principal.lacks(self.auth.required):
            raise errors.InsufficientScope("this resource", lacking)

    def _vouched(self, request: web.Request, seal: str) -> Principal:
        """The principal another replica vouches for on a request it relayed (handoff.py)
        with the replicas' secret (auth/replicas.py; a relayed request carries no client
        credential); the digest of the body it vouches for is kept for `read_message`."""
        if request.method != "POST" or mcp.H_SESSION in request.headers:
            # A relay is a modern retry (handoff.py): a POST, of no session; the body digest
            # it is sealed with is checked when a POST's body is read.
            raise errors.Unauthorized("Unauthorized: a replica seal vouches for a relayed "
                                      "POST of no session only", "wrong")
        vouched = self.seals.open(seal, binding(request.path, request.headers))
        if vouched is None:
            raise errors.Unauthorized("Unauthorized: a relayed request whose replica seal "
                                      "does not open (forged, stale, or used already)",
                                      "wrong")
        request[RELAYED_BODY] = vouched.body
        return vouched.principal

    async def operator(self, request: web.Request) -> None:
        """Records that an operator calls (`OPERATOR`). Unauthorized (401), OperatorOnly
        (403) or AuthUnavailable (503) when none does (auth/operators.py)."""
        await self.operators.admit(request.headers.get(mcp.H_AUTH), local_peer(request))
        request[OPERATOR] = True


__all__ = ["Callers"]
