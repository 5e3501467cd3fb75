"""The configuration's schema: the frozen dataclasses the gateway reads at run time, one per
section of the YAML file (docs/configuration.md is generated from them), with each key's
default, meaning (`doc`), constraints and the invariants across keys (`__post_init__`).

Plain stdlib dataclasses: pydantic validates a YAML tree into them where it is imported (the
`Annotated` metadata is what it reads: annotated_types bounds, rules.py's checks), in the
child of isolated.load_isolated; a serving process holds only these classes.

One module per section; this one assembles them into `Settings`, the top level, with the
invariants across sections, and is where the gateway imports every name from:

    base.py         what every section shares: `doc`, `Secret`, unknown keys refused
    listen.py       listen:
    tasks.py        tasks:, and an upstream's own tasks: over it
    upstreams.py    upstreams:
    limits.py       limits:
    auth.py         auth: (oauth, its introspection)
    security.py     security:
    store.py        store: and replica:
    caching.py      caching:
    operations.py   shutdown:, tracing:, logging:
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from annotated_types import MinLen

from gateway.settings.rules import MIN_TOKEN_CHARS, Rule, loopback, url_prefix
from gateway.settings.schema.auth import Auth, Introspection, OAuth, StaticToken
from gateway.settings.schema.base import Secret, _Model, doc
from gateway.settings.schema.caching import Caching
from gateway.settings.schema.limits import Limits
from gateway.settings.schema.listen import Listen
from gateway.settings.schema.operations import Logging, Shutdown, Tracing
from gateway.settings.schema.push import PushedStatus, Webhook
from gateway.settings.schema.security import Security
from gateway.settings.schema.store import Replica, Store
from gateway.settings.schema.tasks import (
    NULLABLE_POLICY_KEYS,
    TaskMode,
    TaskPolicy,
    TaskPolicyOverride,
    Tasks,
    ToolEntry,
    UpstreamDefaults,
    UpstreamTasks,
    rename_problem,
)
from gateway.settings.schema.upstreams import (
    GATEWAY_PATHS,
    EnvName,
    EraChoice,
    Isolation,
    TokenExchange,
    Upstream,
)

__all__ = [
    "GATEWAY_PATHS",
    "LOOPBACK_HOSTS",
    "NULLABLE_POLICY_KEYS",
    "Auth",
    "Caching",
    "EnvName",
    "EraChoice",
    "Introspection",
    "Isolation",
    "Limits",
    "Listen",
    "Logging",
    "OAuth",
    "PushedStatus",
    "Replica",
    "Secret",
    "Security",
    "Settings",
    "Shutdown",
    "StaticToken",
    "Store",
    "TaskMode",
    "TaskPolicy",
    "TaskPolicyOverride",
    "Tasks",
    "TokenExchange",
    "ToolEntry",
    "Tracing",
    "Upstream",
    "UpstreamDefaults",
    "UpstreamTasks",
    "Webhook",
    "doc",
]


LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")


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
    webhooks: list[Webhook] = field(default_factory=list, metadata=doc(
        "where tasks' statuses are pushed (docs/push.md)"))
    webhooks_allowed: list[Annotated[str, Rule(url_prefix)]] = field(
        default_factory=list, metadata=doc(
            "URL prefixes a client may ask its own tasks' ends pushed to (none: clients may "
            "not); a loopback, private or link-local address only where the prefix names "
            "its host (docs/push.md)"))

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
        self._distinct_tool_names()

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
        given = {"bearer_tokens": [t.token for t in self.auth.static_tokens],
                 "admin_tokens": self.auth.admin_tokens}
        for key, tokens in given.items():
            for i, token in enumerate(tokens):
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

    def _distinct_tool_names(self) -> None:
        """Issue 53: each name a client sees is one tool's, on every upstream."""
        for name, up in self.upstreams.items():
            local = up.tasks.tools if up.tasks is not None else {}
            if (problem := rename_problem(self.tasks.tools, local, name)) is not None:
                raise ValueError(problem)

    def _distinct_paths(self) -> None:
        seen: dict[str, str] = {}
        for name, up in self.upstreams.items():
            if up.path in seen:
                raise ValueError(f"upstreams '{seen[up.path]}' and '{name}' share path {up.path}")
            seen[up.path] = name
