#!/usr/bin/env bash
# Build the project's images without any image registry.
#   base: protolink/base:bookworm, a Debian minbase made by debootstrap and `docker import`.
# BASE_IMAGE=IMAGE skips the debootstrap and uses IMAGE as the base instead (pulled if missing).
# DEBIAN_MIRROR=URL overrides the mirror taken from apt's configuration.
set -euo pipefail

PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"
HERE=$(cd "$(dirname "$0")" && pwd)

BASE_TAG=protolink/base:bookworm
SUITE=bookworm
VARIANT=minbase
BASE_PACKAGES=python3,python3-venv,git,ca-certificates,tini
BASE_CHANGES=(
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    "ENV LANG=C.UTF-8"
    'CMD ["/bin/bash"]'
)
# Bump when the recipe changes in a way the variables above do not show.
BASE_RECIPE_VERSION=1
INPUTS_LABEL=io.protolink.image.inputs

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

build_base() {
    if [ -n "${BASE_IMAGE:-}" ]; then
        say "base: BASE_IMAGE=$BASE_IMAGE, skipping debootstrap"
        docker image inspect "$BASE_IMAGE" >/dev/null 2>&1 || docker pull "$BASE_IMAGE"
        BASE_REF=$BASE_IMAGE
        return
    fi
    BASE_REF=$BASE_TAG

    local inputs
    inputs=$(printf '%s\n' "$BASE_RECIPE_VERSION" "$SUITE" "$VARIANT" "$BASE_PACKAGES" \
        "${BASE_CHANGES[@]}" | sha256sum | cut -c1-16)
    if [ "$(image_label "$BASE_TAG" "$INPUTS_LABEL")" = "$inputs" ]; then
        say "base: $BASE_TAG is up to date ($INPUTS_LABEL=$inputs)"
        return
    fi

    command -v debootstrap >/dev/null || { say "installing debootstrap (apt)"; apt_install debootstrap; }
    local mirror started=$SECONDS
    mirror=$(debian_mirror)
    use_apt_proxy
    ROOTFS=$(mktemp -d /var/tmp/protolink-base.XXXXXX)
    # --one-file-system: never descend into a /proc or /sys that an interrupted debootstrap left mounted.
    trap 'rm -rf --one-file-system "$ROOTFS"' EXIT

    say "base: debootstrap $VARIANT $SUITE from $mirror (+$BASE_PACKAGES)"
    debootstrap --variant="$VARIANT" --include="$BASE_PACKAGES" "$SUITE" "$ROOTFS" "$mirror"
    # The image must not carry the host's package indexes or download cache.
    rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/*

    say "base: importing $(du -sh "$ROOTFS" | cut -f1) as $BASE_TAG"
    local change changes=(--change "LABEL $INPUTS_LABEL=$inputs" --change "LABEL io.protolink.image=base")
    for change in "${BASE_CHANGES[@]}"; do changes+=(--change "$change"); done
    tar --numeric-owner -C "$ROOTFS" -c . | docker import "${changes[@]}" - "$BASE_TAG" >/dev/null

    rm -rf "$ROOTFS"
    trap - EXIT
    say "base: built $BASE_TAG ($INPUTS_LABEL=$inputs) in $((SECONDS - started))s"
}

bash "$HERE/engine-up.sh"
build_base
# Next phase: build_sandbox, the sandbox image FROM "$BASE_REF" with the wheelhouse made by pip.
say "base image: $BASE_REF"
