"""The `store:` and `replica:` sections: where tasks live (memory, or Redis shared by
replicas), and this process among the replicas that share a store.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

from annotated_types import Ge, MaxLen, MinLen

from gateway.settings.rules import EmptyIsNull, Matches, Rule, host_ports
from gateway.settings.schema.base import _Model, doc


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
