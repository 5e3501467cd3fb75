"""The `listen:` section: where the gateway serves MCP clients (address, TLS, the operator
listener) and how it keeps the streams of slow calls alive.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from annotated_types import Ge, Le

from gateway.settings.schema.base import _Model, doc


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
