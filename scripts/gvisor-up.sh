#!/usr/bin/env bash
# Register gVisor's runsc with the local Docker Engine as the runtime "runsc" (see SECURITY.md):
# used by `make gvisor`, `make test-gvisor` and .ci/run. Installs Debian's runsc when it is
# missing (Debian, root), as engine-up.sh installs the engine. Idempotent: daemon.json is touched
# only when its entry differs, then dockerd reloads it (SIGHUP; running containers are untouched).
# Prints one line on success.
set -euo pipefail

PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"
DAEMON_JSON=${PROTOLINK_DAEMON_JSON:-/etc/docker/daemon.json}
WAIT_SECONDS=30

die() { echo "gvisor-up: $*" >&2; exit 1; }

if ! command -v runsc >/dev/null; then
    if [ ! -f /etc/debian_version ] || ! command -v apt-get >/dev/null || [ "$(id -u)" != 0 ]; then
        die "runsc is not installed (Debian, as root: apt-get install runsc); nothing changed"
    fi
    echo "gvisor-up: installing runsc (apt)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends runsc >/dev/null
fi
RUNSC=$(command -v runsc)
registered() { timeout 10 docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '"runsc"'; }

# --network=none: runsc cannot set up networking for --network none containers otherwise;
# --host-uds=create: the server creates its socket on a host-mounted directory.
changed=$(RUNSC="$RUNSC" DAEMON_JSON="$DAEMON_JSON" python3 - <<'PY'
import json, os
path, runsc = os.environ["DAEMON_JSON"], os.environ["RUNSC"]
try:
    with open(path) as file:
        config = json.load(file)
except FileNotFoundError:
    config = {}
entry = {"path": runsc, "runtimeArgs": ["--network=none", "--host-uds=create"]}
if config.get("runtimes", {}).get("runsc") == entry:
    print("no")
else:
    config.setdefault("runtimes", {})["runsc"] = entry
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as file:
        json.dump(config, file, indent=2)
        file.write("\n")
    os.replace(path + ".tmp", path)
    print("yes")
PY
)

if [ "$changed" = yes ] || ! registered; then
    pid=$(pidof dockerd) || die "dockerd is not running; start it (scripts/engine-up.sh), then rerun"
    kill -HUP $pid
    for _ in $(seq "$WAIT_SECONDS"); do
        registered && break
        sleep 1
    done
    registered || die "dockerd did not list runsc after reloading $DAEMON_JSON"
fi
echo "gvisor-up: runtime runsc ($RUNSC, $(runsc --version 2>/dev/null | head -1)) registered"
