"""A person at oidc-provider's development login and consent pages, played over HTTP: from an
authorization URL to the redirect that carries the code (what a browser would do, minus the
browser)."""

from __future__ import annotations

import re
from urllib.parse import parse_qs, urljoin, urlsplit

import aiohttp

FORM = re.compile(r'<form[^>]*action="([^"]+)"[^>]*method="post"', re.I)
HIDDEN = re.compile(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', re.I)


async def authorize(auth_url: str, redirect_uri: str, login: str = "alice"
                    ) -> dict[str, str]:
    """Log in as `login`, consent, and return the redirect's query (code, state, iss)."""
    jar = aiohttp.CookieJar(unsafe=True)  # the server is an IP address: keep its cookies
    async with aiohttp.ClientSession(cookie_jar=jar) as http:
        url, method, form = auth_url, "GET", None
        for _ in range(12):
            async with http.request(method, url, data=form, allow_redirects=False) as resp:
                location = resp.headers.get("Location")
                page = await resp.text()
            if location is not None:
                url, method, form = urljoin(url, location), "GET", None
                if url.startswith(redirect_uri):
                    return {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}
                continue
            action = FORM.search(page)
            assert action is not None, f"no form at {url}: {page[:300]}"
            url, method = urljoin(url, action.group(1)), "POST"
            form = dict(HIDDEN.findall(page))
            if 'name="login"' in page:
                form |= {"login": login, "password": "any"}
    raise AssertionError("the authorization server never redirected back")
