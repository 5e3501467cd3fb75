"""The bytes of answers the gateway holds for its clients, per principal and in all: a
call's response from the moment it is in until it is written to its client (a plain JSON
body, or the last event of the call's SSE stream), or that client is gone or cut off
(`limits.slow_reader_ms`).

Rules (docs/limits.md):
- An answer is always taken when its principal holds none: one answer of any size (an
  upstream's is held to `limits.max_message_bytes`) reaches a client who reads it, whole.
- Otherwise one that would take its principal past `max_inflight_bytes_per_principal`
  fails, its call answered with AnswersOverBudget naming that bound. The answer is in
  already, so its call fails rather than waits: waiting would hold the very bytes the bound
  is for.
- Past `max_inflight_bytes` in all, an answer fails only when its principal holds more than
  a fair share (the bound over the principals holding answers, itself included): the
  principal over its share meets the bound, never the one under it. The total may pass
  the bound by what principals under their share take.
- A stdio server's line read in part (its bytes before the newline; at most
  `max_message_bytes` a process, stdio.py) is counted in the total under its upstream
  (`reading`), never refused: whose it is is known once it is whole, when it becomes its
  call's answer. It counts toward the overall bound, so a principal over its fair share
  meets that bound sooner while big lines are read; one under its share never does (the
  upstream is no principal: it does not shrink the fair share).
- An HTTP server's answer is its POST's call's from its first byte (issue 41, F2): read in
  part, it is counted as it arrives under that call's principal (`partial`), and refused by
  the rules above, the answer taken as a whole (its bytes read so far are its own, not
  "another answer held"): the reading stops and that call alone fails. Its bytes are given
  back when it is handed on whole (the exchange then takes it again, at once: counted
  once) or the reading ends. What comes for no principal's call (the handshake's, a
  session's GET stream, the HTTP+SSE transport's one stream) counts as a stdio line does.

Pure: no I/O, no asyncio.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable

from gateway.errors import AnswersOverBudget
from gateway.observability.counters import Counters


class AnswerBytes:
    """Bytes of answers held, by principal."""

    def __init__(self, overall: int, per_principal: int, counters: Counters | None = None
                 ) -> None:
        self.overall = overall
        self.per_principal = per_principal
        self.counters = counters if counters is not None else Counters()
        self.held: Counter[str] = Counter()  # by principal
        self.reading_now: Counter[str] = Counter()  # lines read in part, by upstream
        self.total = 0  # both

    def take(self, owner: str, size: int, part: int = 0) -> None:
        """`owner` holds `size` more bytes; AnswersOverBudget (holding nothing more) when
        the rules above refuse them. `part`: of what `owner` holds, the bytes of this same
        answer read so far (`Partial`): an answer is taken whole when they are all it holds."""
        mine = self.held.get(owner, 0)  # get: Counter's own lookup of a miss is Python's
        others = mine - part  # the answers it holds besides this one
        if others and mine + size > self.per_principal:
            self._refuse("limits.max_inflight_bytes_per_principal", self.per_principal, mine)
        holders = len(self.held) + (0 if mine else 1)
        if others and self.total + size > self.overall and mine + size > self.overall / holders:
            self._refuse("limits.max_inflight_bytes", self.overall, mine)
        self.held[owner] = mine + size
        self.total += size

    def give_back(self, owner: str, size: int) -> None:
        """`owner` holds `size` bytes fewer (written, or nobody is left to write them to)."""
        left = self.held.get(owner, 0) - size
        if left > 0:
            self.held[owner] = left
        else:
            self.held.pop(owner, None)  # dict's: Counter's __delitem__ is Python
        self.total -= size

    def reading(self, holder: str) -> Callable[[int], None]:
        """How a reader of an upstream's lines says its part-read line grew or shrank by
        `delta` bytes, counted under `holder` and never refused (see the rules above)."""
        return functools.partial(self.read_in_part, holder)

    def read_in_part(self, holder: str, delta: int) -> None:
        """What `holder` (an upstream) reads for no principal grew or shrank by `delta`
        bytes: counted in the total, never refused (see the rules above)."""
        self.total += delta  # not in `held`: no principal's, so no holder of a share
        self.reading_now[holder] += delta
        if not self.reading_now[holder]:
            del self.reading_now[holder]

    def partial(self, principal: str | None, holder: str) -> Partial:
        """One answer read in part: `principal`'s, refused by the rules above; or, when it
        belongs to no principal's call, counted under `holder` and never refused."""
        return Partial(self, principal, holder)

    def hold(self, owner: str) -> Hold:
        """What one exchange of `owner` holds (see Hold)."""
        return Hold(self, owner)

    def _refuse(self, bound: str, limit: int, mine: int) -> None:
        self.counters.reject("answer_bytes")
        raise AnswersOverBudget(bound, limit, mine)


class Partial:
    """An answer read in part (an HTTP server's, http_post.py and sse_client.py): `count`
    says how many of its bytes the gateway holds now; 0 when it is handed on whole, or
    dropped."""

    __slots__ = ("budget", "holder", "principal", "size")

    def __init__(self, budget: AnswerBytes | None, principal: str | None, holder: str
                 ) -> None:
        self.budget, self.principal, self.holder, self.size = budget, principal, holder, 0

    def count(self, size: int) -> None:
        """The answer read so far holds `size` bytes; AnswersOverBudget when the budget
        refuses its principal the growth (it holds what it held before, which the reader
        gives back as it drops the answer: `count(0)`)."""
        budget, principal, grown = self.budget, self.principal, size - self.size
        if budget is None or not grown:
            return
        if principal is None:
            budget.read_in_part(self.holder, grown)
        elif grown < 0:
            budget.give_back(principal, -grown)
        else:
            budget.take(principal, grown, part=self.size)
        self.size = size


UNCOUNTED = Partial(None, None, "")  # a reader given no budget counts nothing


class Hold:
    """One exchange's answer under the budget: taken when it is in, given back once when the
    exchange ends (written, or its client gone); an answer in after that is not counted
    (nobody will write it: it goes with its exchange)."""

    __slots__ = ("budget", "ended", "owner", "size")

    def __init__(self, budget: AnswerBytes, owner: str) -> None:
        self.budget, self.owner, self.size, self.ended = budget, owner, 0, False

    def take(self, size: int) -> None:
        """AnswersOverBudget when the budget refuses `size` more bytes."""
        if not self.ended:
            self.budget.take(self.owner, size)
            self.size += size

    def end(self) -> None:
        if not self.ended:
            self.ended = True
            self.budget.give_back(self.owner, self.size)
            self.size = 0
