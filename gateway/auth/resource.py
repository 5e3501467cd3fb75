"""This gateway as an OAuth protected resource: its metadata document (RFC 9728) and the
`WWW-Authenticate` challenges that lead a client to it.

spec (MCP authorization, Authorization Server Location): a 401 MUST carry
`WWW-Authenticate` with `resource_metadata` (RFC 9728 section 5.1); MCP 2025-11-25 adds
`scope` to it where scopes are needed, and the scope challenge: a token lacking a scope gets
403 `error="insufficient_scope"` with the scopes to ask for (RFC 6750 section 3.1).
"""

from __future__ import annotations

from typing import Any

from yarl import URL

from gateway.errors import AuthCause
from gateway.settings.schema import OAuth

WELL_KNOWN = "/.well-known/oauth-protected-resource"


class ProtectedResource:
    def __init__(self, conf: OAuth, tool_scopes: frozenset[str]) -> None:
        self.origin = URL(conf.resource).origin()
        self.required = sorted(conf.scopes)
        self.document: dict[str, Any] = {
            "resource": conf.resource,
            "authorization_servers": list(conf.issuers),
            "bearer_methods_supported": ["header"],
            # No `resource_signing_alg_values_supported`: RFC 9728 section 2 has it for what
            # the resource signs (its responses), and this gateway signs nothing.
            "resource_name": "MCP task gateway",
        }
        # Left out when empty: clients (the Python SDK) would ask for an empty scope then,
        # instead of falling back to what the authorization server offers.
        if scopes := sorted(set(conf.scopes) | tool_scopes):
            self.document["scopes_supported"] = scopes

    def metadata_url(self, path: str) -> str:
        """Where the metadata of the endpoint at `path` is (RFC 9728 section 3.1: the
        well-known part goes between the host and the path)."""
        suffix = "" if path in ("", "/") else path
        return str(self.origin.with_path(WELL_KNOWN + suffix))

    def unauthorized(self, path: str, cause: AuthCause, description: str) -> str:
        """The 401 challenge. A token that was sent and refused is `invalid_token`."""
        params = [("resource_metadata", self.metadata_url(path))]
        if self.required:
            params.append(("scope", " ".join(self.required)))
        if cause != "missing":
            params += [("error", "invalid_token"), ("error_description", description)]
        return _challenge(params)

    def insufficient_scope(self, path: str, scopes: list[str], description: str) -> str:
        return _challenge([("error", "insufficient_scope"),
                           ("scope", " ".join(sorted({*self.required, *scopes}))),
                           ("resource_metadata", self.metadata_url(path)),
                           ("error_description", description)])


def scope_challenge(scopes: list[str]) -> str:
    """The 403 challenge of a static token lacking `scopes` (no metadata to point to):
    RFC 6750 section 3.1's error and the scopes the request needs."""
    return _challenge([("error", "insufficient_scope"), ("scope", " ".join(scopes))])


def _challenge(params: list[tuple[str, str]]) -> str:
    # RFC 6750 3: auth-param values are quoted strings, and error_description holds only
    # %x20-21 / %x23-5B / %x5D-7E: a description may name what a client sent (a tool's
    # name), so `"` becomes `'` and `\`, controls and non-ASCII become `?`.
    return "Bearer " + ", ".join(f'{k}="{_quotable(v)}"' for k, v in params)


def _quotable(value: str) -> str:
    value = value.replace('"', "'")
    if value.isascii() and value.isprintable() and "\\" not in value:
        return value
    return "".join(c if " " <= c <= "~" and c != "\\" else "?" for c in value)


__all__ = ["WELL_KNOWN", "ProtectedResource", "scope_challenge"]
