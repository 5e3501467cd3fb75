"""Webhooks a client asks for its own task (docs/push.md): the `_meta` key of its
tools/call, checked against the operator's allow-list before anything is sent.

A client names `{url, secret}` under META_WEBHOOK; the gateway pushes that task's end
there, signed with the client's own secret. Allowed only where `webhooks_allowed` has a
prefix the URL starts with (at a path boundary: `https://hooks.example.com/` never admits
`https://hooks.example.com.evil.net/`), so plain http only where a prefix says http; a URL
with credentials in it is not taken. Whether its host may resolve to a loopback, private
or link-local address is decided here too (`exempt`: the prefix that admitted it names its
host) and checked at each delivery (sender.py), so a client cannot aim the gateway at the
gateway's own network by a name it controls. The key never reaches the server (shapes.py).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from gateway import errors
from gateway.protocol import mcp
from gateway.settings.rules import webhook_secret_bytes

MAX_URL_CHARS = 2048


def asked(params: dict[str, Any], allowed: tuple[str, ...]) -> dict[str, Any] | None:
    """The webhook a tools/call's params ask for, as a task keeps it (`url`, `secret`,
    `exempt`); None when they ask for none; InvalidParams when it cannot be taken."""
    meta = params.get("_meta")
    hook = meta.get(mcp.META_WEBHOOK) if isinstance(meta, dict) else None
    if hook is None:
        return None
    if not isinstance(hook, dict) or not isinstance(hook.get("url"), str) or \
            not isinstance(hook.get("secret"), str):
        raise _refused(f"_meta[{mcp.META_WEBHOOK!r}] is an object with url and secret")
    url, secret = hook["url"], hook["secret"]
    if len(url) > MAX_URL_CHARS:  # kept with its task and its deliveries: bounded
        raise _refused(f"a webhook URL is at most {MAX_URL_CHARS} characters")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (a port out of range or not a number raises here, not later)
    except ValueError:
        raise _refused(f"the webhook {errors.shown(url)} is not a URL") from None
    if parts.username is not None or parts.password is not None:
        raise _refused("a webhook URL with credentials in it is not taken")
    prefix = next((p for p in allowed if _under(url, p)), None)
    if prefix is None or not parts.hostname:
        raise _refused(f"the webhook {errors.shown(url)} is not under a prefix the gateway "
                       "allows (webhooks_allowed)")
    if webhook_secret_bytes(secret) is None:
        raise _refused("a webhook secret is whsec_ and the base64 of 24-64 bytes")
    return {"url": url, "secret": secret, "exempt": bool(urlsplit(prefix).hostname)}


def _under(url: str, prefix: str) -> bool:
    """Whether `url` starts with `prefix` at a boundary of its path."""
    if not url.startswith(prefix):
        return False
    rest = url[len(prefix):]
    return not rest or prefix.endswith("/") or rest[0] in "/?#"


def _refused(why: str) -> errors.InvalidParams:
    return errors.InvalidParams(f"Invalid params: {why}")


def taken(msg: dict[str, Any], allowed: tuple[str, ...]
          ) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """`msg` (a tools/call) without its webhook key, and the webhook it asked for (`asked`:
    InvalidParams when it cannot be taken). The message is new when it had one."""
    params = msg.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    if not isinstance(meta, dict) or mcp.META_WEBHOOK not in meta:
        return msg, None
    assert isinstance(params, dict)
    push = asked(params, allowed)
    rest = {k: v for k, v in meta.items() if k != mcp.META_WEBHOOK}
    params = {**params, "_meta": rest} if rest else \
        {k: v for k, v in params.items() if k != "_meta"}
    return {**msg, "params": params}, push
