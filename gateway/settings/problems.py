"""What is wrong with a configuration, in words: pydantic's errors as one line naming the key
at fault.

Pure: it reads the schema and pydantic's error list (pydantic itself is imported by load.py).
"""

from __future__ import annotations

import types
import typing
from dataclasses import fields, is_dataclass
from typing import TYPE_CHECKING, Any

from gateway import redact
from gateway.settings.schema import Settings

if TYPE_CHECKING:
    from pydantic import ValidationError

# What pydantic calls a key a settings class does not have (`extra_forbidden`: on models).
_UNKNOWN_KEY = ("unexpected_keyword_argument", "extra_forbidden")


def first_problem(exc: ValidationError) -> str:
    """One line naming the key at fault. An unknown key comes first: it usually explains a
    missing one beside it (`upstream:` for `upstreams:`), and a close known name is offered."""
    errors = exc.errors()
    err = next((e for e in errors if e["type"] in _UNKNOWN_KEY), errors[0])
    key = ".".join(str(p) for p in err["loc"]) or "(top level)"
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] in _UNKNOWN_KEY:
        msg = unknown_key(err["loc"])
    more = len(errors) - 1
    # A value quoted back (an URL with its password, say) is shown without credentials:
    # the line goes to a terminal, a CI log, a support ticket.
    msg = redact.text(msg)
    return f"{key}: {msg}" + (f" (and {more} more problem{'s' * (more > 1)})" if more else "")


def unknown_key(loc: tuple[int | str, ...]) -> str:
    """`unknown key `x``, with the close known name at that place if there is one."""
    import difflib  # a bad file only: not resident in a serving process

    msg = f"unknown key `{loc[-1]}`"
    close = difflib.get_close_matches(str(loc[-1]), keys_at(loc[:-1]), 1)
    return msg + (f"; did you mean `{close[0]}`?" if close else "")


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
