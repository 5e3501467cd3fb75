"""The plain numbers behind /metrics: a counter or histogram family's values by label
values, and the state the gauges read at each scrape (`Live`). Nothing here imports
prometheus_client: the request path counts, gateway/observability/exposition.py renders."""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Protocol

from gateway.errors import AuthCause, Rejection

Labels = tuple[str, ...]


class Live(Protocol):
    """The state the gauges show, read at each scrape."""

    def tasks_live(self) -> dict[str, int]: ...  # status -> tasks this replica runs
    def store_bytes(self) -> int: ...
    def store_outbox(self) -> int: ...  # task changes the shared store has not taken yet
    def webhooks_pending(self) -> int: ...  # webhook deliveries not made yet (gateway/push)
    def upstreams(self) -> dict[str, tuple[bool, int]]: ...  # name -> (up, restarts)
    def sessions(self) -> int: ...
    def rejections(self) -> dict[tuple[Rejection, AuthCause | None], int]: ...  # -> count
    def queues(self) -> dict[tuple[str, str], int]: ...  # (upstream, tool) -> calls waiting


@dataclass(slots=True)
class Counted:
    """One counter family: its values by label values."""

    name: str
    doc: str
    labels: tuple[str, ...]
    values: dict[Labels, int] = field(default_factory=dict)

    def inc(self, labels: Labels) -> None:
        self.values[labels] = self.values.get(labels, 0) + 1


@dataclass(slots=True)
class Timed:
    """One histogram family: per label values, the count in each bucket (the last one
    +Inf; not cumulative) and the sum."""

    name: str
    doc: str
    labels: tuple[str, ...]
    bounds: tuple[float, ...]
    values: dict[Labels, tuple[list[int], list[float]]] = field(default_factory=dict)

    def observe(self, labels: Labels, seconds: float) -> None:
        series = self.values.get(labels)
        if series is None:
            series = self.values[labels] = ([0] * (len(self.bounds) + 1), [0.0])
        series[0][bisect_left(self.bounds, seconds)] += 1  # le: the first bound >= seconds
        series[1][0] += seconds
