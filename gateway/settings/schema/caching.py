"""The `caching:` section: the hints the gateway puts on cacheable modern results."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

from annotated_types import Ge

from gateway.settings.schema.base import _Model, doc


@dataclass(frozen=True, slots=True, kw_only=True)
class Caching(_Model):
    """Hints on cacheable modern results (spec 2026-07-28, caching). The gateway cannot
    know how fresh an upstream's lists are, so by default they are stale at once."""

    ttl_ms: Annotated[int, Ge(0)] = field(default=0,
        metadata=doc("ttlMs hint on cacheable modern results (lists, resources/read)"))
    scope: Literal["public", "private"] = field(default="private",
        metadata=doc("cache scope hint: public or private"))
