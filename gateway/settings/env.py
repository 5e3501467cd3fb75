"""`${VAR}` and `${VAR:-default}` in a YAML tree's strings, read from the environment
(docs/configuration.md): the one place the settings read it. Pure but for os.environ.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection
from typing import Any

from gateway.settings import ConfigError
from gateway.settings.rules import MIN_TOKEN_CHARS

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def interpolate(value: Any, where: str = "", unset: list[str] | None = None) -> Any:
    """Replace `${VAR}` (or `${VAR:-default}`) in every string of a YAML tree. A variable
    neither set nor defaulted is an error, unless `unset` collects it (checking a file
    before deployment): it then reads as a placeholder."""
    if isinstance(value, dict):
        return {k: interpolate(v, f"{where}.{k}" if where else str(k), unset)
                for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, f"{where}.{i}", unset) for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match[str]) -> str:
        name, default = m.group(1), m.group(2)
        if name in os.environ:
            return os.environ[name]
        if default is not None:
            return default
        if unset is None:
            raise ConfigError(f"{where}: environment variable {name} is not set")
        unset.append(name)
        return placeholder(name, where, whole=m.group(0) == value)

    return _VAR.sub(sub, value)


def placeholder(name: str, where: str, whole: bool) -> str:
    """What an unset variable reads as while a file is checked: long enough for a token,
    and, standing for a whole URL (`store.url: "${REDIS_URL}"`), a URL of the right kind,
    so that the check names the variable instead of failing on the placeholder."""
    if whole and where == "store.url":
        return f"redis://unset-{name}"
    if whole and where.endswith(".url"):
        return f"https://unset-{name}.invalid/"
    return f"unset-{name}".ljust(MIN_TOKEN_CHARS, "-")


def names_unset(text: str, unset: Collection[str]) -> bool:
    """Whether `text` holds the placeholder of a variable in `unset` (a checked file's
    value that is not known yet)."""
    return any(f"unset-{name}" in text for name in unset)
