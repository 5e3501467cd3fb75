"""Configuration: the YAML shape of INTERFACE.md, ${VAR} interpolation, flags over the file,
and one-line errors that name the key."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import loaded_by

from gateway.cli import build_settings, main, parser
from gateway.settings import ConfigError
from gateway.settings.load import from_mapping, load, read_raw
from gateway.settings.schema import Upstream
from gateway.tasks.policy import Policies

ROOT = Path(__file__).parents[2]


def build(*argv: str):
    return build_settings(parser().parse_args(list(argv)))


def test_every_example_config_is_valid(monkeypatch) -> None:
    monkeypatch.setenv("GATEWAY_TOKEN", "t" * 32)
    monkeypatch.setenv("API_KEY", "k")
    monkeypatch.setenv("REMOTE_TOKEN", "r")
    monkeypatch.setenv("OAUTH_ISSUER", "https://idp.example.com")
    examples = sorted((ROOT / "config").glob("*.yaml"))
    assert examples, "config/ should hold example files"
    for path in examples:
        assert load(path).upstreams, path


def test_interface_md_shape_loads(monkeypatch) -> None:
    monkeypatch.setenv("API_KEY", "abc")
    s = from_mapping({
        "listen": {"host": "0.0.0.0", "port": 9000},
        "upstreams": {"main": {"command": "npx", "args": ["-y", "x"],
                               "env": {"API_KEY": "${API_KEY}"}, "isolation": "client"},
                      "other": {"command": "python3", "path": "/other/mcp"}},
        "tasks": {"defaults": {"mode": "auto", "sync_budget_ms": 500},
                  "tools": {"longRunning*": {"mode": "always"}}},
        "limits": {"max_tasks": 5}, "auth": {"bearer_tokens": []},
        "security": {"allow_unauthenticated": True},
        "logging": {"level": "debug", "format": "console"}})
    assert s.upstreams["main"].env == {"API_KEY": "abc"}
    assert s.upstreams["main"].isolation == "client"
    assert s.tasks.tools["longRunning*"].mode == "always"
    assert s.listen.port == 9000


@pytest.mark.parametrize(("raw", "message"), [
    ({"upstreams": {"m": {"command": "x", "isolation": "wide"}}},
     "upstreams.m.isolation: Input should be 'shared', 'client' or 'call'"),
    ({"upstreams": {"m": {"command": "x"}}, "limitz": {}}, "limitz: unknown key"),
    # Issue 21: an unknown key beside the missing one it stands for is named, not hidden
    # behind "upstreams: Field required".
    ({"upstream": {"m": {"command": "x"}}},
     "upstream: unknown key `upstream`; did you mean `upstreams`?"),
    ({"upstreams": {"m": {"command": "x"}}, "tasks": {"tools": {"r*": {"max_concurency": 1}}}},
     "tasks.tools.r*.max_concurency: unknown key `max_concurency`; did you mean "
     "`max_concurrency`?"),
    # Through an optional section (an upstream's `tasks:`), a close key is offered too.
    ({"upstreams": {"m": {"command": "x", "tasks": {"defaults": {"mod": "never"}}}}},
     "upstreams.m.tasks.defaults.mod: unknown key `mod`; did you mean `mode`?"),
    ({"upstreams": {"m": {"command": "x"}}, "auth": {"oauth": {
        "resource": "https://gw", "issuers": ["https://idp"],
        "introspection": {"url": "https://idp/i", "client_id": "c", "client_secret": "s",
                          "requires_audience": False}}}},
     "auth.oauth.introspection.requires_audience: unknown key `requires_audience`; did you "
     "mean `require_audience`?"),
    ({"upstreams": {"m": {}}}, "upstreams.m: give exactly one of 'command'"),
    ({"upstreams": {"m": {"url": "https://u:pw@h.example/mcp",
                          "headers": {"Authorization": "Bearer t"}}}},
     "upstreams.m: 'url' carries a user and password and 'headers' an Authorization"),
    ({"upstreams": {"m": {"command": "x"}}, "listen": {"port": "eighty"}},
     "listen.port: Input should be a valid integer"),
    ({"upstreams": {"m": {"command": "x", "env": {"K": "${NOPE_NOT_SET}"}}}},
     "upstreams.m.env.K: environment variable NOPE_NOT_SET is not set"),
    ({"upstreams": {"a": {"command": "x"}, "b": {"command": "y"}}},
     "upstreams 'a' and 'b' share path /mcp"),
    # Issue 34: an upstream on a route of the gateway's own would be open (the probes, the
    # metadata) or meet the operators' check instead of the clients'.
    ({"upstreams": {"m": {"command": "x", "path": "/.well-known/mcp"}}},
     "upstreams.m: 'path' /.well-known/mcp is one of the gateway's own routes"),
    ({"upstreams": {"m": {"command": "x", "path": "/status"}}},
     "upstreams.m: 'path' /status is one of the gateway's own routes"),
    ({"upstreams": {"m": {"command": "x", "headers": {"X-Key": "k"}}}},
     "upstreams.m: 'headers', 'forward_headers' and 'token_exchange' apply to 'url' "
     "upstreams only"),
    ({"upstreams": {"m": {"url": "http://x/mcp", "token_exchange": {
        "url": "http://idp/token", "client_id": "g", "client_secret": "s"}}}},
     "upstreams.m.token_exchange needs auth.oauth"),
    ({"upstreams": {"m": {"command": "x"}}, "auth": {"oauth": {
        "resource": "http://gw/mcp", "issuers": ["http://idp"], "algorithms": ["HS256"]}}},
     "auth.oauth.algorithms: 'HS256' is not accepted"),
    ({"upstreams": {"m": {"command": "x"}}, "auth": {"oauth": {
        "resource": "http://gw/mcp", "issuers": []}}},
     "auth.oauth.issuers"),
    ({"upstreams": {"m": {"command": "x"}}, "auth": {"oauth": {
        "resource": "http://gw/mcp", "issuers": ["https://idp", "http://idp.example"]}}},
     "auth.oauth: issuers.1 is plain http beyond loopback: use https, or set "
     "auth.oauth.allow_http: true"),
    ({"upstreams": {"m": {"command": "x"}}, "auth": {"oauth": {
        "resource": "http://gw/mcp", "issuers": ["https://idp"], "introspection": {
            "url": "http://10.0.0.1/introspect", "client_id": "g", "client_secret": "s"}}}},
     "introspection.url is plain http beyond loopback"),
    ({"upstreams": {"m": {"command": "x"}}, "auth": {"oauth": {
        "resource": "http://gw/mcp", "issuers": ["https://idp"], "introspection": {
            "url": "https://idp/introspect", "client_id": "g", "client_secret": "s",
            "issuer": "https://elsewhere"}}}},
     "introspection.issuer 'https://elsewhere' is not one of issuers"),
    ({"upstreams": {"m": {"command": "x"}}, "auth": {"oauth": {
        "resource": "http://gw/mcp", "issuers": ["https://idp"], "key_refresh_s": 0}}},
     "auth.oauth.key_refresh_s"),
])
def test_bad_config_names_the_key(raw, message) -> None:
    with pytest.raises(ConfigError) as err:
        from_mapping(raw)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("issuer", "allow_http"), [
    ("https://idp.example", False), ("http://127.0.0.1:9000", False),
    ("http://127.1.2.3", False), ("http://[::1]:9000/realm", False),
    ("http://localhost:9000", False), ("http://idp.internal", True)])
def test_plain_http_issuers_are_for_loopback_or_an_explicit_opt_in(issuer, allow_http
                                                                   ) -> None:
    conf = from_mapping({"upstreams": {"m": {"command": "x"}}, "auth": {"oauth": {
        "resource": "http://gw/mcp", "issuers": [issuer], "allow_http": allow_http}}})
    assert conf.auth.oauth is not None and conf.auth.oauth.issuers == [issuer]


def test_env_default_syntax(monkeypatch) -> None:
    monkeypatch.delenv("MAYBE", raising=False)
    s = from_mapping({"upstreams": {"m": {"command": "${MAYBE:-python3}"}}})
    assert s.upstreams["m"].command == "python3"


def test_zero_config_command_line() -> None:
    s = build("--port", "9001", "--tasks", "always", "--task-tool", "echo=never", "--",
              "npx", "-y", "server")
    up = s.upstreams["main"]
    assert (up.command, up.args, up.path) == ("npx", ["-y", "server"], "/mcp")
    assert s.listen.host == "127.0.0.1" and s.listen.port == 9001
    assert s.tasks.defaults.mode == "always"
    assert s.tasks.tools["echo"].mode == "never"


def test_flags_override_the_file(tmp_path) -> None:
    conf = tmp_path / "g.yaml"
    conf.write_text("listen: {port: 7000}\nupstreams:\n  a: {command: one}\n")
    s = build("--config", str(conf), "--port", "7001", "--isolation", "call")
    assert s.listen.port == 7001
    assert s.upstreams["a"].isolation == "call"
    s = build("--config", str(conf), "--", "two")
    assert list(s.upstreams) == ["main"] and s.upstreams["main"].command == "two"


def test_an_http_upstream_from_the_command_line() -> None:
    up = build("--upstream-url", "http://127.0.0.1:9000/mcp").upstreams["main"]
    assert (up.url, up.command) == ("http://127.0.0.1:9000/mcp", None)
    for bad in ("nonsense", "ftp://host/mcp", "http:///mcp"):
        with pytest.raises(ConfigError, match=r"upstreams\.main: 'url' must be an http"):
            build("--upstream-url", bad)


def test_bad_task_tool_flag() -> None:
    with pytest.raises(ConfigError, match="NAME=MODE"):
        build("--task-tool", "echo", "--", "x")


def run_cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway", *argv], capture_output=True,
                          text=True, timeout=30)


def test_check_config_exit_codes(tmp_path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("upstreams:\n  main: {command: python3}\n")
    ok = run_cli("--check-config", str(good))
    assert ok.returncode == 0 and "ok" in ok.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("upstreams:\n  main: {command: python3, isolation: wide}\n")
    res = run_cli("--check-config", str(bad))
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0  # one line, no traceback
    assert "upstreams.main.isolation" in res.stderr
    broken = tmp_path / "broken.yaml"
    broken.write_text("upstreams: [\n")
    res = run_cli("--check-config", str(broken))
    assert res.returncode == 2 and "not valid YAML" in res.stderr and "Traceback" not in res.stderr
    missing = run_cli("--check-config", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and "nope.yaml" in missing.stderr


def test_check_config_applies_the_flags_a_start_would(tmp_path, monkeypatch) -> None:
    """Issue 21: `--check-config FILE --host 0.0.0.0` fails as the start would (no auth
    beyond loopback), and an unset ${VAR} is named, not an error, as before."""
    monkeypatch.delenv("NOT_SET_HERE", raising=False)
    conf = tmp_path / "g.yaml"
    conf.write_text("upstreams:\n  main: {command: python3, env: {K: '${NOT_SET_HERE}'}}\n")
    ok = run_cli("--check-config", str(conf))
    assert ok.returncode == 0 and "set before starting: NOT_SET_HERE" in ok.stdout
    res = run_cli("--check-config", str(conf), "--host", "0.0.0.0")
    assert res.returncode == 2 and "listen.host 0.0.0.0 is reachable" in res.stderr
    flagged = run_cli("--check-config", str(conf), "--port", "9001", "--tasks", "always")
    assert flagged.returncode == 0
    wrong = run_cli("--check-config", str(conf), "--task-tool", "echo=sometimes")
    assert wrong.returncode == 2 and "NAME=MODE" in wrong.stderr


def test_start_without_upstream_is_a_clear_error() -> None:
    res = run_cli()
    assert res.returncode == 2
    assert "no upstream" in res.stderr and "Traceback" not in res.stderr


def test_a_misspelt_upstreams_key_is_named_though_the_file_was_given(tmp_path, capsys
                                                                     ) -> None:
    """Issue 42: `upstream:` for `upstreams:` said "no upstream: give ... --config" although
    --config was given; now the unknown key is named, the near one offered, and its missing
    twin is no second problem."""
    conf = tmp_path / "g.yaml"
    conf.write_text("upstream:\n  main: {command: python3}\n")
    line = "upstream: unknown key `upstream`; did you mean `upstreams`?"
    assert main(["--check-config", str(conf)]) == 2
    err = capsys.readouterr().err
    assert err.strip().endswith(line) and "no upstream" not in err
    res = run_cli("--config", str(conf), "--isolation", "call")
    assert res.returncode == 2 and res.stderr.strip().endswith(line)
    conf.write_text("listen: {port: 9000}\n")
    assert main(["--check-config", str(conf)]) == 2
    assert capsys.readouterr().err.strip().endswith("upstreams: required, and not given")


def test_check_config_warns_of_a_command_not_found_here(tmp_path, capsys) -> None:
    """Issue 42: a command that does not exist here passed unremarked. It may exist where the
    file is meant to run (a container): a warning on stderr, the exit code still 0."""
    conf = tmp_path / "g.yaml"
    conf.write_text("upstreams:\n  main: {command: no-such-server-zz9}\n"
                    "  ok: {command: python3, path: /ok}\n")
    assert main(["--check-config", str(conf)]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"{conf}: ok (2 upstream(s))")
    assert err == (f"{conf}: warning: upstreams.main.command: 'no-such-server-zz9' is not on "
                   "the PATH here\n")


@pytest.mark.parametrize(("host", "auth", "allowed", "ok"), [
    ("0.0.0.0", [], False, False),
    ("10.1.2.3", [""], False, False),  # an empty token is no token
    ("0.0.0.0", ["s" * 32], False, True),
    ("0.0.0.0", [], True, True),
    ("127.0.0.1", [], False, True),
    ("localhost", [], False, True),
    ("::1", [], False, True),
])
def test_serving_beyond_loopback_needs_auth_or_says_so(host, auth, allowed, ok) -> None:
    raw = {"listen": {"host": host}, "upstreams": {"m": {"command": "x"}},
           "auth": {"bearer_tokens": auth}, "security": {"allow_unauthenticated": allowed}}
    if ok:
        assert from_mapping(raw).listen.host == host
        return
    with pytest.raises(ConfigError, match=r"security\.allow_unauthenticated: true") as caught:
        from_mapping(raw)
    assert f"listen.host {host} is reachable from other machines" in str(caught.value)


SHIPPED = sorted([*ROOT.glob("config/*.yaml"), *ROOT.glob("deploy/gateway*.yaml"),
                 *ROOT.glob("deploy/kubernetes/*/gateway.yaml")])


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_shipped_config_passes_check_config_as_shipped(path, monkeypatch, capsys) -> None:
    """Issue 13: --check-config on a shipped file succeeds before its secrets are set, and
    names the variables still to set; starting without them still fails, naming them."""
    for name in ("API_KEY", "GATEWAY_TOKEN", "REMOTE_TOKEN", "REDIS_URL", "GATEWAY_SECRET"):
        monkeypatch.delenv(name, raising=False)
    assert main(["--check-config", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{path}: ok (")
    needed = out.partition("set before starting: ")[2].strip()
    if needed:
        with pytest.raises(ConfigError, match="|".join(needed.split(", "))):
            load(path)


def test_deploy_takes_ports_ids_secret_and_token_from_the_environment(monkeypatch) -> None:
    """Issue 21: no port is hard-wired in deploy/ (replica.url follows GATEWAY_PORT), and
    the command line has flags for the replica id, its address and the token."""
    monkeypatch.setenv("GATEWAY_TOKEN", "t0k" * 11)
    monkeypatch.setenv("GATEWAY_SECRET", "s" * 32)
    monkeypatch.setenv("HOSTNAME", "gateway-2")
    monkeypatch.setenv("GATEWAY_PORT", "9090")
    for name in ("gateway.yaml", "gateway.sentinel.yaml"):
        s = load(ROOT / "deploy" / name)
        assert (s.listen.port, s.replica.id, s.replica_url) == (
            9090, "gateway-2", "http://gateway-2:9090")
        assert s.auth.bearer_tokens == ["t0k" * 11]
    for name in ("compose.yaml", "compose.sentinel.yaml"):
        text = (ROOT / "deploy" / name).read_text()
        assert ":8080" not in text.replace("${PORT:-8080}", "").replace(
            "${GATEWAY_PORT:-8080}", ""), name
    flags = build("--store-url", "redis://s:6379/0", "--replica-id", "r7", "--replica-url",
                  "http://r7:9000", "--token", "a" * 32, "--token", "b" * 32, "--host", "0.0.0.0",
                  "--", "x")
    assert (flags.replica.id, flags.replica_url) == ("r7", "http://r7:9000")
    assert flags.auth.bearer_tokens == ["a" * 32, "b" * 32]
    assert flags.store.url == "redis://s:6379/0"


def test_the_compose_files_are_consistent() -> None:
    """deploy/: every gateway service mounts a shipped config (checked above); Valkey keeps
    an append-only file synced each second; the Sentinel variant's sentinels watch the
    primary by the name its gateways follow, and the store's replica follows that primary."""
    deploy = ROOT / "deploy"
    plain = yaml.safe_load((deploy / "compose.yaml").read_text())
    valkey = plain["services"]["valkey"]["command"]
    assert valkey[-4:] == ["--appendonly", "yes", "--appendfsync", "everysec"]
    # Its own user (the e2e store tests run these very rights on a real server).
    assert valkey[1:9] == ["--user", "default", "off", "--user", "gateway", "on",
                           ">${STORE_PASSWORD}", "~mcpgw:*"]
    assert "-@dangerous" in valkey and "gateway:${STORE_PASSWORD" in \
        plain["x-gateway"]["environment"]["REDIS_URL"]
    sentinel = yaml.safe_load((deploy / "compose.sentinel.yaml").read_text())
    gateway = yaml.safe_load((deploy / "gateway.sentinel.yaml").read_text())["store"]
    watched = sentinel["services"]["sentinel-1"]["command"][0]
    assert f"sentinel monitor {gateway['sentinel_master']} valkey-1 6379 2" in watched
    assert gateway["min_replicas_acked"] == 1
    assert sentinel["services"]["valkey-2"]["command"][-3:] == ["--replicaof", "valkey-1",
                                                               "6379"]
    names = {s.split(":")[0] for s in gateway["sentinels"]}
    assert names <= set(sentinel["services"])
    for compose in (plain, sentinel):
        for name, service in compose["services"].items():
            for volume in service.get("volumes", []):
                source = volume.split(":")[0]
                if source.startswith("./"):
                    assert (deploy / source).exists(), f"{name} mounts {source}"


def test_a_store_is_found_by_url_or_by_sentinels() -> None:
    base = {"upstreams": {"main": {"command": "x"}}, "replica": {"secret": "s" * 32}}
    conf = from_mapping({**base, "store": {"backend": "redis", "sentinels": ["s1:26379"],
                                           "min_replicas_acked": 1}})
    assert conf.store.sentinel_master == "mymaster" and conf.store.url is None
    with pytest.raises(ConfigError, match=r"store: .*needs store\.url .* or store\.sentinels"):
        from_mapping({**base, "store": {"backend": "redis"}})
    with pytest.raises(ConfigError, match=r"^store\.sentinels: 's1' is not host:port$"):
        from_mapping({**base, "store": {"backend": "redis", "sentinels": ["s1"]}})


@pytest.mark.parametrize(("listen", "url"), [
    ({"host": "10.0.0.5", "port": 9000}, "http://10.0.0.5:9000"),
    ({"host": "::1", "port": 9000}, "http://[::1]:9000"),
    ({"host": "127.0.0.1", "port": 8080}, "http://127.0.0.1:8080"),
    ({"host": "0.0.0.0", "port": 8080}, None),  # names no one address
    ({"host": "127.0.0.1", "port": 0}, None),
])
def test_replica_url_defaults_to_a_specific_bind_address(listen, url) -> None:
    s = from_mapping({"listen": listen, "upstreams": {"m": {"command": "x"}},
                      "security": {"allow_unauthenticated": True}})
    assert s.replica_url == url
    given = from_mapping({"listen": listen, "upstreams": {"m": {"command": "x"}},
                          "security": {"allow_unauthenticated": True},
                          "replica": {"url": "http://gw-1:8080"}})
    assert given.replica_url == "http://gw-1:8080"


def test_a_shared_store_without_a_secret_is_refused(tmp_path, monkeypatch, capsys) -> None:
    """Issue 30: replicas on a shared store without replica.secret took any message
    published there and kept records anyone with the store's password could rewrite: such
    a configuration does not start, and says what to set and how to make it."""
    monkeypatch.delenv("GATEWAY_SECRET", raising=False)
    path = tmp_path / "shared.yaml"
    path.write_text(yaml.safe_dump({"upstreams": {"main": {"command": "x"}}, "store": {
        "backend": "redis", "url": "redis://127.0.0.1:6379/0"}}))
    assert main(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "config error" in err and "store.backend redis needs replica.secret" in err
    assert "openssl rand -hex 32" in err and "GATEWAY_SECRET" in err
    with pytest.raises(ConfigError, match=r"needs replica\.secret"):
        build("--store-url", "redis://s:6379/0", "--", "x")
    monkeypatch.setenv("GATEWAY_SECRET", "s" * 32)  # the command line's way
    assert build("--store-url", "redis://s:6379/0", "--", "x").replica.secret == "s" * 32
    assert build("--", "x").replica.secret is None  # one process needs none
    shipped = (ROOT / "deploy" / "gateway.yaml").read_text()
    assert "${GATEWAY_SECRET}" in shipped and "GATEWAY_SECRET:-" not in shipped


def test_the_startup_timeout_default_fits_every_shipped_config() -> None:
    """Issue 33: npx downloads server-everything at a container's every start; no shipped
    file has to raise startup_timeout_ms for it, and config/gateway.yaml, whose values are
    the defaults, shows the default."""
    default = Upstream(command="x").startup_timeout_ms
    assert default >= 120_000
    for path in SHIPPED:
        for up in read_raw(path)["upstreams"].values():
            assert up.get("startup_timeout_ms", default) <= default, path
    shown = read_raw(ROOT / "config" / "gateway.yaml")["upstreams"]["main"]
    assert shown["startup_timeout_ms"] == default


def test_the_per_upstream_tasks_example_overrides_the_global_policy(monkeypatch) -> None:
    """config/http-upstreams.yaml: each upstream's `tasks:` over the global one, field by
    field."""
    monkeypatch.setenv("REMOTE_TOKEN", "r")
    conf = load(ROOT / "config" / "http-upstreams.yaml")
    policies = Policies(conf.tasks, {n: u.tasks for n, u in conf.upstreams.items()})
    slow = policies.for_tool("local", "trigger-long-running-operation")
    assert (slow.mode, slow.poll_interval_ms, slow.sync_budget_ms) == ("always", 2000, 500)
    other = policies.for_tool("local", "get-sum")
    assert (other.mode, other.sync_budget_ms) == ("auto", 500)
    assert policies.for_tool("local", "echo").mode == "never"  # the global tools still hold
    assert policies.for_tool("remote", "anything").mode == "never"
    assert policies.for_tool("remote", "anything").sync_budget_ms == 1000


def test_an_upstreams_default_given_as_null_clears_the_global_one() -> None:
    """An upstream's `tasks.defaults` over the global ones: a key left out takes the global
    value; a null clears it where a policy may have none (`timeout_ms: null`: no timeout
    for this upstream's tasks, as before the settings were dataclasses); elsewhere a null
    is refused."""
    conf = from_mapping({"upstreams": {
        "m": {"command": "x", "tasks": {"defaults": {"timeout_ms": None, "sync_budget_ms": 10}}},
        "n": {"command": "x", "path": "/n", "tasks": {"defaults": {"sync_budget_ms": 20}}}},
        "tasks": {"defaults": {"timeout_ms": 5000, "mode": "always"}}})
    policies = Policies(conf.tasks, {n: u.tasks for n, u in conf.upstreams.items()})
    cleared, kept = policies.for_tool("m", "t"), policies.for_tool("n", "t")
    assert (cleared.timeout_ms, cleared.sync_budget_ms, cleared.mode) == (None, 10, "always")
    assert (kept.timeout_ms, kept.sync_budget_ms, kept.mode) == (5000, 20, "always")
    with pytest.raises(ConfigError, match=r"upstreams.m.tasks.defaults: `mode` cannot be null"):
        from_mapping({"upstreams": {"m": {"command": "x", "tasks": {"defaults": {
            "mode": None}}}}})


# A fresh process, single-threaded as the CLI is when it forks: validates `raw` through
# load_isolated and says what came back and whether pydantic was loaded here.
ISOLATED = """
import json, sys
from gateway.settings import ConfigError
from gateway.settings.isolated import load_isolated
from gateway.settings.load import from_mapping
raw = json.loads(sys.argv[1])
try:
    conf = load_isolated(lambda: from_mapping(raw))
except ConfigError as exc:
    print(json.dumps({"error": str(exc), "pydantic": "pydantic" in sys.modules}))
    raise SystemExit
loaded = "pydantic" in sys.modules
print(json.dumps({"equal": conf == from_mapping(raw), "repr": repr(conf), "pydantic": loaded}))
"""


def isolated(raw: dict[str, object]) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", ISOLATED, json.dumps(raw)], cwd=ROOT,
                         capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout))


def test_settings_validated_in_a_child_equal_those_validated_here() -> None:
    """Issue 34: the serving process gets its settings from a forked child (pydantic and
    its validators stay there, ~10 MiB): the same settings, secrets included and hidden."""
    raw = {"upstreams": {"m": {"command": "x", "tasks": {"defaults": {"mode": "never"}}},
                         "h": {"url": "https://mcp.example.com/mcp", "path": "/h",
                               "token_exchange": {"url": "https://idp.example.com/token",
                                                  "client_id": "gw",
                                                  "client_secret": "hunter2-exchange"}}},
           "auth": {"oauth": {"resource": "https://gw.example.com/mcp",
                              "issuers": ["https://idp.example.com"],
                              "introspection": {"url": "https://idp.example.com/introspect",
                                                "client_id": "gw",
                                                "client_secret": "hunter2-introspect"}}},
           "tasks": {"tools": {"slow*": {"mode": "always", "scopes": ["run"]}}},
           "replica": {"secret": "s" * 32, "id": ""}}
    answer = isolated(raw)
    assert answer["equal"] is True and answer["pydantic"] is False
    assert "hunter2" not in str(answer["repr"]) and "**********" in str(answer["repr"])


def test_a_config_error_in_the_child_reaches_the_parent_unchanged() -> None:
    raw = {"upstreams": {"m": {"command": "x", "pool_size": 0, "poolsize": 1}}}
    with pytest.raises(ConfigError) as here:
        from_mapping(raw)
    answer = isolated(raw)
    assert answer["error"] == str(here.value)
    assert str(here.value).startswith("upstreams.m.poolsize: unknown key `poolsize`; did you "
                                      "mean `pool_size`?")
    assert answer["pydantic"] is False


def test_a_serving_process_never_loads_pydantic() -> None:
    """The app and the CLI import no pydantic; only validating does (--check-config, or
    the child of load_isolated)."""
    code = ("import gateway.cli; from gateway.app import create_app; "
            "from gateway.settings.isolated import load_isolated; "
            "from gateway.settings.load import from_mapping; "
            "create_app(load_isolated(lambda: from_mapping({'upstreams': {'m': "
            "{'command': 'x'}}})))")
    assert loaded_by(code, ("pydantic", "pydantic_core")) == []
    assert loaded_by("from gateway.settings.load import from_mapping; "
                     "from_mapping({'upstreams': {'m': {'command': 'x'}}})",
                     ("pydantic",)) == ["pydantic"]


def test_a_serving_process_imports_the_settings_schema_only() -> None:
    """Issue 42: of the settings package, the CLI's way to a serving app imports the schema,
    its rules and the fork; interpolation, loading and error wording (and PyYAML, difflib)
    stay in the validating child."""
    code = ("import gateway.cli as cli; from gateway.app import create_app; "
            "from gateway.settings.isolated import load_isolated; "
            "args = cli.parser().parse_args(['--', 'python3']); "
            "create_app(load_isolated(lambda: cli.build_settings(args)))")
    parts = ("gateway.settings", "gateway.settings.schema", "gateway.settings.rules",
             "gateway.settings.isolated", "gateway.settings.env", "gateway.settings.load",
             "gateway.settings.problems", "pydantic", "yaml", "difflib")
    assert loaded_by(code, parts) == ["gateway.settings", "gateway.settings.isolated",
                                      "gateway.settings.rules", "gateway.settings.schema"]


def test_a_validating_child_killed_is_reported_as_killed_not_as_a_config_error() -> None:
    """The OOM killer (say) takes the child: the parent says so, with no config error's exit
    code (2) that would send an operator looking for a mistake in the file."""
    stderr = failed_isolated("os.kill(os.getpid(), signal.SIGKILL)")
    assert "process ended unanswered (killed by signal 9)" in stderr


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc")
def test_an_interrupted_start_leaves_no_validating_child(tmp_path: Path) -> None:
    """Ctrl-C while the child still reads the file (a FIFO nobody writes): the child goes
    with the parent, rather than waiting on, orphaned."""
    fifo = tmp_path / "gateway.yaml"
    os.mkfifo(fifo)
    parent = subprocess.Popen([sys.executable, "-m", "gateway", "--config", str(fifo)],
                              cwd=ROOT, stderr=subprocess.DEVNULL)
    children = Path(f"/proc/{parent.pid}/task/{parent.pid}/children")
    child = ""
    for _ in range(200):  # until the child is forked
        if child := children.read_text().strip():
            break
        time.sleep(0.05)
    assert child, "no validating child was forked"
    parent.send_signal(signal.SIGINT)
    parent.wait(10)
    for _ in range(100):
        if not Path(f"/proc/{child}").exists():
            break
        time.sleep(0.05)
    assert not Path(f"/proc/{child}").exists() or "Z" in Path(
        f"/proc/{child}/stat").read_text().split(")")[1][:3]  # gone, or only a zombie


def test_a_crash_while_validating_in_the_child_is_no_config_error() -> None:
    """A bug in validation (not a bad file) reaches the parent as itself, traceback and all,
    not as a config error line."""
    stderr = failed_isolated("{}['no such key']")
    assert "RuntimeError: validating the configuration failed in its process" in stderr
    assert "KeyError: 'no such key'" in stderr


def failed_isolated(build: str) -> str:
    """The stderr of a fresh process whose load_isolated ran `build` in its child: it must
    exit 1 (a fault, not a config error's 2)."""
    code = ("import os, signal\nfrom gateway.settings.isolated import load_isolated\n"
            f"load_isolated(lambda: {build})")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True)
    assert out.returncode == 1
    return out.stderr


def test_the_settings_repr_shows_no_secret() -> None:
    """A settings object in a traceback with its locals (an error tracker, say) or a debug
    print shows none of the gateway's secrets or an upstream's credentials."""
    secrets = {"bearer": "TOKEN-" + "a" * 40, "admin": "ADMIN-" + "b" * 40,
               "replica": "REPLICA-" + "c" * 20, "state": "STATE-" + "d" * 20,
               "store": "STOREPW", "env": "ENVSECRET", "url": "URLPW", "header": "HDRSECRET"}
    conf = from_mapping({
        "auth": {"bearer_tokens": [secrets["bearer"]], "admin_tokens": [secrets["admin"]]},
        "replica": {"secret": secrets["replica"]},
        "security": {"request_state_key": secrets["state"]},
        "store": {"backend": "redis", "url": f"redis://:{secrets['store']}@h:6379/0"},
        "upstreams": {"a": {"command": "x", "env": {"K": secrets["env"]}},
                      "b": {"url": f"https://u:{secrets['url']}@h/mcp", "path": "/b",
                            "headers": {"X-Key": secrets["header"]}}}})
    shown = repr(conf)
    assert [name for name, value in secrets.items() if value in shown] == []


def test_an_upstreams_defaults_built_in_code_count_the_keys_they_set() -> None:
    """Not only a file's: `UpstreamDefaults(mode="always")` made by an embedder or a test
    sets the mode (it was silently ignored, `given` being filled by validation only)."""
    from gateway.settings.schema import Tasks, UpstreamDefaults, UpstreamTasks

    upstream = UpstreamTasks(defaults=UpstreamDefaults(mode="always"))
    assert Policies(Tasks(), {"m": upstream}).for_tool("m", "t").mode == "always"
