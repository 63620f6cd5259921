#!/usr/bin/env bash
# Make a Docker Engine answer: the one bootstrap used by .ci/run, `make engine` and the sandbox CLI.
# Already answering: nothing to do. Otherwise install Debian's docker.io if dockerd is missing
# (Debian, root) and start dockerd in the background. Prints one line on success.
set -euo pipefail

# dockerd lives in /usr/sbin, which a non-login PATH may lack.
PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"
LOG=${PROTOLINK_DOCKERD_LOG:-/var/log/protolink-dockerd.log}
PIDFILE=/var/run/docker.pid
WAIT_SECONDS=60

die() { echo "engine-up: $*" >&2; exit 1; }

answers() { timeout 10 docker info >/dev/null 2>&1; }

ready() {
    echo "engine-up: Docker Engine $(docker version --format '{{.Server.Version}}') $1"
    exit 0
}

command -v docker >/dev/null || die "the docker client is missing (Debian: apt-get install docker.io)"
answers && ready "already answering"

# A remote or custom engine is not ours to start.
case "${DOCKER_HOST:-unix:///var/run/docker.sock}" in
    unix:///var/run/docker.sock) ;;
    *) die "DOCKER_HOST=$DOCKER_HOST does not answer; start that engine or unset DOCKER_HOST" ;;
esac

[ "$(id -u)" = 0 ] || die "no engine answers and starting dockerd needs root; run: sudo $0"

if ! command -v dockerd >/dev/null; then
    if [ ! -f /etc/debian_version ] || ! command -v apt-get >/dev/null; then
        die "dockerd is missing and this is not Debian: install Docker Engine, then rerun"
    fi
    echo "engine-up: installing docker.io (apt)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq docker.io >/dev/null
fi

# A dockerd that is still starting (another caller, or a slow start) is waited for, not doubled.
started=
if ! { [ -s "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }; then
    mkdir -p "$(dirname "$LOG")"
    # setsid: the engine outlives the shell or CI job that started it; --wait keeps $! alive
    # exactly as long as dockerd, so an early exit is seen at once.
    nohup setsid --wait dockerd </dev/null >>"$LOG" 2>&1 &
    started=$!
fi

for _ in $(seq "$WAIT_SECONDS"); do
    answers && ready "started (log: $LOG)"
    [ -z "$started" ] || kill -0 "$started" 2>/dev/null || break
    sleep 1
done
tail -n 30 "$LOG" >&2 || true
die "dockerd did not come up (log: $LOG)"
