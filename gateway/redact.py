"""URLs as the gateway shows them: on /readyz and /status and in log events, for operators;
never in the errors clients read (`no_urls`: a host and port tell the inside of the network).

A configured URL may carry credentials: userinfo (`https://user:password@host/`) or a query
(`?api_key=...`); a fragment has no business being shown either. Shown, a URL keeps its
scheme, host, port and path, nothing else (issue 29: URLs shown anywhere without userinfo
or query). The syntax is RFC 3986, section 3: the authority ends at the first `/`, `?` or
`#`, and userinfo is what precedes its last `@`.
"""

from __future__ import annotations

import re

# A URL inside free text (an exception's message, say): a scheme, then `://`, then anything
# up to whitespace, a quote or an angle bracket (how messages and reprs delimit URLs).
_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s\"'<>]+")
_QUERY_OR_FRAGMENT = re.compile(r"[?#]")


def url(value: str) -> str:
    """`value` without userinfo, query or fragment; a string without `://` loses its query
    and fragment only."""
    scheme, sep, rest = value.partition("://")
    if not sep:
        return _QUERY_OR_FRAGMENT.split(value, maxsplit=1)[0]
    rest = _QUERY_OR_FRAGMENT.split(rest, maxsplit=1)[0]
    authority, slash, path = rest.partition("/")
    return f"{scheme}://{authority.rpartition('@')[2]}{slash}{path}"


def text(value: str) -> str:
    """`value` with every URL in it shown as `url` shows it."""
    return _IN_TEXT.sub(lambda m: url(m.group()), value)


def no_urls(value: str) -> str:
    """`value` with every URL in it left out (`<url>` in its place): for what clients read,
    where even a URL without credentials tells where the gateway's upstreams are."""
    return _IN_TEXT.sub("<url>", value)


__all__ = ["no_urls", "text", "url"]
