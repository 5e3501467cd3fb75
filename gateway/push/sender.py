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
import ipaddress
import socket
import time
from collections.abc import Callable
from urllib.parse import urlsplit

import aiohttp
from yarl import URL

from gateway.push.endpoint import Delivery, Target
from gateway.push.schedule import Answer, judged

CONNECT_S, TOTAL_S = 5.0, 15.0  # a receiver's connection, and its whole answer


class Sender:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._http: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(
            total=TOTAL_S, connect=CONNECT_S), auto_decompress=False)

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
            async with self._http.post(url, data=delivery.body, headers=headers,
                                       allow_redirects=False, server_hostname=name) as resp:
                return judged(resp.status, resp.headers.get("Retry-After"), self._clock())
        except (aiohttp.ClientError, TimeoutError, OSError):
            return Answer("failed")


async def _public_address(url: str) -> str | None:
    """An address of `url`'s host, when every address it resolves to is public; None
    when any is not (or it does not resolve)."""
    parts = urlsplit(url)
    try:
        found = await asyncio.get_running_loop().getaddrinfo(
            parts.hostname, parts.port or (443 if parts.scheme == "https" else 80),
            type=socket.SOCK_STREAM)
    except OSError:
        return None
    addresses = [str(info[4][0]) for info in found]
    if not addresses or not all(_public(a) for a in addresses):
        return None
    return addresses[0]


def _public(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast
