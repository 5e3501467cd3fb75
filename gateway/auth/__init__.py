"""Who is calling: static bearer tokens and OAuth 2.1 access tokens (MCP authorization spec)
turned into a `Principal` (the owner of tasks, sessions and calls, and its scopes), the
protected resource metadata (RFC 9728) and the challenges that point clients to it.

Nothing here knows MCP messages; the HTTP guard (downstream/boundary.py) asks `Authenticator`.
"""

from gateway.auth.authenticator import Authenticator
from gateway.auth.principal import ANONYMOUS, Principal

__all__ = ["ANONYMOUS", "Authenticator", "Principal"]
