"""The `security:` section: browser origins, Host names, the key that seals requestState,
trusted reverse proxies, and serving beyond loopback without authentication.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from annotated_types import MinLen

from gateway.settings.rules import Rule, addresses, host_names
from gateway.settings.schema.base import _Model, doc


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
