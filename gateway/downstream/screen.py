"""The checks a request meets before any credential is asked for, in this order: its Host
(peers.py: DNS rebinding), its headers' bytes, its Content-Encoding, its Origin (origins.py);
a CORS preflight from an allowed origin is answered here. Each refusal is raised as the
`ProtocolError` that names it; the guard answers it.
"""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web
from yarl import URL

from gateway import errors
from gateway.downstream.origins import Origins
from gateway.downstream.peers import Hosts
from gateway.protocol import mcp


class Screen:
    def __init__(self, hosts: Hosts, origins: Origins) -> None:
        self.hosts = hosts
        self.origins = origins

    def check(self, request: web.Request) -> web.Response | None:
        """None when the request may go on to its credentials; a CORS preflight's answer.
        MisdirectedRequest (421), InvalidRequest (400), UnsupportedMediaType (415) or
        ForbiddenOrigin (403) when it may not."""
        headers = request.headers
        host = headers.get("Host")
        if (target := request.raw_path)[:1] != "/":
            host = _authority(target, host)
        if not self.hosts.allows(host):
            raise _misdirected(host)
        if (bad := _undecodable(headers)) is not None:
            raise _not_text(bad)
        if headers.get("Content-Encoding", "identity").lower() != "identity":
            # No MCP client compresses what it sends; a compressed body is not inflated.
            raise errors.UnsupportedMediaType(
                "Unsupported Media Type: send the body without Content-Encoding")
        origin = headers.get(mcp.H_ORIGIN)
        # spec (Streamable HTTP, Security Warning): servers MUST validate Origin (DNS rebinding).
        if origin is not None and not self.origins.allows(origin):
            raise errors.ForbiddenOrigin(f"Forbidden: origin {origin} is not allowed")
        if request.method == "OPTIONS" and origin is not None:
            return self.origins.preflight(request)
        return None


def _authority(target: str, host: str | None) -> str | None:
    """The name a request whose target is not a path is for: an absolute-form target's
    (`POST http://name/mcp`) own authority (RFC 9112, 3.2.2: an origin server MUST ignore Host
    then and use the target's); `host` for the asterisk form (`OPTIONS *`)."""
    return URL(target).raw_authority if "://" in target else host


def _misdirected(host: str | None) -> errors.MisdirectedRequest:
    """421 for a Host this gateway does not serve (DNS rebinding: peers.py); the name is
    echoed only when it is plain text."""
    named = f" {errors.shown(host)}" if host and host.isascii() and host.isprintable() else ""
    return errors.MisdirectedRequest(
        f"Misdirected Request: this gateway does not serve the host{named} "
        "(security.allowed_hosts)")


def _not_text(name: str) -> errors.ProtocolError:
    """The refusal of a header whose bytes are not UTF-8. Checked once, in the screen: every
    later use (a token compare, an error that names a header, a header forwarded upstream)
    may assume text. The value is never echoed: it may be a token. spec (Streamable HTTP,
    Security Warning): an invalid Origin MUST get 403."""
    if name.lower() == mcp.H_ORIGIN.lower():
        return errors.ForbiddenOrigin("Forbidden: the Origin header is not valid UTF-8")
    return errors.InvalidRequest(f"Bad Request: the {name} header is not valid UTF-8")


def _undecodable(headers: Mapping[str, str]) -> str | None:
    """The name of a header whose bytes are not UTF-8 (aiohttp keeps them as surrogate
    escapes, which cannot be encoded again), if any."""
    if "".join(headers.values()).isascii():  # one pass in C over all of them (every request)
        return None
    for name, value in headers.items():
        if not value.isascii():
            try:
                value.encode()
            except UnicodeEncodeError:
                return name
    return None


__all__ = ["Screen"]
