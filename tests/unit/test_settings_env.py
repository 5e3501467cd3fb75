"""gateway/settings/env.py: `${VAR}` interpolation of a YAML tree, and what an unset
variable reads as while a file is checked."""

from __future__ import annotations

import pytest

from gateway.settings import ConfigError
from gateway.settings.env import interpolate, names_unset, placeholder
from gateway.settings.rules import MIN_TOKEN_CHARS


def test_every_string_of_the_tree_is_interpolated(monkeypatch) -> None:
    monkeypatch.setenv("GW_HOST", "gw.example")
    monkeypatch.delenv("GW_PORT", raising=False)
    tree = {"a": ["https://${GW_HOST}/mcp", 3, None], "b": {"c": "${GW_PORT:-8080}"},
            "d": "${GW_PORT:-}", "e": True}
    assert interpolate(tree) == {"a": ["https://gw.example/mcp", 3, None],
                                 "b": {"c": "8080"}, "d": "", "e": True}


def test_a_variable_set_empty_is_set(monkeypatch) -> None:
    monkeypatch.setenv("GW_EMPTY", "")
    assert interpolate({"k": "${GW_EMPTY:-default}"}) == {"k": ""}


def test_an_unset_variable_names_its_key(monkeypatch) -> None:
    monkeypatch.delenv("GW_NOPE", raising=False)
    with pytest.raises(ConfigError, match=r"^upstreams\.m\.env\.1: environment variable "
                                          r"GW_NOPE is not set$"):
        interpolate({"upstreams": {"m": {"env": ["x", "${GW_NOPE}"]}}})


def test_checking_collects_unset_variables_as_placeholders(monkeypatch) -> None:
    monkeypatch.delenv("GW_NOPE", raising=False)
    unset: list[str] = []
    tree = interpolate({"auth": {"bearer_tokens": ["${GW_NOPE}"]},
                        "store": {"url": "${GW_NOPE}"}, "x": {"url": "${GW_NOPE}"},
                        "y": {"url": "redis://${GW_NOPE}"}}, unset=unset)
    assert unset == ["GW_NOPE"] * 4
    token = tree["auth"]["bearer_tokens"][0]
    assert token.startswith("unset-GW_NOPE") and len(token) == MIN_TOKEN_CHARS
    assert tree["store"]["url"] == "redis://unset-GW_NOPE"
    assert tree["x"]["url"] == "https://unset-GW_NOPE.invalid/"
    assert tree["y"]["url"].startswith("redis://unset-GW_NOPE")  # part of a URL: a token's


def test_a_placeholder_is_known_for_the_variable_it_stands_for() -> None:
    text = f"npx {placeholder('SERVER', 'upstreams.m.command', whole=False)}"
    assert names_unset(text, ["OTHER", "SERVER"])
    assert not names_unset(text, ["OTHER"]) and not names_unset("npx", [])
