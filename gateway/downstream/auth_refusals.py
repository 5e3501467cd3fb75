"""What a refused authentication costs its client and leaves behind: the failed-auth limit of
the client's address (auth/throttle.py; behind a trusted proxy, the client it names:
peers.py), the audit event, and the 401/403 challenge (auth/resource.py).

An audit event says why, and who where known (issuer, hashed subject); never what was sent
(it may be a near-miss token).
"""

from __future__ import annotations

from aiohttp import web

from gateway import errors
from gateway.auth.resource import ProtectedResource, scope_challenge
from gateway.auth.throttle import FailedAuths
from gateway.downstream.boundary import PRINCIPAL
from gateway.downstream.peers import Clients
from gateway.observability import log


class AuthRefusals:
    def __init__(self, limit: FailedAuths, clients: Clients,
                 resource: ProtectedResource | None) -> None:
        """`resource`: the protected resource the challenges point to (OAuth); None for
        static tokens only."""
        self.limit = limit
        self.clients = clients
        self.resource = resource

    def admit(self, request: web.Request) -> None:
        """Nothing while the client's address may try its credentials; TooManyFailures
        (429) once it spent its failures."""
        self.limit.admit(self.clients.address(request))

    def noted(self, request: web.Request, refusal: errors.AuthRefusal) -> None:
        """What `refusal` leaves behind before it is answered. A wrong credential is charged
        to the client's address; a request that sent none guessed nothing: clients start
        that way (it is how they find the metadata), so it takes nothing. A throttled or
        operator-only request is audited now; the 401s and scope 403s are audited with their
        challenge (`challenge`), and AuthUnavailable is the gateway's fault, not audited."""
        if isinstance(refusal, errors.Unauthorized):
            if refusal.cause != "missing":
                self.limit.failed(self.clients.address(request))
        elif isinstance(refusal, errors.TooManyFailures | errors.OperatorOnly):
            self.audit(request, refusal)

    def challenge(self, request: web.Request, response: web.StreamResponse,
                  fault: errors.AuthRefusal) -> None:
        """`response`'s WWW-Authenticate for an authentication or scope failure, and the
        failure's audit event."""
        response.headers["WWW-Authenticate"] = self._challenge(request.path, fault)
        self.audit(request, fault)

    def _challenge(self, path: str, fault: errors.AuthRefusal) -> str:
        if self.resource is None:  # static tokens only: no metadata to point to
            if isinstance(fault, errors.InsufficientScope):
                return scope_challenge(fault.scopes)  # a scoped token: what it lacks
            return "Bearer"
        if isinstance(fault, errors.InsufficientScope):
            return self.resource.insufficient_scope(path, fault.scopes, fault.message)
        return self.resource.unauthorized(path, fault.cause, fault.message)

    def audit(self, request: web.Request, fault: errors.AuthRefusal) -> None:
        who = request.get(PRINCIPAL)
        log.warning("auth.failed", audit=True, path=request.path,
                    remote=self.clients.address(request),
                    reason=fault.cause,
                    issuer=who.issuer if who else None, subject=who.subject if who else None)


__all__ = ["AuthRefusals"]
