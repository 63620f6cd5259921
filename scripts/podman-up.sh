#!/usr/bin/env bash
# Install Debian's podman (Debian, root) when it is missing: tests/integration/test_kube_podman.py
# runs the generated Kubernetes Pod with `podman kube play`. Used by `make podman` (which `make
# test` runs) and so by .ci/run. Idempotent: quick when podman runs already. catatonit is what
# podman 4.3 builds its local pause image from (no registry is reachable). Prints one line.
set -euo pipefail

PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

die() { echo "podman-up: $*" >&2; exit 1; }

if ! command -v podman >/dev/null || ! command -v catatonit >/dev/null; then
    if [ ! -f /etc/debian_version ] || ! command -v apt-get >/dev/null || [ "$(id -u)" != 0 ]; then
        die "podman is not installed (Debian, as root: apt-get install podman catatonit); nothing changed"
    fi
    echo "podman-up: installing podman (apt)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq podman catatonit >/dev/null
fi
timeout 60 podman info >/dev/null || die "podman is installed but \`podman info\` fails"
echo "podman-up: $(podman --version) ($(podman info --format '{{.Store.GraphDriverName}}') storage)"
