"""OAuth at its edges (issue 30, item 5), against an introspection endpoint and an issuer's
metadata served by the test itself (so it can answer what oidc-provider never would): an
answer without `aud`, a client named like a user, an answer for another issuer, a bogus
token sent again and again, keys served in clear beyond loopback, and an address that keeps
failing to authenticate."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import structlog
from aiohttp import web
from conftest import GROUP_ADMIN, OPERATOR
from idp import Key
from test_operations import scrape, value
from test_tasks import POLICY, call, tasks_op, wait_for

RESOURCE = "http://gw.test/mcp"
ISSUER, OTHER = "http://127.0.0.1:9", "http://127.0.0.2:9"  # never asked: tokens are opaque
TASKS = {**POLICY, "tools": {**POLICY["tools"], "sleep": {"mode": "always"}}}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


class Introspection:
    """An RFC 7662 endpoint answering, for each token, what the test put in `answers`
    (else `{"active": false}`), counting the calls it gets."""

    def __init__(self, answers: dict[str, dict[str, Any]]) -> None:
        self.answers = answers
        self.calls = 0

    async def handle(self, request: web.Request) -> web.Response:
        self.calls += 1
        token = str((await request.post()).get("token", ""))
        answer = self.answers.get(token, {"active": False})
        return web.json_response({"exp": int(time.time()) + 60, "scope": "tools", **answer}
                                 if answer.get("active") else answer)


@asynccontextmanager
async def introspection(aiohttp_server: Any, answers: dict[str, dict[str, Any]]
                        ) -> AsyncIterator[tuple[str, Introspection]]:
    endpoint = Introspection(answers)
    app = web.Application()
    app.router.add_post("/introspect", endpoint.handle)
    server = await aiohttp_server(app)
    yield str(server.make_url("/introspect")), endpoint


def oauth(url: str, **extra: Any) -> dict[str, Any]:
    introspect = {"url": url, "client_id": "gateway", "client_secret": "s",
                  **extra.pop("introspection", {})}
    return {"oauth": {"resource": RESOURCE, "issuers": [ISSUER, OTHER],
                      "introspection": introspect, **extra}}


async def test_an_introspection_answer_without_aud_is_refused_unless_opted_out(
        gateway, aiohttp_server, http) -> None:
    """A JWT must name this gateway in `aud` (RFC 8707); so must an introspection answer,
    unless `require_audience: false` says the server issues tokens for this gateway alone."""
    answers = {"no-aud": {"active": True, "sub": "alice"}}
    async with introspection(aiohttp_server, answers) as (url, _):
        strict = await gateway(tasks=TASKS, auth=oauth(url))
        refused = await call(http, strict, "echo", {"text": "x"}, headers=bearer("no-aud"))
        assert refused.status == 401, refused.body
        assert "not issued for this resource" in refused.body["error"]["message"]
        lax = await gateway(tasks=TASKS, auth=oauth(
            url, introspection={"require_audience": False}))
        ok = await call(http, lax, "echo", {"text": "x"}, headers=bearer("no-aud"))
        assert ok.status == 200, ok.body


async def test_a_client_named_like_a_user_does_not_own_the_users_tasks(
        gateway, aiohttp_server, http) -> None:
    """`client_id` stands for a client, `sub` for a user: two namespaces (RFC 7662 2.2)."""
    answers = {"user": {"active": True, "sub": "alice", "aud": RESOURCE},
               "client": {"active": True, "client_id": "alice", "aud": RESOURCE},
               "client-again": {"active": True, "client_id": "alice", "aud": RESOURCE}}
    async with introspection(aiohttp_server, answers) as (url, _):
        gw = await gateway(tasks=TASKS, auth=oauth(url))
        for owner, stranger in (("user", "client"), ("client", "user")):
            task = (await call(http, gw, "sleep", {"ms": 100}, headers=bearer(owner))
                    ).body["result"]
            foreign = await tasks_op(http, gw, "tasks/get", task["taskId"], bearer(stranger))
            unknown = await tasks_op(http, gw, "tasks/get", "no-such-task", bearer(stranger))
            assert foreign.status == unknown.status == 400, foreign.body
            assert foreign.body["error"]["message"] == unknown.body["error"]["message"]
            await wait_for(http, gw, task["taskId"], "completed", bearer(owner))
        # A client's tokens still share its tasks among themselves.
        task = (await call(http, gw, "sleep", {"ms": 100}, headers=bearer("client"))
                ).body["result"]
        await wait_for(http, gw, task["taskId"], "completed", bearer("client-again"))


async def test_the_introspection_endpoint_vouches_for_one_issuer(gateway, aiohttp_server,
                                                                 http) -> None:
    answers = {"other": {"active": True, "sub": "alice", "aud": RESOURCE, "iss": OTHER},
               "first": {"active": True, "sub": "alice", "aud": RESOURCE, "iss": ISSUER}}
    async with introspection(aiohttp_server, answers) as (url, _):
        gw = await gateway(tasks=TASKS, auth=oauth(url))  # the first issuer's by default
        refused = await call(http, gw, "echo", {"text": "x"}, headers=bearer("other"))
        assert refused.status == 401
        assert "issuer is not accepted" in refused.body["error"]["message"]
        assert (await call(http, gw, "echo", {"text": "x"}, headers=bearer("first"))
                ).status == 200
        bound = await gateway(tasks=TASKS, auth=oauth(url, introspection={"issuer": OTHER}))
        assert (await call(http, bound, "echo", {"text": "x"}, headers=bearer("other"))
                ).status == 200
        assert (await call(http, bound, "echo", {"text": "x"}, headers=bearer("first"))
                ).status == 401


async def test_a_bogus_token_sent_again_is_not_introspected_again(gateway, aiohttp_server,
                                                                  http) -> None:
    async with introspection(aiohttp_server, {}) as (url, endpoint):
        gw = await gateway(tasks=TASKS, auth=oauth(url))
        for _ in range(5):
            reply = await call(http, gw, "echo", {"text": "x"}, headers=bearer("bogus"))
            assert reply.status == 401 and "not active" in reply.body["error"]["message"]
        assert endpoint.calls == 1


async def test_keys_in_clear_beyond_loopback_are_not_fetched(gateway, aiohttp_server, http
                                                             ) -> None:
    """The issuer is on loopback (allowed), its metadata names a jwks_uri elsewhere in
    plain http: refused (503, logged), never fetched."""
    async def metadata(request: web.Request) -> web.Response:
        return web.json_response({"issuer": str(request.url.origin()),
                                  "jwks_uri": "http://keys.example/jwks"})

    app = web.Application()
    app.router.add_get("/.well-known/oauth-authorization-server", metadata)
    app.router.add_get("/.well-known/openid-configuration", metadata)
    issuer = str((await aiohttp_server(app)).make_url("")).rstrip("/")
    gw = await gateway(auth={"oauth": {"resource": RESOURCE, "issuers": [issuer],
                                       "fetch_timeout_ms": 300}})
    token = Key("k1").sign({"iss": issuer, "sub": "me", "aud": RESOURCE,
                            "exp": int(time.time()) + 60})
    with structlog.testing.capture_logs() as events:
        reply = await call(http, gw, "echo", {"text": "x"}, headers=bearer(token))
    assert reply.status == 503, reply.body
    reasons = [e["reason"] for e in events if e["event"] == "auth.server_unavailable"]
    assert reasons and all("plain http beyond loopback" in r for r in reasons)


async def test_an_address_that_keeps_failing_is_slowed_down(gateway, http) -> None:
    """`auth.failures_per_minute` failed authentications, then 429 with Retry-After for
    every request of that address, a valid token's too (else the answer would still tell a
    guesser which guess was right); successes never count, other addresses go on."""
    good = "a-valid-static-token-of-32-chars!"
    gw = await gateway(tasks=TASKS, auth={"bearer_tokens": [good], "failures_per_minute": 6,
                                          "admin_tokens": [GROUP_ADMIN]})
    # The guesser calls from another loopback address than the test's own client.
    connector = aiohttp.TCPConnector(local_addr=("127.0.0.2", 0))
    async with aiohttp.ClientSession(connector=connector) as guesser:
        for _ in range(20):  # successes and requests without a credential take nothing
            reply = await call(guesser, gw, "echo", {"text": "x"}, headers=bearer(good))
            assert reply.status == 200
        assert (await call(guesser, gw, "echo", {"text": "x"})).status == 401
        for i in range(6):
            reply = await call(guesser, gw, "echo", {"text": "x"}, headers=bearer(f"guess-{i}"))
            assert reply.status == 401, i
        with structlog.testing.capture_logs() as events:
            throttled = await call(guesser, gw, "echo", {"text": "x"},
                                   headers=bearer("guess-6"))
            valid = await call(guesser, gw, "echo", {"text": "x"}, headers=bearer(good))
    for reply in (throttled, valid):
        assert reply.status == 429, reply.body
        assert 1 <= int(reply.headers["Retry-After"]) <= 10  # 6 a minute: one per 10 s
        assert reply.body["error"]["data"]["retryAfterMs"] > 0
    assert [(e["reason"], e["remote"]) for e in events if e["event"] == "auth.failed"] == [
        ("rate", "127.0.0.2"), ("rate", "127.0.0.2")]
    assert (await call(http, gw, "echo", {"text": "x"}, headers=bearer(good))).status == 200
    samples = await scrape(http, gw, OPERATOR)
    assert value(samples, "mcp_gateway_rejections_total", reason="auth", cause="rate") == 2
    assert value(samples, "mcp_gateway_rejections_total", reason="auth", cause="wrong") == 6
