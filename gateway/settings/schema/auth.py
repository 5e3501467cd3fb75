"""The `auth:` section: who may call (static bearer tokens, an OAuth 2.1 resource server and
its token introspection) and who is an operator.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from annotated_types import Ge, Le, MinLen

from gateway.settings.rules import (
    SIGNING_ALGORITHMS,
    Matches,
    Rule,
    asymmetric,
    http_urls,
    transport_allowed,
)
from gateway.settings.schema.base import Secret, _Model, doc


@dataclass(frozen=True, slots=True, kw_only=True)
class Introspection(_Model):
    """RFC 7662 token introspection, for opaque (non-JWT) access tokens."""

    url: Annotated[str, Matches(r"^https?://")] = field(
        metadata=doc("the introspection endpoint"))
    client_id: Annotated[str, MinLen(1)] = field(
        metadata=doc("the gateway's client at the server"))
    client_secret: Secret = field(
        metadata=doc("its secret (HTTP Basic)"))
    issuer: str | None = field(default=None,
        metadata=doc("the one issuer (of `issuers`) this endpoint vouches for; an answer naming "
            "another is refused; default: the first of `issuers`"))
    require_audience: bool = field(default=True,
        metadata=doc("an answer must carry `aud` naming `resource` (RFC 8707); false only for "
            "a server that never sends `aud` and issues tokens for this gateway alone"))


@dataclass(frozen=True, slots=True, kw_only=True)
class OAuth(_Model):
    """An OAuth 2.1 resource server (MCP authorization spec): JWT access tokens checked
    against the issuers' keys, opaque ones by introspection."""

    resource: Annotated[str, Matches(r"^https?://[^#]+$")] = field(
        metadata=doc("this gateway's canonical URI: the audience tokens must carry (RFC 8707), "
            "and the `resource` of its metadata (RFC 9728)"))
    issuers: Annotated[list[str], MinLen(1), Rule(http_urls)] = field(
        metadata=doc("accepted token issuers; each one's keys are found by RFC 8414 / OIDC "
            "discovery"))
    scopes: list[str] = field(default_factory=list,
        metadata=doc("scopes every request needs"))
    introspection: Introspection | None = field(default=None,
        metadata=doc("{url, client_id, client_secret, issuer, require_audience}: opaque "
            "tokens are checked there"))
    algorithms: Annotated[list[str], Rule(asymmetric)] = field(
        default_factory=lambda: list(SIGNING_ALGORITHMS),
        metadata=doc("accepted JWT signature algorithms (asymmetric ones only)"))
    leeway_s: Annotated[int, Ge(0), Le(300)] = field(default=30,
        metadata=doc("clock skew allowed on exp and nbf"))
    key_refresh_s: Annotated[float, Ge(1)] = field(default=30,
        metadata=doc("an unknown key id fetches the issuer's keys again at most this often; "
            "known keys are fetched again every hour"))
    fetch_timeout_ms: Annotated[int, Ge(100)] = field(default=5000,
        metadata=doc("discovery, keys and introspection requests give up after this long"))
    cache_tokens: Annotated[int, Ge(0)] = field(default=10_000,
        metadata=doc("validated tokens remembered (never past their expiry)"))
    admin_scopes: list[Annotated[str, MinLen(1)]] = field(default_factory=list,
        metadata=doc("a token carrying one of these scopes is an operator: it opens /status, "
            "/metrics and /readyz?detail (docs/security.md, Operator pages)"))
    admin_scope: Annotated[str, MinLen(1)] | None = field(default=None,
        metadata=doc("one more admin scope (the older spelling of admin_scopes)"))
    allow_http: bool = field(default=False,
        metadata=doc("accept http:// issuers, jwks_uri and introspection beyond loopback "
            "(keys and tokens then cross the network unprotected)"))
    require_at_jwt: bool = field(default=False,
        metadata=doc("JWTs must carry the header `typ: at+jwt` (RFC 9068 section 4): an ID "
            "token or another JWT of the issuer is not taken for an access token"))

    @property
    def operator_scopes(self) -> frozenset[str]:
        """The scopes that make a token an operator's: admin_scopes and admin_scope."""
        return frozenset(self.admin_scopes) | (
            {self.admin_scope} if self.admin_scope is not None else set())

    def __post_init__(self) -> None:
        self._https_beyondloopback()
        self._introspection_issuer()

    def _https_beyondloopback(self) -> None:
        """Keys and tokens cross to these servers: https, or plain http to this machine
        only, unless `allow_http` says otherwise (RFC 8414 section 2: issuers are https)."""
        where = [(f"issuers.{i}", url) for i, url in enumerate(self.issuers)]
        if self.introspection is not None:
            where.append(("introspection.url", self.introspection.url))
        for key, url in where:
            if not transport_allowed(url, self.allow_http):
                raise ValueError(f"{key} is plain http beyond loopback: use https, or set "
                                 "auth.oauth.allow_http: true")

    def _introspection_issuer(self) -> None:
        """The introspection endpoint vouches for one issuer (an answer naming another is
        refused): one of `issuers`, the first by default."""
        named = self.introspection.issuer if self.introspection else None
        if named is not None and named not in self.issuers:
            raise ValueError(f"introspection.issuer {named!r} is not one of issuers")


@dataclass(frozen=True, slots=True, kw_only=True)
class StaticToken(_Model):
    """A static bearer token with the scopes it carries and a name (docs/oauth.md): the
    scopes curate the tools it sees and calls, through `tasks.tools.<pattern>.scopes`, as an
    OAuth token's do."""

    token: str = field(repr=False, metadata=doc("the token (Authorization: Bearer ...)"))
    scopes: list[str] | None = field(default=None, metadata=doc(
        "the scopes it carries; absent: every scope, as a plain token"))
    name: str | None = field(default=None, metadata=doc(
        "labels its principal in audit events (`subject`); never the token"))


@dataclass(frozen=True, slots=True, kw_only=True)
class Auth(_Model):
    """Who may call: static bearer tokens (each its own owner of tasks and calls), OAuth
    access tokens (owned by their principal), or both."""

    bearer_tokens: list[str | StaticToken] = field(repr=False, default_factory=list,
        metadata=doc("accepted tokens (Authorization: Bearer ...), each a string (every "
            "scope) or {token, scopes, name}; empty and no oauth: no authentication, every "
            "caller one anonymous owner"))
    oauth: OAuth | None = field(default=None,
        metadata=doc("an OAuth 2.1 resource server: docs/oauth.md"))
    admin_tokens: list[str] = field(repr=False, default_factory=list,
        metadata=doc("operators' tokens (Authorization: Bearer ...): they open /status, /metrics "
            "and /readyz?detail, which clients' tokens never do; none here and no "
            "oauth.admin_scopes: with client auth nobody opens them on listen.port (loopback "
            "peers do on listen.operator_port), without any auth loopback peers only"))
    failures_per_minute: Annotated[int, Ge(0)] = field(default=60,
        metadata=doc("failed authentications a client address may have a minute (as a burst, "
            "refilled evenly); beyond it its requests get 429 unchecked (0: no limit)"))

    @property
    def static_tokens(self) -> list[StaticToken]:
        """Every bearer token as a `StaticToken` (a plain string: every scope, no name)."""
        return [t if isinstance(t, StaticToken) else StaticToken(token=t)
                for t in self.bearer_tokens]

    @property
    def enabled(self) -> bool:
        return self.oauth is not None or any(t.token for t in self.static_tokens)

    @property
    def operators(self) -> bool:
        """Whether operators are named by credentials (else: loopback peers only)."""
        return any(self.admin_tokens) or (self.oauth is not None
                                          and bool(self.oauth.operator_scopes))

    def __post_init__(self) -> None:
        given = [t.token for t in self.static_tokens if t.token]
        if set(filter(None, self.admin_tokens)) & set(given):
            raise ValueError("a token is in both auth.admin_tokens and auth.bearer_tokens: "
                             "an operator's token must not be a client's")
        if len(set(given)) < len(given):  # which entry's scopes would it carry? (never said:
            # the message names no token)
            raise ValueError("a token is listed twice in auth.bearer_tokens: each token is "
                             "one principal, with one set of scopes and one name")
