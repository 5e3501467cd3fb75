"""gateway/settings/problems.py: the keys known at a place (for "did you mean"), and the
warnings --check-config gives about a valid file (a command not found here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.settings.problems import close_key, keys_at, warnings_about
from gateway.settings.schema import Settings, Upstream


def test_the_keys_at_a_place_pass_through_dicts_and_optional_sections() -> None:
    assert "upstreams" in keys_at(())
    assert "pool_size" in keys_at(("upstreams", "m"))
    assert "mode" in keys_at(("upstreams", "m", "tasks", "defaults"))
    assert "given" not in keys_at(("upstreams", "m", "tasks", "defaults"))  # internal
    assert "require_audience" in keys_at(("auth", "oauth", "introspection"))
    assert keys_at(("upstreams", "m", "args")) == []  # a list of strings has no keys


def test_a_close_key_is_offered_only_when_close() -> None:
    assert close_key(("upstream",)) == "upstreams"
    assert close_key(("listen", "prot")) == "port"
    assert close_key(("listen", "zzzzzz")) is None


def conf(**upstreams: Upstream) -> Settings:
    return Settings(upstreams=upstreams)


def executable(path: Path) -> Path:
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_a_command_found_here_is_no_warning(tmp_path: Path) -> None:
    tool = executable(tmp_path / "server")
    assert warnings_about(conf(
        a=Upstream(command="sh"), b=Upstream(command=str(tool), path="/b"),
        c=Upstream(command="./server", cwd=str(tmp_path), path="/c"),
        d=Upstream(url="https://mcp.example/mcp", path="/d"))) == []


def test_a_command_not_found_here_is_named(tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("not a program")
    found = warnings_about(conf(
        a=Upstream(command="no-such-server-zz9"),
        b=Upstream(command="./missing", cwd=str(tmp_path), path="/b"),
        c=Upstream(command="./plain", cwd=str(tmp_path), path="/c"),
        d=Upstream(command="sh", cwd=str(tmp_path / "gone"), path="/d")))
    assert found == ["upstreams.a.command: 'no-such-server-zz9' is not on the PATH here",
                     "upstreams.b.command: './missing' does not exist here",
                     "upstreams.c.command: './plain' is not executable here",
                     f"upstreams.d.cwd: '{tmp_path / 'gone'}' is not a directory here"]


def test_the_servers_own_path_is_searched(tmp_path: Path) -> None:
    """A server started with `env: {PATH: ...}` is found on that PATH (upstream/stdio.py
    passes its environment to the spawn, whose lookup reads the child's PATH)."""
    executable(tmp_path / "only-here")
    own_path = Upstream(command="only-here", env={"PATH": str(tmp_path)})
    assert warnings_about(conf(a=own_path)) == []
    assert len(warnings_about(conf(a=Upstream(command="only-here")))) == 1


def test_a_command_from_an_unset_variable_is_not_checked() -> None:
    placeholder = "unset-SERVER".ljust(32, "-")
    assert warnings_about(conf(a=Upstream(command=placeholder)), unset=["SERVER"]) == []
    assert len(warnings_about(conf(a=Upstream(command=placeholder)))) == 1


def test_a_command_given_as_a_list_says_how_to_write_it() -> None:
    """As many MCP client configs write it (issue 51): the one-line error says the YAML."""
    from gateway.settings import ConfigError
    from gateway.settings.load import from_mapping

    with pytest.raises(ConfigError) as exc:
        from_mapping({"upstreams": {"main": {"command": ["npx", "-y", "server"]}}})
    assert str(exc.value) == ("upstreams.main.command: one program, its arguments under "
                              '`args`: command: npx, args: ["-y", "server"]')
