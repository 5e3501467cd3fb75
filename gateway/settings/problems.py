"""What is wrong with a configuration, in words: pydantic's errors as one line naming the key
at fault, and warnings about a file that is valid but will likely fail here (`--check-config`).

Pure: it reads the schema and pydantic's error list (pydantic itself is imported by load.py).
"""

from __future__ import annotations

import json
import os
import shutil
import types
import typing
from collections.abc import Collection
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway import redact
from gateway.settings.env import names_unset
from gateway.settings.schema import Settings, Upstream

if TYPE_CHECKING:
    from pydantic import ValidationError

# What pydantic calls a key a settings class does not have (`extra_forbidden`: on models).
_UNKNOWN_KEY = ("unexpected_keyword_argument", "extra_forbidden")


def first_problem(exc: ValidationError) -> str:
    """One line naming the key at fault. An unknown key comes first: it usually explains a
    missing one beside it (`upstream:` for `upstreams:`, which is then no other problem),
    and a close known name is offered."""
    errors = exc.errors()
    err = next((e for e in errors if e["type"] in _UNKNOWN_KEY), errors[0])
    key = ".".join(str(p) for p in err["loc"]) or "(top level)"
    msg = err["msg"].removeprefix("Value error, ")
    others = [e for e in errors if e is not err]
    if err["type"] in _UNKNOWN_KEY:
        close = close_key(err["loc"])
        msg = f"unknown key `{err['loc'][-1]}`" + (f"; did you mean `{close}`?" if close else "")
        meant = (*err["loc"][:-1], close)
        others = [e for e in others if (e["type"], e["loc"]) != ("missing", meant)]
    elif err["type"] == "missing":  # pydantic's "Field required"
        msg = "required, and not given"
    elif err["loc"][-1:] == ("command",) and isinstance(err.get("input"), list):
        # As many MCP client configs write it: the program, then its arguments apart.
        argv = [str(a) for a in err["input"]]
        msg = (f"one program, its arguments under `args`: command: {argv[0] if argv else ''}"
               f", args: {json.dumps(argv[1:])}")
    more = len(others)
    # A value quoted back (an URL with its password, say) is shown without credentials:
    # the line goes to a terminal, a CI log, a support ticket.
    msg = redact.text(msg)
    return f"{key}: {msg}" + (f" (and {more} more problem{'s' * (more > 1)})" if more else "")


def close_key(loc: tuple[int | str, ...]) -> str | None:
    """The known key at `loc`'s place closest to its unknown last part, if one is close."""
    import difflib  # a bad file only: not resident in a serving process

    close = difflib.get_close_matches(str(loc[-1]), keys_at(loc[:-1]), 1)
    return close[0] if close else None


def keys_at(loc: tuple[int | str, ...]) -> list[str]:
    """The keys the settings know at `loc` (a dict's own keys pass through to its values)."""
    model: Any = Settings
    for part in loc:
        model = _present(model)
        hints = typing.get_type_hints(model) if _is_model(model) else {}
        if str(part) in hints:
            model = hints[str(part)]
        else:  # a key of a dict of models: its values are the next model
            args = typing.get_args(model)
            model = args[-1] if args else None
    model = _present(model)
    return [f.name for f in fields(model) if not f.metadata.get("internal")
            ] if _is_model(model) else []


def _present(t: Any) -> Any:
    """X of `X | None`; any other type as it is."""
    if typing.get_origin(t) in (typing.Union, types.UnionType):
        return next(a for a in typing.get_args(t) if a is not type(None))
    return t


def _is_model(t: Any) -> bool:
    return isinstance(t, type) and is_dataclass(t)


def warnings_about(conf: Settings, unset: Collection[str] = ()) -> list[str]:
    """What a valid configuration will likely fail on if started here: a stdio upstream's
    command that is not found, or its working directory missing. Warnings, not errors: the
    file may be checked on another machine than the one (or the container) that runs it.
    A command or directory from a variable in `unset` is not known yet: not checked."""
    return [f"upstreams.{name}.{problem}" for name, up in conf.upstreams.items()
            if not names_unset(f"{up.command} {up.cwd}", unset)
            and (problem := _missing_command(up)) is not None]


def _missing_command(up: Upstream) -> str | None:
    """Found as the start would find it (upstream/stdio.py): a name on the PATH the server
    gets (its `env` PATH, else the gateway's), a path relative to its working directory."""
    if up.command is None:
        return None
    cwd = Path(up.cwd) if up.cwd is not None else Path.cwd()
    if not cwd.is_dir():
        return f"cwd: '{up.cwd}' is not a directory here"
    if "/" in up.command:
        path = cwd / up.command
        if not path.is_file():
            return f"command: '{up.command}' does not exist here"
        executable = os.access(path, os.X_OK)
        return None if executable else f"command: '{up.command}' is not executable here"
    if shutil.which(up.command, path=up.env.get("PATH")) is None:
        return f"command: '{up.command}' is not on the PATH here"
    return None
