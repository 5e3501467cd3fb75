"""The command line (README, Use): zero-config flags, or `--config FILE` with flags on top."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from gateway import __version__
from gateway.settings import ConfigError
from gateway.settings.isolated import load_isolated
from gateway.settings.schema import Settings

MODES = ("never", "auto", "always", "required")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mcp-task-gateway",
        description="Front MCP servers with Streamable HTTP and turn slow tool calls into tasks.",
        epilog="example: mcp-task-gateway --port 8080 -- "
               "npx -y @modelcontextprotocol/server-everything",
    )
    p.add_argument("--config", metavar="FILE", help="YAML configuration file")
    p.add_argument("--check-config", metavar="FILE", help="validate FILE and exit (0 ok, 2 bad)")
    p.add_argument("--host", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port to bind (default 8080)")
    p.add_argument("--upstream-url", metavar="URL", help="front a Streamable HTTP server")
    p.add_argument("--isolation", choices=("shared", "client", "call"))
    p.add_argument("--tasks", choices=MODES, metavar="MODE", help="default task mode for tools")
    p.add_argument("--task-tool", action="append", default=[], metavar="NAME=MODE",
                   help="task mode for one tool (repeatable; NAME may be a glob)")
    p.add_argument("--store-url", metavar="URL",
                   help="share tasks through Redis/Valkey (redis://host:port/db); the "
                        "replicas' secret comes from GATEWAY_SECRET in the environment")
    p.add_argument("--replica-id", metavar="ID",
                   help="this replica's id among those sharing the store (default: random)")
    p.add_argument("--replica-url", metavar="URL",
                   help="where the other replicas reach this one (default: the bind address, "
                        "unless a wildcard)")
    p.add_argument("--token", action="append", default=[], metavar="TOKEN",
                   help="a bearer token clients must send (repeatable; other local users can "
                        "read it in the process list: a config file with ${VAR} cannot leak)")
    p.add_argument("--drain-ms", type=int, metavar="MS",
                   help="on SIGTERM, how long running calls may finish (shutdown.drain_ms)")
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"))
    p.add_argument("--log-format", choices=("json", "console"))
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARG...]: a stdio server")
    return p


def build_settings(args: argparse.Namespace, unset: list[str] | None = None) -> Settings:
    """The file's settings (if any) with every given flag applied on top; with `unset`,
    as `load.from_mapping` checks them (unset variables collected there)."""
    # Validating: in load_isolated's child (or --check-config), never in a serving process.
    from gateway.settings import load

    raw: dict[str, Any] = {}
    path = args.check_config or args.config
    if path:
        raw = load.read_raw(path)
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: the configuration must be a YAML mapping")
    _apply_upstream_flags(raw, args, from_file=bool(path))
    _set(raw, ("listen", "host"), args.host)
    _set(raw, ("listen", "port"), args.port)
    if args.store_url:
        _set(raw, ("store", "backend"), "redis")
        _set(raw, ("store", "url"), args.store_url)
        # The replicas' secret: from the environment, never a flag (the process list).
        if not (raw.get("replica") or {}).get("secret") and os.environ.get("GATEWAY_SECRET"):
            _set(raw, ("replica", "secret"), os.environ["GATEWAY_SECRET"])
    _set(raw, ("replica", "id"), args.replica_id)
    _set(raw, ("replica", "url"), args.replica_url)
    if args.token:
        _set(raw, ("auth", "bearer_tokens"), args.token)
    _set(raw, ("shutdown", "drain_ms"), args.drain_ms)
    _set(raw, ("logging", "level"), args.log_level)
    _set(raw, ("logging", "format"), args.log_format)
    _set(raw, ("tasks", "defaults", "mode"), args.tasks)
    for item in args.task_tool:
        name, sep, mode = item.partition("=")
        if not sep or not name or mode not in MODES:
            raise ConfigError(f"--task-tool {item}: expected NAME=MODE with MODE one of {MODES}")
        _set(raw, ("tasks", "tools", name, "mode"), mode)
    return load.from_mapping(raw, unset)


def _apply_upstream_flags(raw: dict[str, Any], args: argparse.Namespace, from_file: bool
                          ) -> None:
    """A command or URL on the command line replaces the file's upstreams with one, "main";
    --isolation applies to every upstream."""
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if command and args.upstream_url:
        raise ConfigError("give either a command after -- or --upstream-url, not both")
    if command or args.upstream_url:
        target = {"url": args.upstream_url} if args.upstream_url else {
            "command": command[0], "args": command[1:]}
        raw["upstreams"] = {"main": target}
    if not raw.get("upstreams") and not from_file:
        # With a file, validation says what is wrong: a misspelt `upstream:` is an unknown
        # key, the near one offered (settings/problems.py), though --config was given.
        raise ConfigError("no upstream: give -- COMMAND [ARG...], --upstream-url or --config")
    upstreams = raw.get("upstreams")
    if args.isolation and isinstance(upstreams, dict):
        for up in upstreams.values():
            if isinstance(up, dict):
                up["isolation"] = args.isolation


def _set(tree: dict[str, Any], keys: tuple[str, ...], value: Any) -> None:
    if value is None:
        return
    for key in keys[:-1]:
        tree = tree.setdefault(key, {})
    tree[keys[-1]] = value


def check(args: argparse.Namespace) -> int:
    """--check-config: the same rules as a start with the same flags. A valid file says ok
    (stdout), then what will likely fail where it is checked (stderr, exit 0 still: the
    file may be meant for another machine or a container)."""
    from gateway.settings import problems

    unset: list[str] = []
    conf = build_settings(args, unset)
    needs = f"; set before starting: {', '.join(sorted(set(unset)))}" if unset else ""
    print(f"{args.check_config}: ok ({len(conf.upstreams)} upstream(s)){needs}")
    for warning in problems.warnings_about(conf, unset):
        print(f"{args.check_config}: warning: {warning}", file=sys.stderr)
    return 0


# frozenlist's compiled FrozenList is C++: loading it maps libstdc++ into the process, ~1 MiB
# resident (issue 54), for a list aiohttp reads once a request (its signals); the pure-Python
# one costs ~0.2 us a request there. Chosen for the import only: an upstream server started
# later does not inherit the variable.
PURE_FROZENLIST = "FROZENLIST_NO_EXTENSIONS"


def _lean_imports() -> None:
    """aiohttp, imported as a serving gateway needs it (issue 54): ~1.5 MiB resident less."""
    _lean_frozenlist()
    _lean_mimetypes()


def _lean_mimetypes() -> None:
    """Import aiohttp's static-file responses without the system's MIME tables: at import
    it builds a `MimeTypes()`, which reads /etc/mime.types and the like where they exist
    (~0.4 MiB resident), for files the gateway never serves; Python's own table stays in it.
    `mimetypes` itself is left as it was: its functions still read those files if called."""
    import mimetypes

    if mimetypes.inited or "aiohttp.web_fileresponse" in sys.modules:
        return
    mimetypes.inited = True  # MimeTypes() then skips init(), which reads the files
    try:
        import aiohttp.web_fileresponse  # noqa: F401
    finally:
        mimetypes.inited = False


def _lean_frozenlist() -> None:
    """Import frozenlist (before aiohttp does) without its compiled extension, unless the
    environment already says which one it wants."""
    if "frozenlist" in sys.modules or PURE_FROZENLIST in os.environ:
        return
    os.environ[PURE_FROZENLIST] = "1"
    try:
        import frozenlist  # noqa: F401
    finally:
        del os.environ[PURE_FROZENLIST]


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.check_config:
            return check(args)
        # Validated in a child process: pydantic never loads into the one that serves.
        conf = load_isolated(lambda: build_settings(args))
        _lean_imports()
        from gateway.app import serve  # imported late: --check-config stays light and fast

        return serve(conf)
    except ConfigError as exc:  # the file's, or what it asks for (tracing without its SDK)
        print(f"mcp-task-gateway: config error: {exc}", file=sys.stderr)
        return 2
