"""The gateway's configuration: frozen pydantic models of the YAML file (docs/configuration.md),
`${VAR}` interpolation, and one-line errors that name the offending key.

Loaded once at start; nothing else reads YAML or the environment for settings.
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import re
import typing
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)

from gateway import redact

TaskMode = Literal["never", "auto", "always", "required"]
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")
Isolation = Literal["shared", "client", "call"]
Era = Literal["auto", "legacy", "modern"]
EnvName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]


# The gateway's own routes (gateway/admin.py; RFC 9728's metadata under /.well-known/).
GATEWAY_PATHS = frozenset({"/healthz", "/readyz", "/metrics", "/status"})


class ConfigError(Exception):
    """A configuration problem, worded for one line: `key.path: what is wrong`."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Listen(_Model):
    """Where the gateway listens for MCP clients."""

    host: str = Field("127.0.0.1",
        description=("address to bind; beyond loopback it needs auth.bearer_tokens or "
                     "security.allow_unauthenticated"))
    port: int = Field(8080, ge=0, le=65535, description="TCP port (0: any free one)")
    tls_cert: str | None = Field(None,
        description=("a PEM certificate (chain) file: serve HTTPS (give tls_key too); null: "
                     "plain HTTP, TLS ended in front (README, Security)"))
    tls_key: str | None = Field(None, description="the certificate's PEM private key file")
    max_header_bytes: int = Field(32 * 1024, ge=8190, le=1 << 20,
        description=("the longest request line or header a client may send (400 beyond); "
                     "room for JWTs with many claims (Entra ID tokens with groups pass 8 KiB)"))
    sse_keepalive_ms: int = Field(15000, ge=100,
        description=("a comment line on idle SSE streams this often, so proxies keep slow calls "
                     "open"))

    @model_validator(mode="after")
    def _tls_pair(self) -> Listen:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("listen.tls_cert and listen.tls_key go together")
        return self


class TaskPolicy(_Model):
    """How calls of a tool become tasks (README: Task modes)."""

    mode: TaskMode = Field("auto",
        description=("never, auto (a task once sync_budget_ms passes), always or required: "
                     "README, Task modes"))
    sync_budget_ms: int = Field(1000, ge=0,
        description="auto: how long a call may run inline before it becomes a task")
    ttl_ms: int = Field(600_000, ge=1,
        description=("how long a task is kept from its creation, unless the client asks for "
                     "another ttl"))
    max_ttl_ms: int = Field(3_600_000, ge=1, description="the longest ttl a client may ask for")
    poll_interval_ms: int = Field(1000, ge=1,
        description="suggested to clients; adapted to the tool's recent durations")
    timeout_ms: int | None = Field(None, ge=1,
        description="a running task fails after this long (null: only its ttl ends it)")
    # Text a 2025-11-25 client may show its model at once when a call becomes a task
    # (CreateTaskResult `_meta["io.modelcontextprotocol/model-immediate-response"]`).
    immediate_response: str | None = Field(None,
        description=("text a 2025-11-25 client may show its model at once when a call becomes a "
                     "task"))
    scopes: list[str] = Field([],
        description=("with auth.oauth: scopes a token needs to call the tool (and to see it "
                     "listed, and to read its tasks)"))
    max_concurrency: int | None = Field(None, ge=1,
        description=("calls of the tool running at once on each replica (set for a pattern: "
                     "shared by the tools it names); the rest wait in a queue, fair across "
                     "callers (null: no limit)"))
    max_queue: int = Field(100, ge=0,
        description="with max_concurrency: calls that may wait; beyond, a call is refused")


class TaskPolicyOverride(_Model):
    """A tool's own policy: any key of TaskPolicy; a key left out or null takes the
    default."""

    mode: TaskMode | None = None
    sync_budget_ms: int | None = Field(None, ge=0)
    ttl_ms: int | None = Field(None, ge=1)
    max_ttl_ms: int | None = Field(None, ge=1)
    poll_interval_ms: int | None = Field(None, ge=1)
    timeout_ms: int | None = Field(None, ge=1)
    immediate_response: str | None = None
    scopes: list[str] | None = None
    max_concurrency: int | None = Field(None, ge=1)
    max_queue: int | None = Field(None, ge=0)


class Tasks(_Model):
    """Task policies: `defaults`, and per tool name in `tools`."""

    defaults: TaskPolicy = Field(TaskPolicy(), description="for every tool")
    tools: dict[str, TaskPolicyOverride] = Field({},
        description="per tool name, over the defaults (a key left out or null: the default)")


class TokenExchange(_Model):
    """RFC 8693 token exchange: the caller's access token traded for one meant for this
    upstream, so the upstream knows who calls without ever seeing the caller's token."""

    url: str = Field(pattern=r"^https?://", description="the token endpoint that exchanges")
    client_id: str = Field(min_length=1, description="the gateway's client there")
    client_secret: SecretStr = Field(description="its secret (HTTP Basic)")
    audience: str | None = Field(None, description="the upstream, as the server names it")
    scope: str | None = Field(None, description="scopes asked for the exchanged token")


class Upstream(_Model):
    """One MCP server behind the gateway: a stdio program (`command`) or a Streamable HTTP
    URL (`url`)."""

    command: str | None = Field(None,
        description="a stdio server: the program to run (give command or url)")
    args: list[str] = Field([], description="its arguments")
    env: dict[str, str] = Field({},
        description=("stdio: environment variables set for it (README, Security: it starts "
                     "with a short default environment, never the gateway's whole one)"))
    inherit_env: list[EnvName] = Field([],
        description="stdio: the gateway's environment variables passed on, by name")
    cwd: str | None = Field(None, description="its working directory")
    url: str | None = Field(None, description="a Streamable HTTP (or older HTTP+SSE) server's URL")
    path: str = Field("/mcp", description="where clients reach this upstream on the gateway")
    isolation: Isolation = Field("shared",
        description=("shared: one process for all; client: one per session or auth context; "
                     "call: one per tools/call, from a warm pool"))
    pool_size: int = Field(2, ge=1, le=64, description="warm processes kept for isolation: call")
    era: Era = Field("auto",
        description=("which protocol era the gateway speaks to it: auto finds out (a server "
                     "of both eras serves modern clients on its modern wire); legacy: "
                     "initialize only; modern: server/discover only"))
    # 120 s: the shipped configs start server-everything with npx, which downloads it at a
    # container's every start (docker.yaml, deploy/) and at a host's first.
    startup_timeout_ms: int = Field(120_000, ge=100,
        description=("how long a start (spawn, initialize, an npx download included) may take "
                     "before waiting callers get an error"))
    max_concurrency: int | None = Field(None, ge=1,
        description=("tool calls running on this server at once, on each replica; the rest "
                     "wait in a queue, fair across callers (null: no limit)"))
    max_queue: int = Field(1000, ge=0,
        description="with max_concurrency: calls that may wait; beyond, a call is refused")
    # A default bound, so no call waits for ever on a server that lost it (issue 31): as
    # long as a task is kept by default (tasks.defaults.ttl_ms).
    request_timeout_ms: int | None = Field(600_000, ge=1,
        description=("a call not answered by then is cancelled upstream and answered with an "
                     "error (null: no gateway limit)"))
    # Streamable HTTP upstreams only:
    headers: dict[str, str] = Field({}, description="url upstreams: sent with every request")
    # Client headers passed on by name. The client's Authorization is not passed unless
    # named here (token passthrough is an anti-pattern: base spec, Security).
    forward_headers: list[str] = Field([],
        description=("url upstreams: client headers passed on, by name (Authorization only if "
                     "named)"))
    token_exchange: TokenExchange | None = Field(None,
        description=("url upstreams with auth.oauth: each call carries the caller's token "
                     "exchanged for this upstream (RFC 8693)"))
    connect_timeout_ms: int = Field(10_000, ge=1,
        description="url upstreams: to open a connection")
    read_timeout_ms: int | None = Field(None, ge=1,
        description="url upstreams: the longest silence in a reply (null: none)")
    shutdown_grace_ms: int = Field(2000, ge=0,
        description=("stdio: after closing its stdin, the wait before SIGTERM, then as long "
                     "before SIGKILL"))
    restart_backoff_max_ms: int = Field(10000, ge=10,
        description="the longest wait between restarts or reconnections (it doubles from 0.1 s)")
    tasks: Tasks | None = Field(None,
        description="this upstream's task policy, over the global one")

    @model_validator(mode="after")
    def _one_target(self) -> Upstream:
        if (self.command is None) == (self.url is None):
            raise ValueError("give exactly one of 'command' (stdio) or 'url' (Streamable HTTP)")
        if not self.path.startswith("/"):
            raise ValueError("'path' must start with '/'")
        if self.path in GATEWAY_PATHS or self.path.startswith("/.well-known/"):
            # Those are the gateway's own routes, open to anyone or to operators only
            # (downstream/boundary.py, Guard): an upstream there would be served as they are.
            raise ValueError(f"'path' {self.path} is one of the gateway's own routes")
        if self.url is None and (self.headers or self.forward_headers or self.token_exchange):
            raise ValueError("'headers', 'forward_headers' and 'token_exchange' apply to 'url' "
                             "upstreams only")
        if self.url is not None:
            scheme, _, rest = self.url.partition("://")
            if scheme not in ("http", "https") or not rest.split("/", 1)[0]:
                raise ValueError(f"'url' must be an http:// or https:// URL, not {self.url!r}")
        return self


class Limits(_Model):
    """Bounds that keep one client, or many, from exhausting the gateway; README: Limits
    says what happens at each."""

    max_tasks: int = Field(10_000, ge=1,
        description="tasks kept at once, running and finished, all owners")
    max_tasks_per_owner: int = Field(100, ge=1,
        description=("tasks kept at once for one principal (all its legacy sessions "
                     "together)"))
    max_result_bytes: int = Field(10 * 1024 * 1024, ge=1,
        description="a bigger result fails its task")
    max_stored_bytes_per_principal: int = Field(64 * 1024 * 1024, ge=1,
        description=("bytes of results kept at once for one principal (the memory store; "
                     "with Redis only max_stored_bytes holds)"))
    max_stored_bytes: int = Field(256 * 1024 * 1024, ge=1,
        description="bytes of results kept at once, all tasks")
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024,
        description="a bigger POST body is refused (413)")
    max_message_bytes: int = Field(64 * 1024 * 1024, ge=1024,
        description="one upstream line; a bigger one restarts that server")
    max_sessions: int = Field(1000, ge=1,
        description=("legacy sessions at once per upstream; the newcomer's principal's least "
                     "recently used idle one makes room, else it is refused"))
    max_sessions_per_principal: int = Field(100, ge=1,
        description=("legacy sessions at once per upstream for one principal; its least "
                     "recently used idle one makes room, else it is refused"))
    session_idle_ms: int = Field(3_600_000, ge=1000,
        description="a legacy session idle this long ends")
    replay_events: int = Field(256, ge=0, description="SSE events kept per stream for resume")
    replay_bytes: int = Field(16 * 1024 * 1024, ge=1024, description="and bytes kept per stream")
    replay_budget_bytes: int = Field(256 * 1024 * 1024, ge=1024,
        description=("bytes kept for resume by every legacy session's streams together; "
                     "over it, the oldest replay of the same principal goes first"))
    replay_bytes_per_principal: int = Field(64 * 1024 * 1024, ge=1024,
        description="of them for one principal's streams; over it, its own oldest replay goes")
    replay_linger_ms: int = Field(60_000, ge=0,
        description="an answered stream's events are kept this long for a resume, then dropped")
    slow_reader_ms: int = Field(30_000, ge=100, description="a write waits this long at most")
    max_parked: int = Field(1000, ge=1,
        description="calls waiting for a modern client's input, per upstream")
    max_parked_per_principal: int = Field(100, ge=1,
        description=("of them for one principal; beyond it that principal's oldest is "
                     "cancelled"))
    park_timeout_ms: int = Field(300_000, ge=100, description="then the parked call is cancelled")
    max_listeners_per_owner: int = Field(16, ge=1,
        description="subscriptions/listen streams per principal")
    max_listeners: int = Field(1000, ge=1,
        description="subscriptions/listen streams per upstream, all principals")
    # Per principal (auth context: a legacy session's are its principal's, issue 29), token
    # buckets; a rate of 0 means no limit. The `_per_owner` names stay for compatibility.
    task_requests_per_s: float = Field(200, ge=0,
        description="tasks/* requests a second, per principal (0: no limit)")
    task_requests_burst: int = Field(400, ge=1, description="and in a burst")
    task_creations_per_s: float = Field(100, ge=0,
        description="new tasks a second, per principal (0: no limit)")
    task_creations_burst: int = Field(200, ge=1, description="and in a burst")
    max_calls_per_owner: int = Field(256, ge=1,
        description="calls in flight per principal, a running task's call included")


# Asymmetric signatures only: `none` is no signature, and an HS* key would be the issuer's
# public key used as a shared secret (the classic algorithm-confusion attack).
SIGNING_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384",
                      "ES512", "EdDSA")


class Introspection(_Model):
    """RFC 7662 token introspection, for opaque (non-JWT) access tokens."""

    url: str = Field(pattern=r"^https?://", description="the introspection endpoint")
    client_id: str = Field(min_length=1, description="the gateway's client at the server")
    client_secret: SecretStr = Field(description="its secret (HTTP Basic)")
    issuer: str | None = Field(None,
        description=("the one issuer (of `issuers`) this endpoint vouches for; an answer naming "
                     "another is refused; default: the first of `issuers`"))
    require_audience: bool = Field(True,
        description=("an answer must carry `aud` naming `resource` (RFC 8707); false only for "
                     "a server that never sends `aud` and issues tokens for this gateway alone"))


class OAuth(_Model):
    """An OAuth 2.1 resource server (MCP authorization spec): JWT access tokens checked
    against the issuers' keys, opaque ones by introspection."""

    resource: str = Field(pattern=r"^https?://[^#]+$",
        description=("this gateway's canonical URI: the audience tokens must carry (RFC 8707), "
                     "and the `resource` of its metadata (RFC 9728)"))
    issuers: list[str] = Field(min_length=1,
        description=("accepted token issuers; each one's keys are found by RFC 8414 / OIDC "
                     "discovery"))
    scopes: list[str] = Field([], description="scopes every request needs")
    introspection: Introspection | None = Field(None,
        description=("{url, client_id, client_secret, issuer, require_audience}: opaque "
                     "tokens are checked there"))
    algorithms: list[str] = Field(list(SIGNING_ALGORITHMS),
        description="accepted JWT signature algorithms (asymmetric ones only)")
    leeway_s: int = Field(30, ge=0, le=300,
        description="clock skew allowed on exp and nbf")
    key_refresh_s: float = Field(30, ge=1,
        description=("an unknown key id fetches the issuer's keys again at most this often; "
                     "known keys are fetched again every hour"))
    fetch_timeout_ms: int = Field(5000, ge=100,
        description="discovery, keys and introspection requests give up after this long")
    cache_tokens: int = Field(10_000, ge=0,
        description="validated tokens remembered (never past their expiry)")
    admin_scope: str | None = Field(None, min_length=1,
        description=("a token carrying this scope is an operator: it opens /status, /metrics "
                     "and /readyz?detail (README, Security)"))
    allow_http: bool = Field(False,
        description=("accept http:// issuers, jwks_uri and introspection beyond loopback "
                     "(keys and tokens then cross the network unprotected)"))
    require_at_jwt: bool = Field(False,
        description=("JWTs must carry the header `typ: at+jwt` (RFC 9068 section 4): an ID "
                     "token or another JWT of the issuer is not taken for an access token"))

    @field_validator("algorithms")
    @classmethod
    def _asymmetric(cls, value: list[str]) -> list[str]:
        for alg in value:
            if alg not in SIGNING_ALGORITHMS:
                raise ValueError(f"{alg!r} is not accepted: use asymmetric algorithms among "
                                 f"{', '.join(SIGNING_ALGORITHMS)}")
        return value

    @field_validator("issuers")
    @classmethod
    def _urls(cls, value: list[str]) -> list[str]:
        for issuer in value:
            if not issuer.startswith(("https://", "http://")):
                raise ValueError(f"{issuer!r} is not an http(s) URL")
        return value

    @model_validator(mode="after")
    def _https_beyond_loopback(self) -> OAuth:
        """Keys and tokens cross to these servers: https, or plain http to this machine
        only, unless `allow_http` says otherwise (RFC 8414 section 2: issuers are https)."""
        where = [(f"issuers.{i}", url) for i, url in enumerate(self.issuers)]
        if self.introspection is not None:
            where.append(("introspection.url", self.introspection.url))
        for key, url in where:
            if not transport_allowed(url, self.allow_http):
                raise ValueError(f"{key} is plain http beyond loopback: use https, or set "
                                 "auth.oauth.allow_http: true")
        return self

    @model_validator(mode="after")
    def _introspection_issuer(self) -> OAuth:
        """The introspection endpoint vouches for one issuer (an answer naming another is
        refused): one of `issuers`, the first by default."""
        named = self.introspection.issuer if self.introspection else None
        if named is not None and named not in self.issuers:
            raise ValueError(f"introspection.issuer {named!r} is not one of issuers")
        return self


class Auth(_Model):
    """Who may call: static bearer tokens (each its own owner of tasks and calls), OAuth
    access tokens (owned by their principal), or both."""

    bearer_tokens: list[str] = Field([],
        description=("accepted tokens (Authorization: Bearer ...); empty and no oauth: no "
                     "authentication, every caller one anonymous owner"))
    oauth: OAuth | None = Field(None,
        description="an OAuth 2.1 resource server: README, OAuth")
    admin_tokens: list[str] = Field([],
        description=("operators' tokens (Authorization: Bearer ...): they open /status, /metrics "
                     "and /readyz?detail, which clients' tokens never do; none here and no "
                     "oauth.admin_scope: those routes answer loopback peers only"))
    failures_per_minute: int = Field(60, ge=0,
        description=("failed authentications a client address may have a minute (as a burst, "
                     "refilled evenly); beyond it its requests get 429 unchecked (0: no limit)"))

    @property
    def enabled(self) -> bool:
        return self.oauth is not None or any(self.bearer_tokens)

    @property
    def operators(self) -> bool:
        """Whether operators are named by credentials (else: loopback peers only)."""
        return any(self.admin_tokens) or (self.oauth is not None
                                          and self.oauth.admin_scope is not None)

    @model_validator(mode="after")
    def _admins_are_not_clients(self) -> Auth:
        if set(filter(None, self.admin_tokens)) & set(self.bearer_tokens):
            raise ValueError("a token is in both auth.admin_tokens and auth.bearer_tokens: "
                             "an operator's token must not be a client's")
        return self


class Security(_Model):
    """Browser origins, Host names, requestState sealing, and serving without
    authentication."""

    allowed_origins: list[str] = Field(["http://localhost", "http://127.0.0.1", "http://[::1]"],
        description="browser Origins served (others get 403); * for any")
    # DNS rebinding: a page on the attacker's name, resolved to 127.0.0.1, is same-origin
    # to the browser (no Origin on its GETs), but its Host header still names the attacker.
    allowed_hosts: list[str] | None = Field(None,
        description=("Host header values served (others get 421): a name (any port) or "
                     "name:port, [::1] for IPv6, * for any; null: localhost, 127.0.0.1 and "
                     "[::1] when listen.host is loopback, no check beyond it"))
    # Whence the key that seals MRTR requestState (AES-256-GCM), unless replica.secret is
    # set (which it then stands in for). Unset: a random key per start, so states do not
    # survive a restart (their parked calls do not either).
    request_state_key: str | None = Field(None, min_length=16,
        description=("seals MRTR requestState (AES-256-GCM) where replica.secret is unset; "
                     "null: a random key per start"))
    # Serve beyond loopback with no bearer token, on purpose (behind a proxy that
    # authenticates, say); without it such a configuration is refused.
    allow_unauthenticated: bool = Field(False,
        description=("serve beyond loopback without a bearer token, on purpose (an "
                     "authenticating proxy in front)"))

    @field_validator("allowed_hosts")
    @classmethod
    def _host_names(cls, value: list[str] | None) -> list[str] | None:
        for host in value or ():
            if not host or "/" in host or "@" in host:
                raise ValueError(f"{host!r} is not a host name or host:port (no scheme, no "
                                 "path)")
        return value


class Store(_Model):
    """Where tasks live: `memory` (the embedded default, one process) or `redis` (any Redis
    >= 6.2 or Valkey server, shared by every replica)."""

    backend: Literal["memory", "redis"] = Field("memory",
        description=("memory: embedded, one process; redis: Redis >= 6.2 or Valkey, shared by "
                     "replicas"))
    url: str | None = Field(None,
        description=("redis://host:port/db, rediss:// for TLS (with sentinels: only its "
                     "credentials and db are used)"))
    key_prefix: str = Field("mcpgw:", min_length=1,
        description="prefix of every key the gateway writes")
    lease_ms: int = Field(10_000, ge=1000, description="then a silent replica is gone")
    sentinels: list[str] = Field(default_factory=list,
        description="host:port of Redis Sentinels, which name the primary (then url may go)")
    sentinel_master: str = Field("mymaster", min_length=1,
        description="the name the sentinels monitor the primary under")
    # spec (tasks extension, durable creation): a handle is returned only once the task is
    # retrievable; under failover that means held by store replicas too (Redis WAIT).
    min_replicas_acked: int = Field(0, ge=0,
        description=("store replicas that must hold a task's creation and end before it is "
                     "acknowledged (Redis WAIT)"))
    ack_timeout_ms: int = Field(1000, ge=1,
        description="how long to wait for those acknowledgements")
    outbox_max_entries: int = Field(10_000, ge=1,
        description=("task changes kept while the store does not take them; beyond it new "
                     "tasks are refused"))
    outbox_max_bytes: int = Field(64 << 20, ge=1024,
        description="bytes of results kept so (the same rule)")

    @field_validator("sentinels")
    @classmethod
    def _host_ports(cls, value: list[str]) -> list[str]:
        for item in value:
            host, _, port = item.rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"{item!r} is not host:port")
        return value

    @model_validator(mode="after")
    def _url_for_redis(self) -> Store:
        if self.backend == "redis":
            if not self.url and not self.sentinels:
                raise ValueError("store.backend redis needs store.url (redis://host:port/db) "
                                 "or store.sentinels")
            if self.url and self.url.split("://", 1)[0] not in ("redis", "rediss", "unix"):
                raise ValueError(f"store.url must be a redis://, rediss:// or unix:// URL, "
                                 f"not {self.url.split('://', 1)[0]}://...")
        return self


class Replica(_Model):
    """This process among several sharing one store."""

    id: str | None = Field(None, min_length=1, max_length=128,
                           description="default: a random id per process")
    # The replicas' shared secret, the same on every replica: the keys that seal their
    # channel messages, the task records in the store (sealed, encrypted) and MRTR
    # requestState, and the keyed digest of owners there, are derived from it (keyring.py).
    # Unset: security.request_state_key; a shared store insists on one of them.
    secret: str | None = Field(None, min_length=16,
        description=("the replicas' shared secret, the same on every replica: seals their "
                     "channel messages, task records in the store and MRTR requestState "
                     "(null: security.request_state_key; required with store.backend redis)"))
    # Where the other replicas reach this one (http://host:port), to hand it an MRTR retry
    # whose call is parked here. Unset: the bind address when it names one (listen.host
    # and port), else such a retry elsewhere is refused (sent afresh).
    url: str | None = Field(None, pattern=r"^https?://[^/]+$",
        description=("where the other replicas reach this one (http://host:port), to hand it an "
                     "MRTR retry (null: listen.host and port, unless a wildcard address)"))

    @field_validator("id", "secret", "url", mode="before")
    @classmethod
    def _unset_when_empty(cls, value: Any) -> Any:
        return None if value == "" else value  # `${HOSTNAME:-}` and the like


class Caching(_Model):
    """Hints on cacheable modern results (spec 2026-07-28, caching). The gateway cannot
    know how fresh an upstream's lists are, so by default they are stale at once."""

    ttl_ms: int = Field(0, ge=0,
        description="ttlMs hint on cacheable modern results (lists, resources/read)")
    scope: Literal["public", "private"] = Field("private",
        description="cache scope hint: public or private")


class Tracing(_Model):
    """OpenTelemetry traces, off unless an OTLP endpoint is set (needs the `otel` extra:
    pip install 'mcp-task-gateway[otel]')."""

    otlp_endpoint: str | None = Field(
        None, description="OTLP/HTTP traces URL, e.g. http://collector:4318/v1/traces")
    service_name: str = Field("mcp-task-gateway", min_length=1)
    sample_ratio: float = Field(1.0, ge=0, le=1, description="of traces started here")

    @field_validator("otlp_endpoint", mode="before")
    @classmethod
    def _unset_when_empty(cls, value: Any) -> Any:
        return None if value == "" else value  # `${OTEL_EXPORTER_OTLP_ENDPOINT:-}`


class Logging(_Model):
    """structlog events to stderr."""

    level: Literal["debug", "info", "warning", "error"] = Field("info",
        description="the least severe event logged")
    format: Literal["json", "console"] = Field("json",
        description="json (one object a line) or console (for people)")


class Settings(_Model):
    listen: Listen = Listen()
    upstreams: dict[str, Upstream] = Field(min_length=1)
    tasks: Tasks = Tasks()
    limits: Limits = Limits()
    auth: Auth = Auth()
    security: Security = Security()
    caching: Caching = Caching()
    logging: Logging = Logging()
    store: Store = Store()
    replica: Replica = Replica()
    tracing: Tracing = Tracing()

    @property
    def allowed_hosts(self) -> list[str] | None:
        """The Host names served (`security.allowed_hosts`, else the loopback names when
        bound to loopback); None: any."""
        hosts = self.security.allowed_hosts
        if hosts is None:
            return list(LOOPBACK_HOSTS) if _loopback(self.listen.host) else None
        return None if "*" in hosts else hosts

    @property
    def shared_secret(self) -> str | None:
        """What every replica shares: replica.secret, else security.request_state_key."""
        return self.replica.secret or self.security.request_state_key

    @property
    def replica_url(self) -> str | None:
        """Where the other replicas reach this one: `replica.url`, else the bind address
        when it names one host and port (a wildcard such as 0.0.0.0, or port 0, names
        none: set replica.url then)."""
        if self.replica.url is not None:
            return self.replica.url
        host, port = self.listen.host, self.listen.port
        if host in ("", "0.0.0.0", "::") or port == 0:
            return None
        return f"http://{f'[{host}]' if ':' in host else host}:{port}"

    @model_validator(mode="after")
    def _exchange_needs_oauth(self) -> Settings:
        for name, up in self.upstreams.items():
            if up.token_exchange is not None and self.auth.oauth is None:
                raise ValueError(f"upstreams.{name}.token_exchange needs auth.oauth (there is "
                                 "no caller's token to exchange without it)")
        return self

    @model_validator(mode="after")
    def _authenticated_beyond_loopback(self) -> Settings:
        """spec (Streamable HTTP, Security Warning): servers SHOULD implement proper
        authentication; reachable from other machines, the gateway insists on it."""
        if (not _loopback(self.listen.host) and not self.auth.enabled
                and not self.security.allow_unauthenticated):
            raise ValueError(
                f"listen.host {self.listen.host} is reachable from other machines and "
                "no auth is configured: set auth.bearer_tokens or auth.oauth, bind to "
                "127.0.0.1, or set security.allow_unauthenticated: true to serve without "
                "authentication")
        return self

    @model_validator(mode="after")
    def _strong_tokens_beyond_loopback(self) -> Settings:
        """Static tokens are the only secret between a caller and the gateway: beyond
        loopback, short ones (guessable, or typed by hand) are refused (an empty one is
        none: `${VAR:-}` left unset)."""
        if _loopback(self.listen.host):
            return self
        for key in ("bearer_tokens", "admin_tokens"):
            for i, token in enumerate(getattr(self.auth, key)):
                if 0 < len(token) < MIN_TOKEN_CHARS:
                    raise ValueError(
                        f"auth.{key}.{i} is shorter than {MIN_TOKEN_CHARS} characters, too "
                        "weak beyond loopback (make one: openssl rand -hex 32)")
        return self

    @model_validator(mode="after")
    def _secret_for_a_shared_store(self) -> Settings:
        """Issue 30: replicas on a shared store without a secret would take any message
        published there, and keep records anyone with the store's password could rewrite."""
        if self.store.backend != "memory" and not self.shared_secret:
            raise ValueError(
                f"store.backend {self.store.backend} needs replica.secret, the same on every "
                "replica: it seals the replicas' messages and the task records in the store "
                "(make one: openssl rand -hex 32; on the command line, GATEWAY_SECRET in "
                "the environment)")
        return self

    @model_validator(mode="after")
    def _distinct_paths(self) -> Settings:
        seen: dict[str, str] = {}
        for name, up in self.upstreams.items():
            if up.path in seen:
                raise ValueError(f"upstreams '{seen[up.path]}' and '{name}' share path {up.path}")
            seen[up.path] = name
        return self


MIN_TOKEN_CHARS = 32  # static tokens served beyond loopback (128 bits as hex)


def transport_allowed(url: str, allow_http: bool) -> bool:
    """Whether credentials may go to `url`: https, plain http to a loopback host
    (127.0.0.0/8, ::1, localhost), or any http when the operator opted in."""
    scheme, _, rest = url.partition("://")
    if scheme.lower() == "https" or allow_http:
        return True
    host = urlsplit(f"http://{rest}").hostname or ""
    return scheme.lower() == "http" and _loopback(host)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve anywhere


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def interpolate(value: Any, where: str = "", unset: list[str] | None = None) -> Any:
    """Replace `${VAR}` (or `${VAR:-default}`) in every string of a YAML tree. A variable
    neither set nor defaulted is an error, unless `unset` collects it (checking a file
    before deployment): it then reads as a placeholder."""
    if isinstance(value, dict):
        return {k: interpolate(v, f"{where}.{k}" if where else str(k), unset)
                for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, f"{where}.{i}", unset) for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match[str]) -> str:
        name, default = m.group(1), m.group(2)
        if name in os.environ:
            return os.environ[name]
        if default is not None:
            return default
        if unset is None:
            raise ConfigError(f"{where}: environment variable {name} is not set")
        unset.append(name)
        return _placeholder(name, where, whole=m.group(0) == value)

    return _VAR.sub(sub, value)


def _placeholder(name: str, where: str, whole: bool) -> str:
    """What an unset variable reads as while a file is checked: long enough for a token,
    and, standing for a whole URL (`store.url: "${REDIS_URL}"`), a URL of the right kind,
    so that the check names the variable instead of failing on the placeholder."""
    if whole and where == "store.url":
        return f"redis://unset-{name}"
    if whole and where.endswith(".url"):
        return f"https://unset-{name}.invalid/"
    return f"unset-{name}".ljust(MIN_TOKEN_CHARS, "-")


def from_mapping(raw: Any, unset: list[str] | None = None) -> Settings:
    """Validated settings of a YAML tree. With `unset` (checking a file before deployment),
    environment variables not set here read as placeholders, and are collected there."""
    if not isinstance(raw, dict):
        raise ConfigError("the configuration must be a YAML mapping")
    try:
        return Settings.model_validate(interpolate(raw, unset=unset))
    except ValidationError as exc:
        raise ConfigError(_first_problem(exc)) from None


def load(path: str | Path) -> Settings:
    return from_mapping(read_raw(path))


def read_raw(path: str | Path) -> Any:
    """The YAML tree of `path`, unvalidated (the CLI merges flags into it first)."""
    import yaml  # only configs from a file need it: zero-config starts lighter

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror or exc}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" (line {mark.line + 1})" if mark else ""
        raise ConfigError(f"{path}{at}: not valid YAML: {getattr(exc, 'problem', exc)}") from None
    return raw or {}


def _first_problem(exc: ValidationError) -> str:
    """One line naming the key at fault. An unknown key comes first: it usually explains a
    missing one beside it (`upstream:` for `upstreams:`), and a close known name is offered."""
    errors = exc.errors()
    err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    key = ".".join(str(p) for p in err["loc"]) or "(top level)"
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        msg = f"unknown key `{err['loc'][-1]}`"
        close = difflib.get_close_matches(str(err["loc"][-1]), _keys_at(err["loc"][:-1]), 1)
        if close:
            msg += f"; did you mean `{close[0]}`?"
    more = len(errors) - 1
    # A value quoted back (an URL with its password, say) is shown without credentials:
    # the line goes to a terminal, a CI log, a support ticket.
    msg = redact.text(msg)
    return f"{key}: {msg}" + (f" (and {more} more problem{'s' * (more > 1)})" if more else "")


def _keys_at(loc: tuple[int | str, ...]) -> list[str]:
    """The keys the settings know at `loc` (a dict's own keys pass through to its values)."""
    model: Any = Settings
    for part in loc:
        field = model.model_fields.get(str(part)) if _is_model(model) else None
        if field is None:  # a key of a dict of models: its values are the next model
            args = typing.get_args(model)
            model = args[-1] if args else None
            continue
        model = field.annotation
    while not _is_model(model) and typing.get_args(model):  # X | None, dict[str, X]
        model = next((a for a in typing.get_args(model) if a is not type(None)), None)
        if typing.get_origin(model) is dict:
            return []
    return list(model.model_fields) if _is_model(model) else []


def _is_model(t: Any) -> bool:
    return isinstance(t, type) and issubclass(t, BaseModel)
