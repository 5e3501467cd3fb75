"""HTTP to the authorization servers (discovery, keys, introspection): one client session,
a timeout on everything, and one error for every way such a server can fail us.

A server that hangs, refuses, answers non-200 or answers something that is not a JSON
object is the gateway's dependency being down: `AuthUnavailable` (503), logged once per
failure with the URL (never a credential), never a 500 and never a request let through.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson

from gateway import redact
from gateway.errors import AuthUnavailable
from gateway.observability import log

MAX_DOCUMENT_BYTES = 1 << 20  # metadata, key sets and introspection answers are small


class Fetcher:
    def __init__(self, timeout_s: float) -> None:
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def get(self, url: str) -> dict[str, Any]:
        return await self._json("GET", url)

    async def post_form(self, url: str, form: dict[str, str], authorization: str
                        ) -> dict[str, Any]:
        return await self._json("POST", url, data=form,
                                headers={"Authorization": authorization})

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _json(self, method: str, url: str, **kwargs: Any) -> dict[str, Any]:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self.timeout)
        try:
            headers = {"Accept": "application/json", **kwargs.pop("headers", {})}
            async with self._session.request(method, url, headers=headers,
                                             allow_redirects=False, **kwargs) as resp:
                if resp.status != 200:
                    raise unavailable(url, f"HTTP {resp.status}")
                body = await resp.content.read(MAX_DOCUMENT_BYTES + 1)
        except TimeoutError:
            raise unavailable(url, "timed out") from None
        except aiohttp.ClientError as exc:
            raise unavailable(url, type(exc).__name__) from None
        if len(body) > MAX_DOCUMENT_BYTES:
            raise unavailable(url, "answer too large")
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise unavailable(url, "answer is not JSON") from None
        if not isinstance(doc, dict):
            raise unavailable(url, "answer is not a JSON object")
        return doc


def unavailable(url: str, why: str) -> AuthUnavailable:
    """The error for a server at `url` that failed us, logged (without credentials)."""
    shown = redact.url(url)
    log.warning("auth.server_unavailable", url=shown, reason=why)
    return AuthUnavailable()


__all__ = ["Fetcher", "unavailable"]
