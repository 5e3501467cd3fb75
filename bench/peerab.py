#!/usr/bin/env python3
"""peerbench (../shared/peerbench) with two builds of the gateway in one run: before/after
figures a change can be judged by, taken in the same interleaved rounds on the same host.

Adds the peers `gateway-before` and `gateway-tasks-before` (BEFORE_CMD, e.g. the console
script of a venv with the previous commit installed) beside peerbench's `gateway` and
`gateway-tasks` (GATEWAY_CMD), more builds by BUILDS ("py313=/tmp/gw313/bin/mcp-task-gateway":
peers `gateway-py313`, `gateway-tasks-py313`, ...), and `gateway-tasks-redis` with its tasks on
the Redis at REDIS_URL where set, `gateway-tasks-redis-wait` the same with every write
waiting for one store replica (Redis WAIT: attach one to that server); every gateway-tasks
peer reads bench/gateway-tasks.yaml (see its header). Results go where
peerbench's do; `report.py` prints them.

    BEFORE_CMD=/tmp/before/bin/mcp-task-gateway GATEWAY_CMD=/tmp/gw/bin/mcp-task-gateway \
        python3 bench/peerab.py --rounds 3 \
        --peers gateway,gateway-before,gateway-tasks,gateway-tasks-before,thin,null-node
    python3 ../shared/peerbench/report.py /tmp/peerbench/results.jsonl
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PEERBENCH = Path(os.environ.get("PEERBENCH", HERE.parents[1] / "shared" / "peerbench"))
TASKS_CONF = str(HERE / "gateway-tasks.yaml")


def load_peerbench():  # type: ignore[no-untyped-def]
    os.environ.setdefault("PROJECT_DIR", str(HERE.parent))
    sys.path.insert(0, str(PEERBENCH))
    spec = importlib.util.spec_from_file_location("peerbench_bench", PEERBENCH / "bench.py")
    if spec is None or spec.loader is None:
        raise SystemExit(f"peerbench not found at {PEERBENCH} (set PEERBENCH)")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def redis_conf(url: str, acked: int) -> str:
    """bench/gateway-tasks.yaml with its tasks on a Redis (YAML is a superset of JSON);
    `acked`: store replicas each write waits for (Redis WAIT)."""
    import yaml  # the gateway's own dependency: run this with the gateway's Python

    conf = yaml.safe_load(Path(TASKS_CONF).read_text())
    conf["store"] = {"backend": "redis", "url": url, "min_replicas_acked": acked,
                     "key_prefix": f"peerab{os.getpid()}-{acked}:"}
    conf["replica"] = {"secret": "peerab-" + "x" * 32}
    path = Path(tempfile.mkdtemp()) / "gateway-tasks-redis.json"
    path.write_text(json.dumps(conf))
    return str(path)


def gateway_peer(cmd: list[str], port: int, upstream: str, conf: str | None
                 ) -> dict[str, object]:
    args = ["--config", conf] if conf else []
    peer: dict[str, object] = {
        "cmd": [*cmd, *args, "--host", "127.0.0.1", "--port", str(port), "--",
                "python3", upstream],
        "port": port, "url": f"http://127.0.0.1:{port}/mcp"}
    if conf:
        peer["wrk_only"] = ["task-create", "task-get"]
    return peer


def builds() -> dict[str, list[str]]:
    """Peer-name suffix -> the gateway command: "" for GATEWAY_CMD, "-before" for
    BEFORE_CMD, and each `suffix=command` of BUILDS (comma-separated)."""
    out = {"": os.environ.get("GATEWAY_CMD", "mcp-task-gateway").split()}
    if before := os.environ.get("BEFORE_CMD"):
        out["-before"] = before.split()
    for item in filter(None, os.environ.get("BUILDS", "").split(",")):
        suffix, _, cmd = item.partition("=")
        out["-" + suffix] = cmd.split()
    return out


def main() -> None:
    bench = load_peerbench()
    upstream = str(PEERBENCH / "upstream.py")
    confs: dict[str, str | None] = {"gateway": None, "gateway-tasks": TASKS_CONF}
    if redis := os.environ.get("REDIS_URL"):
        confs["gateway-tasks-redis"] = redis_conf(redis, 0)
        confs["gateway-tasks-redis-wait"] = redis_conf(redis, 1)  # needs a replica attached
    port = 9130
    for suffix, cmd in builds().items():
        for name, conf in confs.items():
            bench.PEERS[name + suffix] = gateway_peer(cmd, port, upstream, conf)
            port += 1
    bench.main()


if __name__ == "__main__":
    main()
