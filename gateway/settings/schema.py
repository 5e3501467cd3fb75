"""The configuration's schema: the frozen dataclasses the gateway reads at run time, one per
section of the YAML file (docs/configuration.md is generated from them), with each key's
default, meaning (`doc`), constraints and the invariants across keys (`__post_init__`).

Plain stdlib dataclasses: pydantic validates a YAML tree into them where it is imported (the
`Annotated` metadata is what it reads: annotated_types bounds, rules.py's checks), in the
child of isolated.load_isolated; a serving process holds only these classes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Annotated, Any, ClassVar, Literal

from annotated_types import Ge, Le, MaxLen, MinLen

from gateway.settings.rules import (
    MIN_TOKEN_CHARS,
    SIGNING_ALGORITHMS,
    EmptyIsNull,
    Matches,
    Rule,
    addresses,
    asymmetric,
    host_names,
    host_ports,
    http_urls,
    loopback,
    transport_allowed,
)

TaskMode = Literal["never", "auto", "always", "required"]
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")
Isolation = Literal["shared", "client", "call"]
# Which era the gateway speaks to an upstream, or `auto`: it finds out (upstream/wire.py's
# `Era` is the answer, legacy or modern).
EraChoice = Literal["auto", "legacy", "modern"]


# The gateway's own routes (gateway/admin.py; RFC 9728's metadata under /.well-known/).
GATEWAY_PATHS = frozenset({"/healthz", "/readyz", "/metrics", "/status"})


def doc(text: str) -> dict[str, str]:
    """A key's meaning, as docs/configuration.md shows it (scripts/config_reference.py)."""
    return {"doc": text}


class Secret:
    """A secret string: its repr hides it (a settings object in a log or a traceback shows
    `**********`); `get_secret_value()` is the one way to read it."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def get_secret_value(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('**********')"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Callable[[Any], Any]) -> Any:
        from pydantic_core import core_schema

        return core_schema.no_info_after_validator_function(cls, core_schema.str_schema())


EnvName = Annotated[str, Matches(r"^[A-Za-z_][A-Za-z0-9_]*$")]


class _Model:
    """What every settings class shares: unknown keys are refused (pydantic reads this
    attribute on stdlib dataclasses)."""

    __slots__ = ()
    __pydantic_config__: ClassVar[dict[str, Any]] = {"extra": "forbid"}


@dataclass(frozen=True, slots=True, kw_only=True)
class Listen(_Model):
    """Where the gateway listens for MCP clients."""

    host: str = field(default="127.0.0.1",
        metadata=doc("address to bind; beyond loopback it needs auth.bearer_tokens or "
            "security.allow_unauthenticated"))
    port: Annotated[int, Ge(0), Le(65535)] = field(default=8080,
        metadata=doc("TCP port (0: any free one)"))
    tls_cert: str | None = field(default=None,
        metadata=doc("a PEM certificate (chain) file: serve HTTPS (give tls_key too); null: "
            "plain HTTP, TLS ended in front (docs/security.md, TLS)"))
    tls_key: str | None = field(default=None,
        metadata=doc("the certificate's PEM private key file"))
    operator_port: Annotated[int | None, Ge(0), Le(65535)] = field(default=None,
        metadata=doc("a listener of its own for operators, serving /metrics, /status, /readyz "
            "and /healthz only (for Prometheus to scrape; the shipped proxies and Service do "
            "not expose it); null: none (operators use the main port, with their "
            "credential)"))
    operator_host: str = field(default="127.0.0.1",
        metadata=doc("address the operator listener binds; there, with no operator "
            "credential configured, loopback peers are operators"))
    max_header_bytes: Annotated[int, Ge(8190), Le(1 << 20)] = field(default=32 * 1024,
        metadata=doc("the longest request line or header a client may send (400 beyond); "
            "room for JWTs with many claims (Entra ID tokens with groups pass 8 KiB)"))
    sse_keepalive_ms: Annotated[int, Ge(100)] = field(default=15000,
        metadata=doc("a comment line on idle SSE streams this often, so proxies keep slow calls "
            "open"))
    # 5 s: under the Inspector UI's 10 s request timeout (reset on progress) and far under the
    # SDKs' 60 s, with room for a slow hop; one small event a quiet call each time.
    progress_heartbeat_ms: Annotated[int, Ge(0)] = field(default=5000,
        metadata=doc("a quiet call whose request carried a progressToken hears "
            "notifications/progress this often (values always increasing, the server's own "
            "included; 0: never), so clients that reset their timeout on progress wait for "
            "long calls"))

    def __post_init__(self) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("listen.tls_cert and listen.tls_key go together")
        if self.operator_port not in (None, 0) and self.operator_port == self.port:
            raise ValueError("listen.operator_port must differ from listen.port")


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskPolicy(_Model):
    """How calls of a tool become tasks (docs/tasks.md, Task modes)."""

    mode: TaskMode = field(default="auto",
        metadata=doc("never, auto (a task once sync_budget_ms passes), always or required: "
            "docs/tasks.md, Task modes"))
    sync_budget_ms: Annotated[int, Ge(0)] = field(default=1000,
        metadata=doc("auto: how long a call may run inline before it becomes a task"))
    ttl_ms: Annotated[int, Ge(1)] = field(default=600_000,
        metadata=doc("how long a task's result is kept, unless the client asks another ttl: "
            "a task's ttl is its time bound (timeout_ms) plus this, so no running task "
            "expires first"))
    max_ttl_ms: Annotated[int, Ge(1)] = field(default=3_600_000,
        metadata=doc("the longest ttl a task gets, whatever its time bound and the client "
            "asked (set it low and a long run expires at it)"))
    poll_interval_ms: Annotated[int, Ge(1)] = field(default=1000,
        metadata=doc("suggested to clients; adapted to the tool's recent durations"))
    timeout_ms: Annotated[int | None, Ge(1)] = field(default=None,
        metadata=doc("a running task fails after this long, from when its call runs (null: "
            "the upstream's request_timeout_ms; both null: only max_ttl_ms ends it)"))
    # Text a 2025-11-25 client may show its model at once when a call becomes a task
    # (CreateTaskResult `_meta["io.modelcontextprotocol/model-immediate-response"]`).
    immediate_response: str | None = field(default=None,
        metadata=doc("text a 2025-11-25 client may show its model at once when a call becomes a "
            "task"))
    scopes: list[str] = field(default_factory=list,
        metadata=doc("with auth.oauth: scopes a token needs to call the tool (and to see it "
            "listed, and to read its tasks)"))
    max_concurrency: Annotated[int | None, Ge(1)] = field(default=None,
        metadata=doc("calls of the tool running at once on each replica (set for a pattern: "
            "shared by the tools it names); the rest wait in a queue, fair across "
            "callers (null: no limit)"))
    max_queue: Annotated[int, Ge(0)] = field(default=100,
        metadata=doc("with max_concurrency: calls that may wait; beyond, a call is refused"))


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskPolicyOverride(_Model):
    """A tool's own policy: any key of TaskPolicy; a key left out or null takes the
    default."""

    mode: TaskMode | None = None
    sync_budget_ms: Annotated[int | None, Ge(0)] = None
    ttl_ms: Annotated[int | None, Ge(1)] = None
    max_ttl_ms: Annotated[int | None, Ge(1)] = None
    poll_interval_ms: Annotated[int | None, Ge(1)] = None
    timeout_ms: Annotated[int | None, Ge(1)] = None
    immediate_response: str | None = None
    scopes: list[str] | None = None
    max_concurrency: Annotated[int | None, Ge(1)] = None
    max_queue: Annotated[int | None, Ge(0)] = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Tasks(_Model):
    """Task policies: `defaults`, and per tool name in `tools`."""

    defaults: TaskPolicy = field(default_factory=TaskPolicy,
        metadata=doc("for every tool"))
    tools: dict[str, TaskPolicyOverride] = field(default_factory=dict,
        metadata=doc("per tool name, over the defaults (a key left out or null: the default)"))


# TaskPolicy's keys whose null means "none": no timeout, no immediate response, no limit.
NULLABLE_POLICY_KEYS = frozenset({"timeout_ms", "immediate_response", "max_concurrency"})


def _keys_given(raw: Any) -> Any:
    """Which keys an upstream's `tasks.defaults` names, null ones included: a null there
    clears the global value (tasks/policy.py), so "left out" and "null" differ."""
    if not isinstance(raw, dict):
        return raw
    if "given" in raw:
        raise ValueError("unknown key `given`")
    for key in raw.keys() - NULLABLE_POLICY_KEYS:
        if raw[key] is None and key in {f.name for f in fields(TaskPolicy)}:
            nullable = ", ".join(sorted(NULLABLE_POLICY_KEYS))
            raise ValueError(f"`{key}` cannot be null (only {nullable} can: a null "
                             "clears the global value)")
    return {**raw, "given": frozenset(raw)}


@dataclass(frozen=True, slots=True, kw_only=True)
class UpstreamDefaults(TaskPolicyOverride):
    """An upstream's `tasks.defaults`: a tool's policy, except that a key given as null
    clears the global value (`timeout_ms: null`: this upstream's tasks are bounded by its
    request_timeout_ms only)."""

    given: frozenset[str] = field(default=frozenset(), metadata={"internal": True})

    def __post_init__(self) -> None:
        if not self.given:  # built in code, not from a file: the keys it sets are given
            object.__setattr__(self, "given", frozenset(
                f.name for f in fields(TaskPolicyOverride) if getattr(self, f.name) is not None))


@dataclass(frozen=True, slots=True, kw_only=True)
class UpstreamTasks(_Model):
    """One upstream's task policies, over the global `tasks` field by field: a key left
    out takes the global one; in `defaults`, a null clears it."""

    defaults: Annotated[UpstreamDefaults, Rule(_keys_given, before=True)] = field(
        default_factory=UpstreamDefaults,
        metadata=doc("for every tool of this upstream, over the global `tasks.defaults` (a "
                     "null timeout_ms, immediate_response or max_concurrency clears it)"))
    tools: dict[str, TaskPolicyOverride] = field(default_factory=dict,
        metadata=doc("per tool name, over the global `tasks.tools` and these defaults"))


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenExchange(_Model):
    """RFC 8693 token exchange: the caller's access token traded for one meant for this
    upstream, so the upstream knows who calls without ever seeing the caller's token."""

    url: Annotated[str, Matches(r"^https?://")] = field(
        metadata=doc("the token endpoint that exchanges"))
    client_id: Annotated[str, MinLen(1)] = field(
        metadata=doc("the gateway's client there"))
    client_secret: Secret = field(
        metadata=doc("its secret (HTTP Basic)"))
    audience: str | None = field(default=None,
        metadata=doc("the upstream, as the server names it"))
    scope: str | None = field(default=None,
        metadata=doc("scopes asked for the exchanged token"))


@dataclass(frozen=True, slots=True, kw_only=True)
class Upstream(_Model):
    """One MCP server behind the gateway: a stdio program (`command`) or a Streamable HTTP
    URL (`url`)."""

    command: str | None = field(default=None,
        metadata=doc("a stdio server: the program to run (give command or url)"))
    args: list[str] = field(default_factory=list,
        metadata=doc("its arguments"))
    env: dict[str, str] = field(repr=False, default_factory=dict,
        metadata=doc("stdio: environment variables set for it (docs/security.md: it starts "
            "with a short default environment, never the gateway's whole one)"))
    inherit_env: list[EnvName] = field(default_factory=list,
        metadata=doc("stdio: the gateway's environment variables passed on, by name"))
    cwd: str | None = field(default=None,
        metadata=doc("its working directory"))
    url: str | None = field(default=None, repr=False,  # it may carry a user and password
        metadata=doc("a Streamable HTTP (or older HTTP+SSE) server's URL"))
    path: str = field(default="/mcp",
        metadata=doc("where clients reach this upstream on the gateway"))
    isolation: Isolation = field(default="shared",
        metadata=doc("shared: one process for all; client: one per session or auth context; "
            "call: one per tools/call, from a warm pool"))
    pool_size: Annotated[int, Ge(1), Le(64)] = field(default=2,
        metadata=doc("warm processes kept for isolation: call"))
    era: EraChoice = field(default="auto",
        metadata=doc("which protocol era the gateway speaks to it: auto finds out (a server "
            "of both eras serves modern clients on its modern wire); legacy: "
            "initialize only; modern: server/discover only"))
    # 120 s: the shipped configs start server-everything with npx, which downloads it at a
    # container's every start (docker.yaml, deploy/) and at a host's first.
    startup_timeout_ms: Annotated[int, Ge(100)] = field(default=120_000,
        metadata=doc("how long a start (spawn, initialize, an npx download included) may take "
            "before waiting callers get an error"))
    max_concurrency: Annotated[int | None, Ge(1)] = field(default=None,
        metadata=doc("tool calls running on this server at once, on each replica; the rest "
            "wait in a queue, fair across callers (null: no limit)"))
    max_queue: Annotated[int, Ge(0)] = field(default=1000,
        metadata=doc("with max_concurrency: calls that may wait; beyond, a call is refused"))
    # A default bound, so no call waits for ever on a server that lost it (issue 31): as
    # long as a task is kept by default (tasks.defaults.ttl_ms).
    request_timeout_ms: Annotated[int | None, Ge(1)] = field(default=600_000,
        metadata=doc("a call not answered by then is cancelled upstream and answered with an "
            "error; a task's call fails then unless its tool sets timeout_ms (null: no "
            "gateway limit)"))
    # Streamable HTTP upstreams only:
    headers: dict[str, str] = field(repr=False, default_factory=dict,
        metadata=doc("url upstreams: sent with every request"))
    # Client headers passed on by name. The client's Authorization is not passed unless
    # named here (token passthrough is an anti-pattern: base spec, Security).
    forward_headers: list[str] = field(default_factory=list,
        metadata=doc("url upstreams: client headers passed on, by name (Authorization only if "
            "named)"))
    token_exchange: TokenExchange | None = field(default=None,
        metadata=doc("url upstreams with auth.oauth: each call carries the caller's token "
            "exchanged for this upstream (RFC 8693)"))
    connect_timeout_ms: Annotated[int, Ge(1)] = field(default=10_000,
        metadata=doc("url upstreams: to open a connection"))
    read_timeout_ms: Annotated[int | None, Ge(1)] = field(default=None,
        metadata=doc("url upstreams: the longest silence in a reply (null: none)"))
    shutdown_grace_ms: Annotated[int, Ge(0)] = field(default=2000,
        metadata=doc("stdio: after closing its stdin, the wait before SIGTERM, then as long "
            "before SIGKILL"))
    restart_backoff_max_ms: Annotated[int, Ge(10)] = field(default=10000,
        metadata=doc("the longest wait between restarts or reconnections (it doubles from 0.1 s)"))
    tasks: UpstreamTasks | None = field(default=None,
        metadata=doc("this upstream's task policy, over the global one"))

    def __post_init__(self) -> None:
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
            if "@" in rest.split("/", 1)[0] and "authorization" in map(str.lower, self.headers):
                # Two credentials for one request: aiohttp refuses to send it at all.
                raise ValueError("'url' carries a user and password and 'headers' an "
                                 "Authorization: give one of them")


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits(_Model):
    """Bounds that keep one client, or many, from exhausting the gateway; docs/limits.md
    says what happens at each."""

    max_tasks: Annotated[int, Ge(1)] = field(default=10_000,
        metadata=doc("tasks kept at once, running and finished, all owners"))
    max_tasks_per_owner: Annotated[int, Ge(1)] = field(default=100,
        metadata=doc("running tasks at once for one principal (all its legacy sessions "
            "together); a new one is refused"))
    max_finished_tasks_per_owner: Annotated[int, Ge(1)] = field(default=1000,
        metadata=doc("tasks kept at once for one principal, finished and running (a "
            "running one keeps the place it will finish in); beyond it tasks whose results "
            "it read make room, the first read first, else a new task is refused"))
    max_result_bytes: Annotated[int, Ge(1)] = field(default=10 * 1024 * 1024,
        metadata=doc("a bigger result fails its task"))
    max_stored_bytes_per_principal: Annotated[int, Ge(1)] = field(default=64 * 1024 * 1024,
        metadata=doc("bytes of results kept at once for one principal; beyond it results "
            "it read make room, the first read first, else a new task is refused (and a "
            "result that still does not fit fails its task)"))
    max_stored_bytes: Annotated[int, Ge(1)] = field(default=256 * 1024 * 1024,
        metadata=doc("bytes of results kept at once, all tasks"))
    max_body_bytes: Annotated[int, Ge(1024)] = field(default=4 * 1024 * 1024,
        metadata=doc("a bigger POST body is refused (413)"))
    max_message_bytes: Annotated[int, Ge(1024)] = field(default=64 * 1024 * 1024,
        metadata=doc("one upstream line (a bigger one restarts that server) or HTTP "
            "answer: a JSON body or an SSE event's data (a bigger one fails its call)"))
    # 128 MiB: two answers of max_message_bytes waiting for one principal's readers; 512
    # MiB: four principals at their share, beside the result store's 256 MiB, within a
    # 1 GiB container.
    max_inflight_bytes_per_principal: Annotated[int, Ge(1024)] = field(
        default=128 * 1024 * 1024,
        metadata=doc("bytes of answers held for one principal's clients, not yet written to "
            "them (an HTTP server's from its first byte read); an answer past it fails its "
            "call (one answer always goes through)"))
    max_inflight_bytes: Annotated[int, Ge(1024)] = field(default=512 * 1024 * 1024,
        metadata=doc("and for all clients; past it, an answer of a principal over its fair "
            "share fails its call"))
    max_sessions: Annotated[int, Ge(1)] = field(default=1000,
        metadata=doc("legacy sessions at once per upstream; the newcomer's principal's least "
            "recently used idle one makes room, else it is refused"))
    max_sessions_per_principal: Annotated[int, Ge(1)] = field(default=100,
        metadata=doc("legacy sessions at once per upstream for one principal; its least "
            "recently used idle one makes room, else it is refused"))
    session_idle_ms: Annotated[int, Ge(1000)] = field(default=3_600_000,
        metadata=doc("a legacy session idle this long ends"))
    replay_events: Annotated[int, Ge(0)] = field(default=256,
        metadata=doc("SSE events kept per stream for resume"))
    replay_bytes: Annotated[int, Ge(1024)] = field(default=16 * 1024 * 1024,
        metadata=doc("and bytes kept per stream"))
    replay_budget_bytes: Annotated[int, Ge(1024)] = field(default=256 * 1024 * 1024,
        metadata=doc("bytes kept for resume by every legacy session's streams together; "
            "over it, the oldest replay of the same principal goes first"))
    replay_bytes_per_principal: Annotated[int, Ge(1024)] = field(default=64 * 1024 * 1024,
        metadata=doc("of them for one principal's streams; over it, its own oldest replay goes"))
    replay_linger_ms: Annotated[int, Ge(0)] = field(default=60_000,
        metadata=doc("an answered stream's events are kept this long for a resume, then dropped"))
    slow_reader_ms: Annotated[int, Ge(100)] = field(default=30_000,
        metadata=doc("a write waits this long at most"))
    max_parked: Annotated[int, Ge(1)] = field(default=1000,
        metadata=doc("calls waiting for a modern client's input, per upstream"))
    max_parked_per_principal: Annotated[int, Ge(1)] = field(default=100,
        metadata=doc("of them for one principal; beyond it that principal's oldest is "
            "cancelled"))
    park_timeout_ms: Annotated[int, Ge(100)] = field(default=300_000,
        metadata=doc("then the parked call is cancelled"))
    max_listeners_per_owner: Annotated[int, Ge(1)] = field(default=16,
        metadata=doc("subscriptions/listen streams per principal"))
    max_listeners: Annotated[int, Ge(1)] = field(default=1000,
        metadata=doc("subscriptions/listen streams per upstream, all principals"))
    # Per principal (auth context: a legacy session's are its principal's, issue 29), token
    # buckets; a rate of 0 means no limit. The `_per_owner` names stay for compatibility.
    task_requests_per_s: Annotated[float, Ge(0)] = field(default=200,
        metadata=doc("tasks/* requests a second, per principal (0: no limit)"))
    task_requests_burst: Annotated[int, Ge(1)] = field(default=400,
        metadata=doc("and in a burst"))
    task_creations_per_s: Annotated[float, Ge(0)] = field(default=100,
        metadata=doc("new tasks a second, per principal (0: no limit)"))
    task_creations_burst: Annotated[int, Ge(1)] = field(default=200,
        metadata=doc("and in a burst"))
    max_calls_per_owner: Annotated[int, Ge(1)] = field(default=256,
        metadata=doc("calls in flight per principal, a running task's call included"))
    # Issue 41: a stdio server process costs tens of MiB (21 MiB each measured for the test
    # server, more for node ones); 64 of them stay within a small host's memory, and give 8
    # principals their whole share at once.
    max_processes: Annotated[int, Ge(1)] = field(default=64,
        metadata=doc("server processes that isolated upstreams (isolation: client or call) "
            "run at once, all together, each warm process of a pool included (not an "
            "upstream's one primary process); a newcomer at the bound waits, then is refused"))
    max_processes_per_principal: Annotated[int, Ge(1)] = field(default=8,
        metadata=doc("of them for one principal's sessions and calls (without auth every "
            "client is one principal: only max_processes applies); its newcomer waits for "
            "one of its own to end, then is refused, never taking another's"))
    process_wait_ms: Annotated[int, Ge(0)] = field(default=10_000,
        metadata=doc("how long a new session or call waits, in a queue fair across "
            "principals, for a process at those bounds before it is refused"))
    process_idle_ms: Annotated[int, Ge(1000)] = field(default=300_000,
        metadata=doc("an isolated process idle this long goes: a legacy session's (no call "
            "or task running) ends with its session, a modern principal's is closed (the "
            "next request starts one); the warm pool stays"))


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
class Auth(_Model):
    """Who may call: static bearer tokens (each its own owner of tasks and calls), OAuth
    access tokens (owned by their principal), or both."""

    bearer_tokens: list[str] = field(repr=False, default_factory=list,
        metadata=doc("accepted tokens (Authorization: Bearer ...); empty and no oauth: no "
            "authentication, every caller one anonymous owner"))
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
    def enabled(self) -> bool:
        return self.oauth is not None or any(self.bearer_tokens)

    @property
    def operators(self) -> bool:
        """Whether operators are named by credentials (else: loopback peers only)."""
        return any(self.admin_tokens) or (self.oauth is not None
                                          and bool(self.oauth.operator_scopes))

    def __post_init__(self) -> None:
        if set(filter(None, self.admin_tokens)) & set(self.bearer_tokens):
            raise ValueError("a token is in both auth.admin_tokens and auth.bearer_tokens: "
                             "an operator's token must not be a client's")


@dataclass(frozen=True, slots=True, kw_only=True)
class Security(_Model):
    """Browser origins, Host names, requestState sealing, and serving without
    authentication."""

    allowed_origins: list[str] = field(
        default_factory=lambda: ["http://localhost", "http://127.0.0.1", "http://[::1]"],
        metadata=doc("browser Origins served (others get 403); * for any"))
    # DNS rebinding: a page on the attacker's name, resolved to 127.0.0.1, is same-origin
    # to the browser (no Origin on its GETs), but its Host header still names the attacker.
    allowed_hosts: Annotated[list[str] | None, Rule(host_names)] = field(default=None,
        metadata=doc("Host header values served (others get 421): a name (any port) or "
            "name:port, [::1] for IPv6, * for any; null: localhost, 127.0.0.1 and "
            "[::1] when listen.host is loopback, no check beyond it"))
    # Whence the key that seals MRTR requestState (AES-256-GCM), unless replica.secret is
    # set (which it then stands in for). Unset: a random key per start, so states do not
    # survive a restart (their parked calls do not either).
    request_state_key: Annotated[str, MinLen(16)] | None = field(default=None, repr=False,
        metadata=doc("seals MRTR requestState (AES-256-GCM) where replica.secret is unset; "
            "null: a random key per start"))
    # Behind a reverse proxy every client has the proxy's address; only a proxy named here
    # is believed about the client's (X-Forwarded-For). Never by default: a client chooses
    # its own headers.
    trusted_proxies: Annotated[list[str], Rule(addresses)] = field(default_factory=list,
        metadata=doc("addresses or CIDRs of reverse proxies whose X-Forwarded-For names the "
            "client (the one hop such a proxy appended, its rightmost entry; nothing to its "
            "left): the failed-auth limit and the audit log count that client, not the proxy; "
            "empty entries are ignored; []: the header is ignored"))
    # Serve beyond loopback with no bearer token, on purpose (behind a proxy that
    # authenticates, say); without it such a configuration is refused.
    allow_unauthenticated: bool = field(default=False,
        metadata=doc("serve beyond loopback without a bearer token, on purpose (an "
            "authenticating proxy in front)"))


@dataclass(frozen=True, slots=True, kw_only=True)
class Store(_Model):
    """Where tasks live: `memory` (the embedded default, one process) or `redis` (any Redis
    >= 6.2 or Valkey server, shared by every replica)."""

    backend: Literal["memory", "redis"] = field(default="memory",
        metadata=doc("memory: embedded, one process; redis: Redis >= 6.2 or Valkey, shared by "
            "replicas"))
    url: str | None = field(default=None, repr=False,
        metadata=doc("redis://host:port/db, rediss:// for TLS (with sentinels: only its "
            "credentials and db are used)"))
    key_prefix: Annotated[str, MinLen(1)] = field(default="mcpgw:",
        metadata=doc("prefix of every key the gateway writes"))
    lease_ms: Annotated[int, Ge(1000)] = field(default=10_000,
        metadata=doc("then a silent replica is gone"))
    sentinels: Annotated[list[str], Rule(host_ports)] = field(default_factory=list,
        metadata=doc("host:port of Redis Sentinels, which name the primary (then url may go)"))
    sentinel_master: Annotated[str, MinLen(1)] = field(default="mymaster",
        metadata=doc("the name the sentinels monitor the primary under"))
    # spec (tasks extension, durable creation): a handle is returned only once the task is
    # retrievable; under failover that means held by store replicas too (Redis WAIT).
    min_replicas_acked: Annotated[int, Ge(0)] = field(default=0,
        metadata=doc("store replicas that must hold a task's creation and end before it is "
            "acknowledged (Redis WAIT)"))
    ack_timeout_ms: Annotated[int, Ge(1)] = field(default=1000,
        metadata=doc("how long to wait for those acknowledgements"))
    outbox_max_entries: Annotated[int, Ge(1)] = field(default=10_000,
        metadata=doc("task changes kept while the store does not take them; beyond it new "
            "tasks are refused"))
    outbox_max_bytes: Annotated[int, Ge(1024)] = field(default=64 << 20,
        metadata=doc("bytes of results kept so (the same rule)"))
    # A single gateway's finished tasks across its restart (docs/deploys.md): written when
    # it stops, read when it starts; with redis the store itself keeps them.
    snapshot_path: Annotated[str | None, EmptyIsNull] = field(default=None,
        metadata=doc("memory: a file the store's records are written to (sealed, atomically) "
            "when the gateway stops and read back when it starts (null: none)"))

    def __post_init__(self) -> None:
        if self.backend == "redis":
            if not self.url and not self.sentinels:
                raise ValueError("store.backend redis needs store.url (redis://host:port/db) "
                                 "or store.sentinels")
            if self.url and self.url.split("://", 1)[0] not in ("redis", "rediss", "unix"):
                raise ValueError(f"store.url must be a redis://, rediss:// or unix:// URL, "
                                 f"not {self.url.split('://', 1)[0]}://...")


@dataclass(frozen=True, slots=True, kw_only=True)
class Replica(_Model):
    """This process among several sharing one store."""

    id: Annotated[Annotated[str, MinLen(1), MaxLen(128)] | None, EmptyIsNull] = field(
        default=None, metadata=doc("default: a random id per process"))
    # The replicas' shared secret, the same on every replica: the keys that seal their
    # channel messages, the task records in the store (sealed, encrypted) and MRTR
    # requestState, and the keyed digest of owners there, are derived from it (keyring.py).
    # Unset: security.request_state_key; a shared store insists on one of them.
    secret: Annotated[Annotated[str, MinLen(16)] | None, EmptyIsNull] = field(
        default=None, repr=False, metadata=doc("the replicas' shared secret, the same on "
            "every replica: seals their channel messages, task records in the store and "
            "MRTR requestState (null: security.request_state_key; required with "
            "store.backend redis)"))
    # Where the other replicas reach this one (http://host:port), to hand it an MRTR retry
    # whose call is parked here. Unset: the bind address when it names one (listen.host
    # and port), else such a retry elsewhere is refused (sent afresh).
    url: Annotated[Annotated[str, Matches(r"^https?://[^/]+$")] | None, EmptyIsNull] = field(
        default=None, metadata=doc("where the other replicas reach this one (http://host:port), "
            "to hand it an MRTR retry (null: listen.host and port, unless a wildcard address)"))


@dataclass(frozen=True, slots=True, kw_only=True)
class Shutdown(_Model):
    """What a stop (SIGTERM, SIGINT) lets finish (docs/deploys.md)."""

    # The default fits `docker stop`'s 10 s with room for the rest of the stop; deploys of
    # long tools give the platform's grace period and this much longer.
    drain_ms: Annotated[int, Ge(0)] = field(default=8000,
        metadata=doc("on SIGTERM: /readyz 503, new calls refused as stopping, running calls "
            "finish for up to this long, then are cancelled"))


@dataclass(frozen=True, slots=True, kw_only=True)
class Caching(_Model):
    """Hints on cacheable modern results (spec 2026-07-28, caching). The gateway cannot
    know how fresh an upstream's lists are, so by default they are stale at once."""

    ttl_ms: Annotated[int, Ge(0)] = field(default=0,
        metadata=doc("ttlMs hint on cacheable modern results (lists, resources/read)"))
    scope: Literal["public", "private"] = field(default="private",
        metadata=doc("cache scope hint: public or private"))


@dataclass(frozen=True, slots=True, kw_only=True)
class Tracing(_Model):
    """OpenTelemetry traces, off unless an OTLP endpoint is set (needs the `otel` extra:
    pip install 'mcp-task-gateway[otel]')."""

    otlp_endpoint: Annotated[str | None, EmptyIsNull] = field(default=None,
        metadata=doc("OTLP/HTTP traces URL, e.g. http://collector:4318/v1/traces"))
    service_name: Annotated[str, MinLen(1)] = "mcp-task-gateway"
    sample_ratio: Annotated[float, Ge(0), Le(1)] = field(default=1.0,
        metadata=doc("of traces started here"))


@dataclass(frozen=True, slots=True, kw_only=True)
class Logging(_Model):
    """structlog events to stderr."""

    level: Literal["debug", "info", "warning", "error"] = field(default="info",
        metadata=doc("the least severe event logged"))
    format: Literal["json", "console"] = field(default="json",
        metadata=doc("json (one object a line) or console (for people)"))


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings(_Model):
    listen: Listen = field(default_factory=Listen)
    upstreams: Annotated[dict[str, Upstream], MinLen(1)]
    tasks: Tasks = field(default_factory=Tasks)
    limits: Limits = field(default_factory=Limits)
    auth: Auth = field(default_factory=Auth)
    security: Security = field(default_factory=Security)
    caching: Caching = field(default_factory=Caching)
    logging: Logging = field(default_factory=Logging)
    store: Store = field(default_factory=Store)
    replica: Replica = field(default_factory=Replica)
    tracing: Tracing = field(default_factory=Tracing)
    shutdown: Shutdown = field(default_factory=Shutdown)

    @property
    def allowed_hosts(self) -> list[str] | None:
        """The Host names served (`security.allowed_hosts`, else the loopback names when
        bound to loopback); None: any."""
        hosts = self.security.allowed_hosts
        if hosts is None:
            return list(LOOPBACK_HOSTS) if loopback(self.listen.host) else None
        return None if "*" in hosts else hosts

    @property
    def operator_hosts(self) -> list[str] | None:
        """The Host names the operator listener serves, wherever it is bound: the loopback
        names and `security.allowed_hosts` (and any IP address: downstream/peers.py Hosts).
        None: any."""
        hosts = self.security.allowed_hosts or []
        return None if "*" in hosts else [*LOOPBACK_HOSTS, *hosts]

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

    def __post_init__(self) -> None:
        self._exchange_needs_oauth()
        self._authenticated_beyondloopback()
        self._strong_tokens_beyondloopback()
        self._secret_for_a_shared_store()
        self._distinct_paths()

    def _exchange_needs_oauth(self) -> None:
        for name, up in self.upstreams.items():
            if up.token_exchange is not None and self.auth.oauth is None:
                raise ValueError(f"upstreams.{name}.token_exchange needs auth.oauth (there is "
                                 "no caller's token to exchange without it)")

    def _authenticated_beyondloopback(self) -> None:
        """spec (Streamable HTTP, Security Warning): servers SHOULD implement proper
        authentication; reachable from other machines, the gateway insists on it."""
        if (not loopback(self.listen.host) and not self.auth.enabled
                and not self.security.allow_unauthenticated):
            raise ValueError(
                f"listen.host {self.listen.host} is reachable from other machines and "
                "no auth is configured: set auth.bearer_tokens or auth.oauth, bind to "
                "127.0.0.1, or set security.allow_unauthenticated: true to serve without "
                "authentication")

    def _strong_tokens_beyondloopback(self) -> None:
        """Static tokens are the only secret between a caller and the gateway: beyond
        loopback, short ones (guessable, or typed by hand) are refused (an empty one is
        none: `${VAR:-}` left unset)."""
        if loopback(self.listen.host):
            return
        for key in ("bearer_tokens", "admin_tokens"):
            for i, token in enumerate(getattr(self.auth, key)):
                if 0 < len(token) < MIN_TOKEN_CHARS:
                    raise ValueError(
                        f"auth.{key}.{i} is shorter than {MIN_TOKEN_CHARS} characters, too "
                        "weak beyond loopback (make one: openssl rand -hex 32)")

    def _secret_for_a_shared_store(self) -> None:
        """Issue 30: replicas on a shared store without a secret would take any message
        published there, and keep records anyone with the store's password could rewrite."""
        if self.store.backend != "memory" and not self.shared_secret:
            raise ValueError(
                f"store.backend {self.store.backend} needs replica.secret, the same on every "
                "replica: it seals the replicas' messages and the task records in the store "
                "(make one: openssl rand -hex 32; on the command line, GATEWAY_SECRET in "
                "the environment)")

    def _distinct_paths(self) -> None:
        seen: dict[str, str] = {}
        for name, up in self.upstreams.items():
            if up.path in seen:
                raise ValueError(f"upstreams '{seen[up.path]}' and '{name}' share path {up.path}")
            seen[up.path] = name
