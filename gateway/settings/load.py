"""A YAML file or tree to validated Settings: read, `${VAR}` interpolated (env.py), checked
by pydantic against the schema, its first error reworded (problems.py).

pydantic and PyYAML are imported here only, in the process that validates: a serving process
gets its settings through isolated.load_isolated and never imports this module.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.settings import ConfigError
from gateway.settings.env import interpolate
from gateway.settings.problems import first_problem
from gateway.settings.schema import Settings

if TYPE_CHECKING:
    from pydantic import TypeAdapter


def load(path: str | Path) -> Settings:
    return from_mapping(read_raw(path))


def read_raw(path: str | Path) -> Any:
    """The YAML tree of `path`, unvalidated (the CLI merges flags into it first)."""
    import yaml  # only configs from a file need it: zero-config starts lighter

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror or exc}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" (line {mark.line + 1})" if mark else ""
        raise ConfigError(f"{path}{at}: not valid YAML: {getattr(exc, 'problem', exc)}") from None
    return raw or {}


def from_mapping(raw: Any, unset: list[str] | None = None) -> Settings:
    """Validated settings of a YAML tree. With `unset` (checking a file before deployment),
    environment variables not set here read as placeholders, and are collected there."""
    if not isinstance(raw, dict):
        raise ConfigError("the configuration must be a YAML mapping")
    tree = interpolate(raw, unset=unset)
    from pydantic import ValidationError  # only here: a serving process never imports it

    try:
        return _adapter().validate_python(tree)
    except ValidationError as exc:
        raise ConfigError(first_problem(exc)) from None


@functools.cache
def _adapter() -> TypeAdapter[Settings]:
    from pydantic import TypeAdapter

    return TypeAdapter(Settings)
