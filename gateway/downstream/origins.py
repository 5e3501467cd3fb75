"""The Origin allow-list (`security.allowed_origins`) and the CORS answers it grants: a
preflight's, and the headers every response to an allowed origin carries.

spec (Streamable HTTP, Security Warning): servers MUST validate the Origin header of every
incoming connection (DNS rebinding); the refusal itself is the screen's (screen.py).
"""

from __future__ import annotations

from aiohttp import web
from yarl import URL

from gateway.protocol import mcp

CORS_EXPOSE = ", ".join((mcp.H_SESSION, mcp.H_PROTOCOL, "WWW-Authenticate"))
CORS_ALLOW_HEADERS = ", ".join((
    "Content-Type", mcp.H_ACCEPT, mcp.H_AUTH, mcp.H_SESSION, mcp.H_PROTOCOL, mcp.H_LAST_EVENT,
    "Mcp-Method", "Mcp-Name"))


class Origins:
    """The origins allowed: each a scheme and host, with a port where it names one; `*`:
    any."""

    def __init__(self, allowed: list[str]) -> None:
        self.any = "*" in allowed
        self.urls = [URL(o) for o in allowed if o != "*"]

    def allows(self, origin: str) -> bool:
        if self.any:
            return True
        try:
            url = URL(origin)
        except ValueError:
            return False
        for allowed in self.urls:
            if (url.scheme, url.host) == (allowed.scheme, allowed.host) and (
                    allowed.explicit_port is None or allowed.port == url.port):
                return True
        return False

    @staticmethod
    def preflight(request: web.Request) -> web.Response:
        """The answer to a CORS preflight from an allowed origin: it carries no credential,
        so it is answered before any is asked for."""
        return web.Response(status=204, headers={
            "Access-Control-Allow-Methods": "GET, POST, DELETE, OPTIONS",
            "Access-Control-Allow-Headers": request.headers.get(
                "Access-Control-Request-Headers", CORS_ALLOW_HEADERS),
            "Access-Control-Max-Age": "86400"})

    def expose(self, response: web.StreamResponse, origin: str) -> None:
        """The CORS headers of a response to a request from `origin`, if it is allowed."""
        if self.allows(origin):
            response.headers["Access-Control-Allow-Origin"] = origin
            response.headers["Access-Control-Expose-Headers"] = CORS_EXPOSE
            response.headers["Vary"] = "Origin"


__all__ = ["CORS_ALLOW_HEADERS", "CORS_EXPOSE", "Origins"]
