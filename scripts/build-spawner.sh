#!/usr/bin/env bash
# Compile the command spawner (sandbox/spawner.c) into OUT, a static executable, unless OUT is
# newer than the source and this script. Used by build-images.sh (for the image) and by the
# tests (for servers run on this host). Where no C compiler is found and the machine is Debian
# with root, it installs gcc and libc6-dev; elsewhere it says what is missing.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
SOURCE=$HERE/../sandbox/spawner.c
OUT=${1:?usage: build-spawner.sh OUT}
CC=${CC:-cc}
CFLAGS=(-O2 -static -std=c11 -Wall -Wextra -Werror)

die() { echo "build-spawner: $*" >&2; exit 1; }

if [ -x "$OUT" ] && [ "$OUT" -nt "$SOURCE" ] && [ "$OUT" -nt "$0" ]; then
    exit 0
fi

if ! command -v "$CC" >/dev/null || ! [ -e /usr/include/stdio.h ]; then
    if [ "$(id -u)" = 0 ] && [ -f /etc/debian_version ] && command -v apt-get >/dev/null; then
        echo "build-spawner: installing gcc and libc6-dev (apt)" >&2
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends gcc libc6-dev >/dev/null
        CC=gcc
    else
        die "no C compiler: install one with the C library's static archive (Debian: gcc libc6-dev), or set CC"
    fi
fi

mkdir -p "$(dirname "$OUT")"
# Built beside OUT and moved into place: a concurrent run never sees half a file.
"$CC" "${CFLAGS[@]}" -o "$OUT.$$" "$SOURCE"
mv -f "$OUT.$$" "$OUT"
