"""Push's pure parts (gateway/push): what a receiver's answer means, when a delivery is tried
again, and the event's id and body."""

from __future__ import annotations

import email.utils
import random

import orjson
import pytest

from gateway.push.schedule import JITTER, RETRY_S, Answer, judged, next_wait
from gateway.tasks.dialects.webhook import event, webhook_id
from gateway.tasks.model import Status, Task


@pytest.mark.parametrize(("status", "outcome"), [
    (200, "delivered"), (204, "delivered"), (410, "gone"), (429, "retry"), (503, "retry"),
    (301, "failed"), (307, "failed"), (400, "failed"), (500, "failed")])
def test_a_receivers_answer_is_judged(status: int, outcome: str) -> None:
    assert judged(status, None, 0.0).outcome == outcome


def test_retry_after_is_seconds_or_a_date_within_an_hour() -> None:
    now = 1_000_000.0
    assert judged(503, "7", now).retry_after_s == 7
    assert judged(429, "0", now).retry_after_s == 1  # at least a second
    assert judged(503, "99999", now).retry_after_s == 3600
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert judged(503, date, now).retry_after_s == pytest.approx(30, abs=1)
    assert judged(503, "soon", now).retry_after_s is None
    assert judged(500, "7", now).retry_after_s is None  # only 429 and 503 ask for a wait


def test_the_schedule_backs_off_with_jitter_then_gives_up() -> None:
    rand = random.Random(7)
    failed = Answer("failed", 500)
    waits = [next_wait(n, failed, rand) for n in range(1, len(RETRY_S) + 2)]
    assert waits[-1] is None  # given up after the last
    for wait, base in zip(waits, RETRY_S, strict=False):
        assert wait is not None and base * (1 - JITTER) <= wait <= base * (1 + JITTER)
    assert next_wait(1, Answer("retry", 503, 42.0)) == 42.0  # the receiver's own wait


def test_an_event_is_thin_and_its_id_stable_per_task_and_status() -> None:
    task = Task("t-1", "alice-token", "deploy", "extension", 60_000, 500, upstream="main",
                created_at=1_700_000_000.0)
    task.result = b'{"content":[{"type":"text","text":"the result"}]}'
    task.move(Status.COMPLETED, now=1_700_000_001.0)
    body = orjson.loads(event(task, None, 1_700_000_002.0))
    assert body["type"] == "task.completed"
    assert set(body["data"]) == {"taskId", "status", "upstream", "tool", "createdAt",
                                 "lastUpdatedAt", "ttl", "pollInterval", "owner"}
    assert "alice-token" not in str(body) and "the result" not in str(body)
    assert webhook_id("t-1", "completed") == webhook_id("t-1", "completed")
    assert webhook_id("t-1", "completed") != webhook_id("t-1", "failed")
    assert webhook_id("t-1", "completed") != webhook_id("t-2", "completed")


SECRET = "whsec_" + "QUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUE="


def asked_for(url: str, secret: str = SECRET) -> dict[str, object]:
    return {"name": "t", "_meta": {"mcp-task-gateway/webhook": {"url": url, "secret": secret}}}


@pytest.mark.parametrize(("url", "allowed", "exempt"), [
    ("https://hooks.example.com/a", ("https://hooks.example.com/",), True),
    ("https://hooks.example.com/a?x=1", ("https://hooks.example.com",), True),
    ("https://any.example.net/x", ("https://",), False),
    ("http://10.0.0.5:8080/h", ("http://10.0.0.5:8080/",), True)])
def test_a_clients_webhook_under_an_allowed_prefix_is_taken(url, allowed, exempt) -> None:
    from gateway.push.client import asked

    assert asked(asked_for(url), allowed) == {"url": url, "secret": SECRET, "exempt": exempt}


@pytest.mark.parametrize(("url", "allowed"), [
    ("https://hooks.example.com.evil.net/", ("https://hooks.example.com",)),
    ("http://hooks.example.com/a", ("https://hooks.example.com/",)),  # http: not said
    ("https://user:pw@hooks.example.com/a", ("https://",)),
    ("https://hooks.example.com/a", ()),  # none allowed: the default
    ("ftp://hooks.example.com/a", ("https://",)),
    ("https://x.example:99999/h", ("https://",)),  # a port out of range: never kept
    ("https://x.example:abc/h", ("https://",)),
    ("https://[::1/x", ("https://",)),  # not a URL: a clear -32602, not a 500
    ("https://x.example/" + "a" * 3000, ("https://",))])  # bounded: kept with its task
def test_a_clients_webhook_elsewhere_is_refused(url, allowed) -> None:
    from gateway.errors import InvalidParams
    from gateway.push.client import asked

    with pytest.raises(InvalidParams):
        asked(asked_for(url), allowed)
    with pytest.raises(InvalidParams, match="whsec_"):
        asked(asked_for("https://hooks.example.com/a", "whsec_c2hvcnQ="), ("https://",))


@pytest.mark.parametrize(("address", "public"), [
    ("93.184.216.34", True), ("2606:2800:220:1:248:1893:25c8:1946", True),
    ("127.0.0.1", False), ("10.1.2.3", False), ("172.16.0.1", False), ("192.168.1.1", False),
    ("169.254.169.254", False), ("::1", False), ("fe80::1", False), ("fd00::1", False),
    ("::ffff:127.0.0.1", False), ("0.0.0.0", False), ("224.0.0.1", False),
    ("100.64.0.1", False), ("::127.0.0.1", False), ("64:ff9b::7f00:1", False),
    ("64:ff9b:1::a00:5", False), ("2002:7f00:1::", False),
    ("2001:0:4136:e378:8000:63bf:80ff:fffe", False),  # Teredo, carrying 127.0.0.1
    ("64:ff9b::808:808", True)])
def test_only_public_addresses_are_pushed_to_for_clients(address: str, public: bool) -> None:
    from gateway.push.sender import _public

    assert _public(address) is public


async def test_pending_deliveries_in_a_shared_store_are_claimed_once_and_bounded(
        redis_server, key_prefix) -> None:
    """Two replicas' RedisPending on one store: a due delivery is claimed by one of them,
    held from the other while it is tried, due again when put back; bounds refuse past
    them; a record does not open in another lane or under another key."""
    import time

    from gateway.keyring import Cipher, derive
    from gateway.push.endpoint import Delivery, Target
    from gateway.push.pending_redis import RedisPending
    from gateway.tasks.store.redis_link import RedisLink

    cipher = Cipher(derive(b"the replicas' shared secret, 32+", "webhooks"))
    links = [RedisLink(redis_server.url, key_prefix) for _ in range(2)]
    a, b = (RedisPending(link, cipher, 3, 2) for link in links)
    try:
        hook = Target("https://h.example/x", SECRET, guarded=True)
        now = time.time()
        first = Delivery(now, 0, "msg_1", b'{"n":1}', "alice", now, target=hook)
        assert await a.put("lane", first)
        assert await a.put("lane", Delivery(now, 0, "msg_2", b"{}", "alice", now))
        assert not await a.put("lane", Delivery(now, 0, "msg_3", b"{}", "alice", now))
        assert await a.put("other", Delivery(now, 0, "msg_4", b"{}", "bob", now))
        assert not await a.put("other", Delivery(now, 0, "msg_5", b"{}", "carol", now))
        claimed = await a.claim("lane", 1)
        assert [d.id for d in claimed] == ["msg_1"] and claimed[0].target is not None
        assert claimed[0].target.record() == hook.record()  # its client's secret, kept
        assert [d.id for d in await b.claim("lane", 5)] == ["msg_2"]  # msg_1 is a's now
        assert await b.claim("lane", 5) == []
        claimed[0].attempt, claimed[0].due = 1, time.time()
        await a.again("lane", claimed[0])
        again = await b.claim("lane", 5)
        assert [(d.id, d.attempt) for d in again] == [("msg_1", 1)]
        await b.done("lane", again[0])
        assert await a.count() == 2 and await a.count("lane") == 1
        other_key = Cipher(derive(b"another secret, 32 bytes long!!", "webhooks"))
        stolen = RedisPending(links[0], other_key, 3, 2)
        assert await stolen.claim("other", 5) == []  # not ours to open: never sent
        raw = [await links[0].redis.get(k) async for k in
               links[0].redis.scan_iter(f"{key_prefix}wh:r:*")]
        assert raw and not any(SECRET.encode() in v for v in raw)
    finally:
        for link in links:
            await link.close()
