#!/usr/bin/env bash
# The test command (README, CI): installs everything the tests need, then runs them.
#   - a virtual environment in .venv with the gateway and its test dependencies;
#   - Node 22, the TypeScript SDK, server-everything and the conformance suite in tests/node
#     (from its lockfile);
#   - .test-envs/mcp130: the Python SDK mcp==1.30.0, whose version clashes with ours (the
#     last one with the 2025-11-25 tasks client);
#   - .test-envs/k8s: checkov and kubernetes-validate (its Kubernetes schemas bundled), which
#     check deploy/kubernetes offline and pin many libraries of their own;
#   - a Redis-compatible server with Sentinel and HAProxy for the replica tests, nginx for the
#     long calls' (a hop that cuts quiet connections), Chromium for the status page's, podman (with runc) and mmdebstrap to build and run the container
#     image, and podman-compose (Debian's packages, when one of them is not there);
#   - ruff, mypy --strict, then pytest on $TEST_WORKERS (4) workers (extra arguments go to
#     pytest; -n 0 runs serially).
set -euo pipefail
cd "$(dirname "$0")/.."

sudo=$([ "$(id -u)" = 0 ] || echo sudo)
apt_install() {  # Debian's packages, reading the package lists afresh if they are stale
    local apt=($sudo env DEBIAN_FRONTEND=noninteractive apt-get -qq)
    "${apt[@]}" install -y "$@" >/dev/null 2>&1 || {
        "${apt[@]}" update && "${apt[@]}" install -y "$@" >/dev/null; }
}
if ! { command -v redis-server || command -v valkey-server; } >/dev/null || \
        ! command -v redis-sentinel >/dev/null || ! command -v haproxy >/dev/null || \
        ! command -v chromium >/dev/null || ! command -v nginx >/dev/null; then
    apt_install redis-server redis-sentinel haproxy chromium nginx-light
fi
if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
    apt_install --no-install-recommends prometheus  # both; not its exporters
fi
if ! command -v podman >/dev/null || ! command -v runc >/dev/null || \
        ! command -v mmdebstrap >/dev/null || ! [ -x /usr/bin/podman-compose ]; then
    # Where these cannot be installed, the image's tests say so and are skipped. Debian's
    # podman-compose (1.0 on Debian 12) beside the venv's newer one: deploy/'s compose files
    # are run with both.
    apt_install podman runc mmdebstrap podman-compose ||
        echo "test.sh: podman could not be installed" >&2
fi

python3 -m venv .venv
.venv/bin/pip install --quiet --disable-pip-version-check -e '.[test]' -c tests/constraints.txt
(cd tests/node && npm ci --no-audit --no-fund --loglevel=error)
python3 -m venv .test-envs/mcp130
.test-envs/mcp130/bin/pip install --quiet --disable-pip-version-check 'mcp==1.30.0'
K8S_CHECKS=('checkov==3.3.30' 'kubernetes-validate==1.37.0')
# Installed once: pip resolving checkov's pins again would cost seconds on every run.
if ! .test-envs/k8s/bin/python - "${K8S_CHECKS[@]}" 2>/dev/null <<'PY'
import sys
from importlib.metadata import version
sys.exit(any(version(n) != v for n, v in (p.split("==") for p in sys.argv[1:])))
PY
then
    python3 -m venv .test-envs/k8s
    .test-envs/k8s/bin/pip install --quiet --disable-pip-version-check "${K8S_CHECKS[@]}"
fi

.venv/bin/ruff check gateway tests bench scripts
.venv/bin/mypy  # strict, over gateway/ (pyproject.toml)
# Four workers on two cores: most tests wait on subprocesses and timers, not the CPU.
exec .venv/bin/pytest -n "${TEST_WORKERS:-4}" "$@"
