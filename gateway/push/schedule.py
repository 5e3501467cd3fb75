"""When a delivery is tried again, and what a receiver's answer means (docs/push.md).

At least once: a 2xx ends it; 410 Gone disables the endpoint until the gateway restarts;
429 and 503 are tried again after their Retry-After (1 s to an hour); any other answer (3xx
included: redirects are never followed), a refused connection or a timeout is tried again
after RETRY_S, each wait within 20 % either way (jitter: receivers that come back are not
met by every gateway at once); after the last, it is given up. Pure: no I/O.
"""

from __future__ import annotations

import email.utils
import random
from dataclasses import dataclass
from typing import Literal

# The waits before the 2nd, 3rd, ... attempt: about 1 h 44 min from the first to the last.
RETRY_S = (1.0, 5.0, 30.0, 120.0, 600.0, 1800.0, 3600.0)
JITTER = 0.2
MAX_RETRY_AFTER_S = 3600.0

Outcome = Literal["delivered", "gone", "retry", "failed", "refused"]


@dataclass(frozen=True, slots=True)
class Answer:
    """What one attempt came to: its outcome, the receiver's status (0: none), and the
    wait the receiver asked for (Retry-After), if any."""

    outcome: Outcome
    status: int = 0
    retry_after_s: float | None = None


def judged(status: int, retry_after: str | None, now: float) -> Answer:
    """A receiver's HTTP answer."""
    if 200 <= status < 300:
        return Answer("delivered", status)
    if status == 410:
        return Answer("gone", status)
    if status in (429, 503):
        return Answer("retry", status, _retry_after(retry_after, now))
    return Answer("failed", status)


def next_wait(attempt: int, answer: Answer, rand: random.Random | None = None
              ) -> float | None:
    """Seconds until attempt `attempt + 1` (attempts count from 1), None: given up."""
    if attempt > len(RETRY_S):
        return None
    if answer.retry_after_s is not None:
        return answer.retry_after_s
    base = RETRY_S[attempt - 1]
    return base * (1 + JITTER * (2 * (rand or random).random() - 1))


def _retry_after(value: str | None, now: float) -> float | None:
    """Retry-After as seconds or an HTTP date (RFC 9110), within 1 s to an hour."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = email.utils.parsedate_to_datetime(value).timestamp() - now
        except (TypeError, ValueError):
            return None
    return min(MAX_RETRY_AFTER_S, max(1.0, seconds))
