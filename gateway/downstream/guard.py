"""The guard in front of every route: it picks the door a request takes and runs that door's
checks in order, answers each refusal once, and adds what every response carries. The
checks are its parts': the screen before credentials (screen.py: Host, header bytes,
Content-Encoding, Origin, CORS preflight), the failed-auth limit (auth_refusals.py), the
credentials (callers.py); the CORS headers are origins.py's, the challenges and audit events
auth_refusals.py's.

Doors: health probes and the protected resource metadata are open (public, whatever Host a
prober sends); the operators' routes admit operators alone; every other route a client
whose credentials pass. The app has no middleware (docs/architecture.md, The request path):
each route is registered behind `wrap`, but the MCP endpoints' POST, whose one handler calls
`caller` itself.
"""

from __future__ import annotations

from aiohttp import web

from gateway import errors
from gateway.auth import Authenticator
from gateway.auth.operators import Operators
from gateway.auth.replicas import ReplicaSeals
from gateway.auth.resource import WELL_KNOWN
from gateway.auth.throttle import FailedAuths
from gateway.downstream.auth_refusals import AuthRefusals
from gateway.downstream.boundary import AUTH_FAULT, Handler, error_response, said
from gateway.downstream.callers import Callers
from gateway.downstream.origins import Origins
from gateway.downstream.peers import Clients, Hosts
from gateway.downstream.screen import Screen
from gateway.errors import GatewayError
from gateway.observability.counters import Counters
from gateway.protocol import mcp
from gateway.settings.schema import Settings

OPEN_PATHS = frozenset({"/healthz"})  # and /readyz but for its detail: `is_open`
# The operators' routes; /readyz is one only when its detail is asked for (`?detail`).
OPERATOR_PATHS = frozenset({"/status", "/metrics"})


def is_open(request: web.Request) -> bool:
    if request.path == "/readyz":
        return "detail" not in request.query
    return request.path in OPEN_PATHS or request.path.startswith(WELL_KNOWN)


def for_operators(request: web.Request) -> bool:
    return request.path in OPERATOR_PATHS or request.path == "/readyz"


class Guard:
    def __init__(self, screen: Screen, callers: Callers, refusals: AuthRefusals,
                 counters: Counters) -> None:
        self.screen = screen
        self.origins = screen.origins
        self.callers = callers
        self.refusals = refusals
        self.counters = counters

    @classmethod
    def of(cls, conf: Settings, counters: Counters, auth: Authenticator,
           seals: ReplicaSeals | None = None, *, listener: bool = False,
           refusals: AuthRefusals | None = None) -> Guard:
        """The guard `conf` describes. `seals`: what another replica vouches for on a
        relayed retry; `listener`: the guard of the operator listener
        (`listen.operator_port`), which serves any IP address as a Host and whose loopback
        peers may be operators (auth/operators.py); `refusals`: another guard's, to share
        its failed-auth limit."""
        hosts = Hosts(conf.operator_hosts, addresses=True) if listener else \
            Hosts(conf.allowed_hosts)
        screen = Screen(hosts, Origins(conf.security.allowed_origins))
        callers = Callers(auth, Operators(conf.auth, auth, listener=listener), seals)
        refusals = refusals or AuthRefusals(FailedAuths(conf.auth.failures_per_minute),
                                            Clients(conf.security.trusted_proxies),
                                            auth.resource)
        return cls(screen, callers, refusals, counters)

    def for_listener(self, conf: Settings) -> Guard:
        """The operator listener's guard: one failed-auth limit a client, whichever port."""
        return Guard.of(conf, self.counters, self.callers.auth, listener=True,
                        refusals=self.refusals)

    def wrap(self, handler: Handler) -> Handler:
        """`handler` behind the guard."""
        async def guarded(request: web.Request) -> web.StreamResponse:
            refused = await self.admit(request)
            return refused if refused is not None else await handler(request)
        return guarded

    async def admit(self, request: web.Request) -> web.StreamResponse | None:
        """None when the request may go on to its route; else the answer it gets."""
        if is_open(request):
            return None
        if for_operators(request):
            return self._screened(request) or await self._operator(request)
        return await self.caller(request)

    async def caller(self, request: web.Request) -> web.StreamResponse | None:
        """A client's request to an MCP endpoint: None once the screen, the failed-auth
        limit and its credentials pass (its principal recorded); else the refusal (or a
        CORS preflight's answer) it gets. The one guard call of every POST: no step here
        that the checks do not need."""
        try:
            if (preflight := self.screen.check(request)) is not None:
                return preflight
            self.refusals.admit(request)
            await self.callers.identify(request)
        except errors.AuthRefusal as exc:
            return self._refused(request, exc)
        except errors.ProtocolError as exc:  # the screen's
            return self._refuse(exc)
        return None

    def _screened(self, request: web.Request) -> web.Response | None:
        try:
            return self.screen.check(request)
        except errors.ProtocolError as exc:
            return self._refuse(exc)

    async def _operator(self, request: web.Request) -> web.Response | None:
        """An operator's route: operators only; a refusal is audited."""
        try:
            self.refusals.admit(request)
            await self.callers.operator(request)
        except errors.AuthRefusal as exc:
            return self._refused(request, exc)
        return None

    def _refused(self, request: web.Request, exc: errors.AuthRefusal) -> web.Response:
        self.refusals.noted(request, exc)
        return self._refuse(exc)  # a 429's Retry-After: error_response

    def _refuse(self, exc: GatewayError) -> web.Response:
        self.counters.refused(exc)
        return error_response(exc)

    async def on_prepare(self, request: web.Request, response: web.StreamResponse) -> None:
        """CORS headers on every response to an allowed origin, streams included; the
        challenge and the audit event of an authentication or scope failure."""
        origin = request.headers.get(mcp.H_ORIGIN)
        if origin is not None:
            self.origins.expose(response, origin)
        fault = said(response, AUTH_FAULT)
        if fault is not None:
            self.refusals.challenge(request, response, fault)


__all__ = ["OPERATOR_PATHS", "Guard", "for_operators", "is_open"]
