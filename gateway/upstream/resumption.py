"""Resuming a call's answer stream that ended before the answer: when to ask again, with
what, and when to give up. The reading itself is sse_client.py's (EventReader keeps the last
event id and the server's `retry`, `follow` GETs with `Last-Event-ID`); what giving up means
for the POST and its session is http_post.py's (Poster hears why, as a `GaveUp`).

spec (mcp-base-2025-06-18.md, Streamable HTTP, Resumability and Redelivery; 2025-11-25,
SEP-1699 polling): a server that gave its events ids may end a stream at any time, and the
client resumes it with a GET carrying `Last-Event-ID`, after the server's `retry`. The
server replays only the stream that ended, so what comes on a resumed stream is its call's
alone. The bounds (the `retry` held, STALLED_RESUMES) are sse_client.py's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import aiohttp

from gateway.observability import log
from gateway.upstream import sse_client
from gateway.upstream.correlator import Call
from gateway.upstream.sse_client import EventReader, Got
from gateway.upstream.transport import Link


@dataclass(frozen=True, slots=True)
class GaveUp:
    """Why a call's stream is not resumed again, as its clients may read it (`why`: what
    the server did, never where it is); `refusal`, the GET's answer when the server refused
    the resume (whether it forgot the session is the POST's to judge)."""

    why: str
    refusal: Got | None = None


class Resumption:
    """Resumes the answer streams of an upstream's calls (one object per upstream, as its
    Poster), each until its call is answered or the resuming is given up."""

    def __init__(self, name: str, link: Link, http: aiohttp.ClientSession, url: str,
                 headers: Callable[[], Mapping[str, str]],
                 limits: aiohttp.ClientTimeout | None = None) -> None:
        self.name, self.link, self.http, self.url = name, link, http, url
        self.headers = headers  # the session's, as they are at each resume
        self.limits = limits  # a POST's timeouts: its resume is read as it was

    async def resume(self, reader: EventReader, call: Call) -> GaveUp | None:
        """spec (Resumability and Redelivery; 2025-11-25, SEP-1699 polling): a stream that
        ended before its call's answer is picked up by a GET carrying Last-Event-ID, after
        the server's `retry`. The server replays only the stream that ended, so what comes
        on it is this call's alone (`via`), and it is read until the answer came (servers
        keep a resumed stream open after it). A server that gave no event id cannot be
        resumed; one that refuses a resume, or ends STALLED_RESUMES in a row that brought
        nothing new, is given up (None: the call was answered, or failed otherwise).
        TooLarge and AnswersOverBudget, from reading a resumed stream, end it (the caller
        fails the call saying so)."""
        stalled = 0
        while self.link.pending(call):
            if (gave_up := _given_up(reader, stalled)) is not None:
                return gave_up
            await asyncio.sleep(reader.retry_s)
            news = reader.news
            got = await self._follow(reader, call)
            if got is not None and _refused(got):
                return GaveUp(f"refused to resume the answer's stream (HTTP {got.status})",
                              got)
            stalled = 0 if reader.news > news else stalled + 1
        return None

    async def _follow(self, reader: EventReader, call: Call) -> Got | None:
        """One resume of `call`'s stream, read until it ends or the call is answered; None
        when the call was answered, or failed, while waiting the `retry`."""
        if not self.link.pending(call):
            return None
        log.debug("upstream.stream_resuming", upstream=self.name, last_event_id=reader.last_id,
                  retry_s=reader.retry_s)
        return await sse_client.follow(self.http, self.url, self.headers(), reader,
                                       self.link.on_message, call,
                                       done=lambda: not self.link.pending(call),
                                       limits=self.limits)


def _given_up(reader: EventReader, stalled: int) -> GaveUp | None:
    """Why the stream is not resumed again before trying: no event id to resume it from, or
    `stalled` resumes in a row that brought nothing (sse_client.STALLED_RESUMES)."""
    if reader.last_id is None:
        return GaveUp("ended the answer's stream before the answer, with no event id to "
                      "resume it from")
    if stalled == sse_client.STALLED_RESUMES:
        return GaveUp("kept ending the answer's stream before the answer: "
                      f"{stalled} resumes with Last-Event-ID in a row brought nothing")
    return None


def _refused(got: Got) -> bool:
    """Whether the server refused the resume: a 5xx or a failed connection is tried again,
    as one that brought nothing."""
    return got.status is not None and got.status != 200 and got.status < 500
