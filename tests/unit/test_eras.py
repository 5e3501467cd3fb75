"""Which era a server of both eras speaks to modern clients (upstream/eras.py), alone, with
fake links: probed once and shared by the requests that wait meanwhile; a legacy answer is
kept (no modern link, none asked again); no answer is not taken for one (the next request
asks again); a caller that goes away does not end the probe the next one waits for."""

from __future__ import annotations

import asyncio

import pytest

from gateway.errors import UpstreamNotReady
from gateway.upstream.eras import DualEra


class Link:
    """A probing link: ready as `modern` after `delay_s`, or failing to answer."""

    def __init__(self, modern: bool, delay_s: float = 0.0, answers: bool = True) -> None:
        self.modern, self.delay_s, self.answers = modern, delay_s, answers
        self.closed = False

    def start(self) -> None:
        pass

    async def wait_ready(self) -> dict[str, object]:
        await asyncio.sleep(self.delay_s)
        if not self.answers:
            raise UpstreamNotReady("main", "no answer in time")
        return {}

    async def close(self) -> None:
        self.closed = True


def era(*links: Link) -> tuple[DualEra, list[Link]]:
    opened: list[Link] = []

    def open_link() -> Link:
        opened.append(links[len(opened)])
        return opened[-1]
    return DualEra("main", open_link), opened  # type: ignore[arg-type]


async def test_a_modern_server_is_probed_once_for_every_waiting_request() -> None:
    dual, opened = era(Link(modern=True, delay_s=0.05))
    first, second = await asyncio.gather(dual.modern_link(), dual.modern_link())
    assert first is second is opened[0] and len(opened) == 1
    assert await dual.modern_link() is opened[0] and not opened[0].closed


async def test_a_legacy_answer_is_kept_and_its_link_closed() -> None:
    dual, opened = era(Link(modern=False))
    assert await dual.modern_link() is None
    assert await dual.modern_link() is None
    assert len(opened) == 1 and opened[0].closed


async def test_no_answer_is_asked_again_by_the_next_request() -> None:
    dual, opened = era(Link(modern=True, answers=False), Link(modern=True))
    assert await dual.modern_link() is None
    assert opened[0].closed
    assert await dual.modern_link() is opened[1]


async def test_a_caller_that_leaves_does_not_end_the_probe() -> None:
    dual, opened = era(Link(modern=True, delay_s=0.1))
    leaving = asyncio.ensure_future(dual.modern_link())
    await asyncio.sleep(0.02)
    leaving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leaving
    assert await dual.modern_link() is opened[0] and len(opened) == 1
    await dual.close()
