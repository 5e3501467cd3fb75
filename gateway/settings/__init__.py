"""The gateway's configuration (docs/configuration.md), one module per job:

    schema/       the frozen dataclasses the gateway reads, their defaults, documentation,
                  constraints and cross-key invariants; `Secret` (one module per section)
    rules.py      checks of one key's value that the schema names (run where pydantic
                  validates, so an error names the key), and the loopback test they share
                  with the gateway
    env.py        `${VAR}` and `${VAR:-default}` interpolation of a YAML tree
    load.py       a YAML file or tree to validated Settings (pydantic, imported here only)
    problems.py   pydantic's errors as one line naming the key; warnings about a valid
                  file that will likely fail where it is checked (`--check-config`)
    isolated.py   load_isolated: validation in a forked child, its Settings handed back

Loaded once at start; nothing else reads YAML or the environment for settings. A serving
process imports schema, rules and isolated only: the rest, pydantic and PyYAML run in the
child `load_isolated` forks (bench/README: Memory; tests/unit/test_settings.py holds it).
So this module holds nothing but the one error every part raises.
"""

from __future__ import annotations

__all__ = ["ConfigError"]


class ConfigError(Exception):
    """A configuration problem, worded for one line: `key.path: what is wrong`."""
