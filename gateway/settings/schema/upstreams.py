"""The `upstreams:` section: each MCP server behind the gateway, a stdio program or an HTTP
URL; how it is run, reached, bounded and timed, and its RFC 8693 token exchange.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

from annotated_types import Ge, Le, MinLen

from gateway.settings.rules import Matches
from gateway.settings.schema.base import Secret, _Model, doc
from gateway.settings.schema.tasks import UpstreamTasks

Isolation = Literal["shared", "client", "call"]
# Which era the gateway speaks to an upstream, or `auto`: it finds out (upstream/wire.py's
# `Era` is the answer, legacy or modern).
EraChoice = Literal["auto", "legacy", "modern"]


# The gateway's own routes (gateway/admin.py; RFC 9728's metadata under /.well-known/).
GATEWAY_PATHS = frozenset({"/healthz", "/readyz", "/metrics", "/status"})


EnvName = Annotated[str, Matches(r"^[A-Za-z_][A-Za-z0-9_]*$")]


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
