"""Legacy sessions' records on a real Redis server (tasks/store/redis_sessions.py, read through
downstream/resume.py): adopted by their principal alone, bounded per principal across
replicas, ended for good by DELETE, written back where the store lost them, and sealed: a
record the store's operator moved or wrote does not open."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from gateway.downstream.resume import (
    MAX_INFO_CHARS,
    MAX_RECORD_BYTES,
    Record,
    Resumption,
    kept_client_info,
    record_key,
)
from gateway.tasks.store.redis_link import RedisLink
from gateway.tasks.store.redis_sessions import RedisSessions

SECRET = b"a secret every replica shares"
# Session ids as the gateway makes them (any other shape is never looked up).
ID = {name: name.ljust(43, "_") for name in (
    "sid-1", "sid-unknown", "a1", "a2", "a3", "b1", "sid", "stolen", "forged")}


@pytest.fixture
async def resume(redis_server, key_prefix) -> AsyncIterator[Resumption]:
    link = RedisLink(redis_server.url, key_prefix)
    yield Resumption(RedisSessions(link, SECRET), "main", idle_s=60, per_principal=2)
    await link.close()


def record(principal: str = "alice") -> Record:
    return Record(principal, "main", "2025-11-25", {"elicitation": {}}, {"name": "t"})


async def test_a_record_is_found_by_its_principal_alone(resume) -> None:
    assert await resume.open(ID["sid-1"], record())
    assert await resume.find(ID["sid-1"], "alice") == record()
    assert await resume.find(ID["sid-1"], "bob") is None  # as unknown as an id never made
    assert await resume.find(ID["sid-unknown"], "alice") is None
    other_upstream = Resumption(resume.records, "other", 60, 2)
    assert await other_upstream.find(ID["sid-1"], "alice") is None


async def test_a_principal_holds_its_share_across_replicas(resume) -> None:
    assert await resume.open(ID["a1"], record()) and await resume.open(ID["a2"], record())
    assert not await resume.open(ID["a3"], record())  # a third, from any replica: refused
    assert await resume.open(ID["b1"], record("bob"))  # another principal's share is its own
    await resume.end(ID["a1"], "alice")
    assert await resume.open(ID["a3"], record())


async def test_an_ended_session_is_never_written_back(resume) -> None:
    await resume.open(ID["sid"], record())
    await resume.end(ID["sid"], "alice")
    assert await resume.renew([(ID["sid"], record())]) == [ID["sid"]]  # a replica holding it: ends
    assert await resume.find(ID["sid"], "alice") is None


async def test_a_record_the_store_lost_is_written_back(resume) -> None:
    await resume.open(ID["sid"], record())
    records = resume.records
    assert isinstance(records, RedisSessions)
    await records.redis.delete(records.key("s", record_key(ID["sid"])))  # restarted empty
    assert await resume.renew([(ID["sid"], record())]) == []
    assert await resume.find(ID["sid"], "alice") == record()


async def test_a_record_moved_or_forged_in_the_store_does_not_open(resume) -> None:
    await resume.open(ID["sid"], record())
    records = resume.records
    assert isinstance(records, RedisSessions)
    redis, key = records.redis, records.key
    held = await redis.get(key("s", record_key(ID["sid"])))
    assert b"alice" not in held and b"2025-11-25" not in held  # encrypted at rest
    await redis.set(key("s", record_key(ID["stolen"])), held)  # moved to another session's key
    assert await resume.find(ID["stolen"], "alice") is None
    await redis.set(key("s", record_key(ID["forged"])), record("mallory").dump())
    assert await resume.find(ID["forged"], "mallory") is None


async def test_a_deleted_sessions_record_written_back_by_the_operator_does_not_open(
        resume) -> None:
    """Whoever writes to the store can put a sealed record back after DELETE (saved from
    before it): the session stays ended for good, as every replica's renewal holds."""
    await resume.open(ID["sid"], record())
    records = resume.records
    assert isinstance(records, RedisSessions)
    saved = await records.redis.get(records.key("s", record_key(ID["sid"])))
    await resume.end(ID["sid"], "alice")
    await records.redis.set(records.key("s", record_key(ID["sid"])), saved)
    assert await resume.find(ID["sid"], "alice") is None


async def test_an_id_no_replica_makes_costs_the_store_nothing(resume) -> None:
    """A session id of another shape (another server's, garbage, a huge header) is unknown
    without a read: the store is not a client's to load with ids that were never made."""
    records = resume.records
    assert isinstance(records, RedisSessions)
    before = records.round_trips
    for sid in ("", "short", "x" * 44, ID["sid"][:-1] + "!", "é" * 43, "a" * 10_000):
        assert await resume.find(sid, "alice") is None
    assert records.round_trips == before
    assert await resume.find(ID["sid"], "alice") is None  # well made: it is looked up
    assert records.round_trips == before + 1


def test_a_session_keeps_its_clients_name_title_and_version_only() -> None:
    """Issue 41: the rest of a clientInfo (a description, icons) is nobody's to keep."""
    info = {"name": "n" * 10_000, "title": "T", "version": 2, "icons": ["x" * 10_000]}
    assert kept_client_info(info) == {"name": "n" * MAX_INFO_CHARS, "title": "T"}
    assert kept_client_info("a string") is None and kept_client_info({"icons": []}) is None


def test_a_record_fits_within_the_cap_or_no_session_is_made() -> None:
    fits = Record("alice", "main", "2025-11-25", {"x": "y" * (MAX_RECORD_BYTES - 200)})
    over = Record("alice", "main", "2025-11-25", {"x": "y" * MAX_RECORD_BYTES})
    assert fits.fits() and not over.fits()
