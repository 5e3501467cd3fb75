"""Failed authentications per client address (`auth.failures_per_minute`): a token bucket
per peer address, bounded (ratelimit.py). Each failed authentication takes a token; once an
address has none left, its requests are refused (429) before their credentials are checked,
valid ones too: were a valid token let through, a guesser would still learn from the
answer which guess was right, and each bogus opaque token would still cost an
introspection call. Successful authentications take nothing, so a client that does not
fail never meets the limit.

The address is the socket's peer, or, where that peer is a proxy named in
`security.trusted_proxies`, the client it names in X-Forwarded-For (downstream/peers.py); a
forwarding header from anyone else is never believed (a client chooses those). An IPv6
address counts by its /64, the block one host is usually given (else a host would have 2^64
budgets). Behind a reverse proxy not named there every client shares the proxy's address:
docs/security.md says what to set then.
"""

from __future__ import annotations

import functools
import ipaddress
import time
from collections.abc import Callable

from gateway.errors import TooManyFailures
from gateway.ratelimit import RateLimiter

MAX_PEERS = 10_000  # addresses remembered (least recently failed forgotten first)


class FailedAuths:
    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic,
                 max_peers: int = MAX_PEERS) -> None:
        self.limiter = RateLimiter(per_minute / 60, per_minute, clock, max_peers)

    def admit(self, peer: str | None) -> None:
        """Nothing when `peer` may try; TooManyFailures when it spent its failures."""
        if peer is not None and (wait := self.limiter.peek_s(_block(peer))) > 0:
            raise TooManyFailures(wait)

    def failed(self, peer: str | None) -> None:
        """`peer` failed to authenticate once more."""
        if peer is not None:
            self.limiter.wait_s(_block(peer))


def _block(peer: str) -> str:
    """What a peer address counts as: itself, or an IPv6 address's /64. Every request asks:
    an IPv4 address, as the socket gives it, is itself without parsing."""
    return peer if ":" not in peer else _v6_block(peer)


@functools.lru_cache(maxsize=1024)
def _v6_block(peer: str) -> str:
    try:
        address = ipaddress.ip_address(peer.split("%", 1)[0])
    except ValueError:
        return peer
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


__all__ = ["FailedAuths"]
