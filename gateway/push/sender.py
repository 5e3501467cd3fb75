"""One delivery attempt over HTTP: a POST that never follows a redirect, bounded in time
(CONNECT_S to connect, TOTAL_S in all), judged by schedule.py.

A client's webhook (`Target.guarded`) is resolved here first, and refused (never tried
again) when any address its host resolves to is loopback, private, link-local, multicast
or otherwise not public: a client may not aim the gateway at the network it runs in (its
metadata service, its store, its admin pages) by a name whose DNS it controls. The POST
then goes to the address checked, not to a second lookup (no rebinding between the check
and the connection); TLS still verifies the certificate for the host's name.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import aiohttp
from yarl import URL

from gateway.push.endpoint import Delivery, Target
from gateway.push.schedule import Answer, judged

CONNECT_S, TOTAL_S = 5.0, 15.0  # a receiver's connection, and its whole answer
CLIENT_TOTAL_S = 5.0  # a client's receiver: a slow one holds the clients' lane less
_OPERATORS = aiohttp.ClientTimeout(total=TOTAL_S, connect=CONNECT_S)
_CLIENTS = aiohttp.ClientTimeout(total=CLIENT_TOTAL_S, connect=CONNECT_S)


class Sender:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._http: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self._http = aiohttp.ClientSession(timeout=_OPERATORS, auto_decompress=False)

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()

    async def post(self, target: Target, delivery: Delivery) -> Answer:
        assert self._http is not None
        url, name = URL(target.url), None
        headers = target.headers(delivery, self._clock())
        if target.guarded:
            pinned = await _public_address(target.url)
            if pinned is None:
                return Answer("refused")
            name, url = url.host, url.with_host(pinned)  # TLS: the name's certificate
            headers["host"] = urlsplit(target.url).netloc
        try:
            limit = _CLIENTS if target.guarded else _OPERATORS
            async with self._http.post(url, data=delivery.body, headers=headers,
                                       allow_redirects=False, server_hostname=name,
                                       timeout=limit) as resp:
                return judged(resp.status, resp.headers.get("Retry-After"), self._clock())
        except (aiohttp.ClientError, TimeoutError, OSError):
            return Answer("failed")


# Clients' names are resolved on threads of their own, within RESOLVE_S: a name server
# that never answers holds these, never the loop's default pool (upstreams, the store's
# reconnects, OAuth fetches, operators' webhooks resolve there).
RESOLVE_S = 5.0
_RESOLVER = ThreadPoolExecutor(max_workers=4, thread_name_prefix="webhook-dns")


async def _public_address(url: str) -> str | None:
    """An address of `url`'s host, when every address it resolves to is public; None
    when any is not (or it does not resolve in time)."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    lookup = functools.partial(socket.getaddrinfo, parts.hostname, port,
                               type=socket.SOCK_STREAM)
    try:
        found = await asyncio.wait_for(
            asyncio.get_running_loop().run_in_executor(_RESOLVER, lookup), RESOLVE_S)
    except (OSError, TimeoutError):
        return None
    addresses = [str(info[4][0]) for info in found]
    if not addresses or not all(_public(a) for a in addresses):
        return None
    return addresses[0]


# IPv6 forms that carry an IPv4 address a router may reach (NAT64 well-known and local-use
# prefixes, the deprecated IPv4-compatible ::/96): judged by that IPv4 address.
_CARRIERS = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"),
             ipaddress.ip_network("::/96"))


def _public(address: str) -> bool:
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(
        address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        carried = ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
        if carried is None and any(ip in net for net in _CARRIERS):
            carried = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if carried is not None:
            ip = carried
    return ip.is_global and not ip.is_multicast
