#!/usr/bin/env bash
# Installs the bridges bench/peers.py compares the gateway with, into bench/.peers (or
# $PEERS_DIR): PyPI mcp-proxy in a virtual environment, npm supergateway and mcp-proxy.
set -euo pipefail
dir=${PEERS_DIR:-$(dirname "$0")/.peers}
mkdir -p "$dir/npm"
python3 -m venv "$dir/venv"
"$dir/venv/bin/pip" install --quiet --disable-pip-version-check 'mcp-proxy==0.13.0'
cd "$dir/npm"
[ -f package.json ] || npm init -y >/dev/null
npm install --silent --no-audit --no-fund supergateway@4.0.0 mcp-proxy@6.7.19
echo "peers installed in $dir"
