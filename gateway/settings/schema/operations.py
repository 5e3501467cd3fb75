"""The `shutdown:`, `tracing:` and `logging:` sections: what a stop lets finish, and what the
gateway tells its operators (OpenTelemetry traces, structlog events).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

from annotated_types import Ge, Le, MinLen

from gateway.settings.rules import EmptyIsNull
from gateway.settings.schema.base import _Model, doc


@dataclass(frozen=True, slots=True, kw_only=True)
class Shutdown(_Model):
    """What a stop (SIGTERM, SIGINT) lets finish (docs/deploys.md)."""

    # The default fits `docker stop`'s 10 s with room for the rest of the stop; deploys of
    # long tools give the platform's grace period and this much longer.
    drain_ms: Annotated[int, Ge(0)] = field(default=8000,
        metadata=doc("on SIGTERM: /readyz 503, new calls refused as stopping, running calls "
            "finish for up to this long, then are cancelled"))


@dataclass(frozen=True, slots=True, kw_only=True)
class Tracing(_Model):
    """OpenTelemetry traces, off unless an OTLP endpoint is set (needs the `otel` extra:
    pip install 'mcp-task-gateway[otel]')."""

    otlp_endpoint: Annotated[str | None, EmptyIsNull] = field(default=None,
        metadata=doc("OTLP/HTTP traces URL, e.g. http://collector:4318/v1/traces"))
    service_name: Annotated[str, MinLen(1)] = "mcp-task-gateway"
    sample_ratio: Annotated[float, Ge(0), Le(1)] = field(default=1.0,
        metadata=doc("of traces started here"))


@dataclass(frozen=True, slots=True, kw_only=True)
class Logging(_Model):
    """structlog events to stderr."""

    level: Literal["debug", "info", "warning", "error"] = field(default="info",
        metadata=doc("the least severe event logged"))
    format: Literal["json", "console"] = field(default="json",
        metadata=doc("json (one object a line) or console (for people)"))
