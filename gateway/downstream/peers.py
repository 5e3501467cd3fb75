"""Where a request comes from and what it was addressed to, as the HTTP boundary checks them:
the Host header against the names the gateway serves (`security.allowed_hosts`); whether
the peer is this machine, unproxied (who may read the operator's routes when no auth is
configured at all); and the client's address behind a trusted reverse proxy
(`security.trusted_proxies`), which the failed-auth limit and the audit log count.

DNS rebinding (spec: Streamable HTTP, Security Warning): a page on an attacker's name that
resolves to 127.0.0.1 is same-origin to the browser, which sends no Origin on its GETs, but
its Host header still names the attacker's host; checking Host closes what the Origin check
leaves open.
"""

from __future__ import annotations

import ipaddress

from aiohttp import web

# Headers a reverse proxy adds: a loopback peer that carries one is a proxy on this machine
# speaking for someone else (RFC 7239, and the de facto X-Forwarded-For and X-Real-IP).
FORWARDING = ("Forwarded", "X-Forwarded-For", "X-Real-IP")


class Hosts:
    """The Host names served: each a name (any port) or name:port; None: any. With
    `addresses`, any IP address too: a DNS rebinding attack, which the Host check is for,
    names a host by a name it controls, never by an address, and a scraper that reaches a
    pod or a host by its address names that address (the operator listener)."""

    def __init__(self, allowed: list[str] | None, addresses: bool = False) -> None:
        self.any = allowed is None
        self.allowed = {split(h.lower()) for h in allowed or ()}
        self.addresses = addresses
        self._last: str | None = None  # the last Host allowed, as it came

    def allows(self, header: str | None) -> bool:
        """Whether a request with this Host header is served. None (no Host: HTTP/1.0, or
        a tool rather than a browser, which always sends one) is."""
        if self.any or header is None or header == self._last:
            return True
        name, port = split(header.lower())
        named = (name, None) in self.allowed or (port is not None and (name, port) in
                                                 self.allowed)
        if named or (self.addresses and _named_address(name)):
            self._last = header  # a client sends the same Host on every request
            return True
        return False


def split(host: str) -> tuple[str, str | None]:
    """(name, port or None) of a Host value; `[::1]:8080` keeps its brackets (RFC 9110,
    section 7.2: uri-host as in a URI). A trailing dot names the same host."""
    if host.startswith("["):
        name, _, rest = host.partition("]")
        port = rest[1:] if rest.startswith(":") and rest[1:].isdigit() else None
        return name + "]", port
    name, colon, port = host.rpartition(":")
    if colon and port.isdigit() and ":" not in name:
        return name.rstrip("."), port
    return host.rstrip("."), None


def local_peer(request: web.Request) -> bool:
    """Whether the socket's peer is a loopback address and the request names no proxy. The
    socket, never a header, says where it comes from (a header can only take that away)."""
    peer = request.transport.get_extra_info("peername") if request.transport else None
    if not isinstance(peer, tuple | list) or not peer:
        return False
    try:
        address = ipaddress.ip_address(str(peer[0]).split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback and not any(h in request.headers for h in FORWARDING)


class Clients:
    """The client's address of a request: the socket's peer, unless that peer is a trusted
    proxy; then the rightmost hop of X-Forwarded-For, the address that proxy appended (it
    was reached from there), and nothing to its left: those entries are the client's own
    words, even where they name addresses inside the trusted ranges (issue 49: a client on
    a trusted LAN wrote the address the failed-auth limit charged). One hop exactly: a chain
    of proxies is trusted through its last one only. A hop that is not an address: the
    proxy's own. No proxy trusted (the default): the header is ignored."""

    HEADER = "X-Forwarded-For"

    def __init__(self, trusted: list[str]) -> None:
        self.trusted = [ipaddress.ip_network(t, strict=False) for t in trusted if t]

    def address(self, request: web.Request) -> str | None:
        peer = request.remote
        if not self.trusted or peer is None or not self._trusted(peer):
            return peer
        hops = [h.strip() for h in ",".join(request.headers.getall(self.HEADER, ())).split(",")]
        appended = _without_port(hops[-1]) if hops else ""
        return appended if _address(appended) is not None else peer

    def _trusted(self, value: str) -> bool:
        address = _address(value)
        return address is not None and any(address in net for net in self.trusted)


def _without_port(hop: str) -> str:
    """A hop as some balancers write it, `ip:port` or `[ipv6]:port`, as its address."""
    if hop.startswith("["):
        return hop[1:hop.find("]")] if "]" in hop else hop
    host, colon, port = hop.rpartition(":")
    return host if colon and "." in host and port.isdigit() else hop


def _named_address(name: str) -> bool:
    """Whether a Host's name is an IP address (an IPv6 one in brackets, RFC 3986)."""
    return name.startswith("[") == name.endswith("]") and \
        _address(name[1:-1] if name.startswith("[") else name) is not None


def _address(value: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        address = ipaddress.ip_address(value.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


__all__ = ["FORWARDING", "Clients", "Hosts", "local_peer", "split"]
