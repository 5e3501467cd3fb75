"""The `webhooks:` section: where a task's status is pushed (Standard Webhooks: signed,
retried; docs/push.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

from annotated_types import MinLen

from gateway.settings.rules import Rule, http_url, webhook_secret
from gateway.settings.schema.base import Secret, _Model, doc

PushedStatus = Literal["completed", "failed", "cancelled", "input_required"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Webhook(_Model):
    """An operator's webhook: each task status it names, of the tools and upstreams it
    names, is POSTed to it, signed (docs/push.md)."""

    url: Annotated[str, Rule(http_url)] = field(
        metadata=doc("http(s) URL the events are POSTed to (redirects are not followed)"))
    secret: Annotated[Secret, Rule(webhook_secret)] = field(
        metadata=doc("Standard Webhooks signing secret: whsec_ + base64 of 24-64 bytes "
                     "(`${VAR}` from the environment)"))
    events: Annotated[list[PushedStatus], MinLen(1)] = field(
        default_factory=lambda: ["completed", "failed", "cancelled"],
        metadata=doc("the task statuses that fire (input_required on request)"))
    tools: Annotated[list[str], MinLen(1)] = field(
        default_factory=lambda: ["*"], metadata=doc("tool name globs"))
    upstreams: Annotated[list[str], MinLen(1)] = field(
        default_factory=lambda: ["*"], metadata=doc("upstream name globs"))
