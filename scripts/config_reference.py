#!/usr/bin/env python3
"""Writes docs/configuration.md, every YAML key with its type, default and meaning, from the
settings models themselves (gateway/settings/schema/), so the reference cannot drift from the
code. `--check` exits 1 when the committed file differs (a test runs it).

    python scripts/config_reference.py [--check]
"""

from __future__ import annotations

import dataclasses
import re
import sys
import types
import typing
from pathlib import Path
from typing import Annotated, Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gateway.settings import schema  # noqa: E402

OUT = ROOT / "docs" / "configuration.md"
HEAD = """# Configuration reference

Generated from `gateway/settings/schema/` by `scripts/config_reference.py`; do not edit by
hand.
Keys are snake_case; `${VAR}` and `${VAR:-default}` in any string are read from the
environment; `mcp-task-gateway --check-config FILE` validates a file (exit 0, naming the
`${VAR}`s still to set; 2 with a one-line error that names the key). Unknown keys are
refused. Durations are in milliseconds (`_ms`), sizes in bytes.

`config/` holds commented examples to start from: `gateway.yaml` (the default: the values it
shows are the defaults), `isolation.yaml` (a process per client or per call), `secure.yaml`
(beyond loopback: client and operator tokens, origins, hosts, tighter limits),
`http-upstreams.yaml` (several HTTP servers, their headers, timeouts and per-upstream
`tasks:`), `oauth.yaml` (an OAuth resource server) and `docker.yaml` (what the container
image runs). Flags given beside `--config` override the
file, and a command after `--` replaces its upstreams (`mcp-task-gateway --help` lists the
flags). What the keys do, by topic: [Tasks](tasks.md) (`tasks:`), [Upstream
servers](upstreams.md) (`upstreams:`), [Limits](limits.md) (`limits:`), [Security
model](security.md) and [OAuth](oauth.md) (`auth:`, `security:`), [Operations](operations.md)
(`logging:`, `tracing:`), [Replicas](replicas.md) (`store:`, `replica:`).

## Long calls: how the timing defaults fit together

- `listen.sse_keepalive_ms` (15 s): a quiet response stream carries a comment this often,
  so a hop that cuts a connection quiet for 30 s or 60 s (nginx's and most load balancers'
  default) never cuts a slow call. Keep it under half your shortest hop timeout.
- `listen.progress_heartbeat_ms` (5 s): comments reset no client's own timer; a progress
  notification does, for clients that reset their timeout on progress (the TypeScript
  SDK's `resetTimeoutOnProgress`, the Inspector's web UI by default). 5 s is under the
  Inspector UI's 10 s request timeout and far under the SDKs' 60 s, with room for a slow
  hop; each beat is one small event on a call that is quiet anyway. Only calls whose
  request carried a `progressToken` hear it.
- A task's ttl is its time bound (the tool's `timeout_ms`, else the upstream's
  `request_timeout_ms`) plus the ttl its client asked (else `tasks.defaults.ttl_ms`), within
  `max_ttl_ms`: a running task never expires on a client's guess of how long the tool takes
  (the Python SDK 1.x asks 60 s). With the defaults: 600 s + 600 s, under the 1 h cap.
"""


def linked(text: str) -> str:
    """A settings doc's "docs/PAGE.md, Section" as a link to that page (and section)."""
    def link(match: re.Match[str]) -> str:
        page, heading = match[1], match[2]
        if heading is None:
            return f"[{page}]({page})"
        anchor = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        return f"[{page}: {heading}]({page}#{anchor})"
    return re.sub(r"docs/([a-z-]+\.md)(?:, ([A-Z][\w ]*\w))?", link, text)


def type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is Annotated:
        return type_name(args[0])
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_name(a) for a in args if a is not type(None)) + " or null"
    if origin in (list, dict):
        return f"{origin.__name__}[{', '.join(type_name(a) for a in args)}]"
    if is_section(annotation):
        return "section"
    if annotation is schema.Secret:
        return "str (secret)"
    return getattr(annotation, "__name__", str(annotation))


def is_section(annotation: Any) -> bool:
    return isinstance(annotation, type) and dataclasses.is_dataclass(annotation)


def default_of(field: dataclasses.Field[Any]) -> str:
    if field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    elif field.default is not dataclasses.MISSING:
        value = field.default
    else:
        return "required"
    if dataclasses.is_dataclass(value):
        return "see below"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, int) and value >= 10_000:
        return f"`{value}` ({value:,})".replace(",", "_")
    return f"`{value}`" if value not in ({}, [], "") else f"`{value!r}`"


def constraints(annotation: Any) -> list[Any]:
    """The Annotated metadata of a type, and of the types inside a union."""
    if typing.get_origin(annotation) is Annotated:
        return [*annotation.__metadata__, *constraints(typing.get_args(annotation)[0])]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [m for a in typing.get_args(annotation) for m in constraints(a)]
    return []


def bounds(annotation: Any) -> str:
    parts = []
    for meta in constraints(annotation):
        for name, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("min_length", "length >=")):
            if getattr(meta, name, None) is not None:
                parts.append(f"{sign} {getattr(meta, name)}")
    return "; ".join(parts)


def section(model: type, path: str, todo: list[tuple[type, str]]) -> list[str]:
    lines = [f"## `{path}`" if path else "## Top level", ""]
    own = model.__doc__ and not model.__doc__.startswith(f"{model.__name__}(")  # not generated
    if own and f"{model.__module__}.".startswith(f"{schema.__name__}."):  # schema/'s modules
        lines += [linked(" ".join(model.__doc__.split())), ""]
    lines += ["| key | type | default | meaning |", "|---|---|---|---|"]
    hints = typing.get_type_hints(model, include_extras=True)
    for field in dataclasses.fields(model):
        if field.metadata.get("internal"):  # filled by the gateway, not a key of the file
            continue
        name, annotation = field.name, hints[field.name]
        meaning = "; ".join(x for x in (linked(field.metadata.get("doc", "")), bounds(annotation))
                            if x)
        key = f"{path}.{name}" if path else name
        for sub, suffix in nested(annotation):
            where = next((at for m, at in todo if m is sub), None)
            if where is None:
                todo.append((sub, where := key + suffix))
            meaning = "; ".join(x for x in (meaning, f"see `{where}`") if x)
        lines.append(f"| `{name}` | {type_name(annotation)} | {default_of(field)} | "
                     f"{meaning} |")
    return [*lines, ""]


def nested(annotation: Any) -> list[tuple[type, str]]:
    """The sections inside a field's type, each with the path suffix to it (dict values are
    named by their key)."""
    if is_section(annotation):
        return [(annotation, "")]
    if typing.get_origin(annotation) is Annotated:
        return nested(typing.get_args(annotation)[0])
    suffix = ".<name>" if typing.get_origin(annotation) is dict else ""
    return [(m, suffix + more) for a in typing.get_args(annotation)
            for m, more in nested(a)]


def render() -> str:
    todo: list[tuple[type, str]] = [(schema.Settings, "")]
    out = [HEAD]
    for model, path in todo:  # grows as sections name the models inside them
        out += section(model, path, todo)
    return "\n".join(out).rstrip() + "\n"


def main() -> int:
    text = render()
    if "--check" in sys.argv:
        if OUT.read_text() != text:
            print(f"{OUT} is out of date: run scripts/config_reference.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
