"""What every section of the schema shares: `doc`, a key's meaning as the reference shows
it; `Secret`, a string whose repr hides it; `_Model`, the base that refuses unknown keys.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar


def doc(text: str) -> dict[str, str]:
    """A key's meaning, as docs/configuration.md shows it (scripts/config_reference.py)."""
    return {"doc": text}


class Secret:
    """A secret string: its repr hides it (a settings object in a log or a traceback shows
    `**********`); `get_secret_value()` is the one way to read it."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def get_secret_value(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('**********')"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Callable[[Any], Any]) -> Any:
        from pydantic_core import core_schema

        return core_schema.no_info_after_validator_function(cls, core_schema.str_schema())


class _Model:
    """What every settings class shares: unknown keys are refused (pydantic reads this
    attribute on stdlib dataclasses)."""

    __slots__ = ()
    __pydantic_config__: ClassVar[dict[str, Any]] = {"extra": "forbid"}
