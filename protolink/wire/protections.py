"""The server's own protections as both sides know them: the seccomp profile and the refusal.

The profile (``seccomp.json``, Docker's format) is one set of rules for two uses: the host
hands it to the engine for the container, and the server translates it into a filter of its
own for everything it starts, since a placement may drop it (a Docker Swarm service does).

At start the server checks every protection it depends on. When one is missing it refuses to
serve: it writes :func:`refusal` as its last line and exits with :data:`REFUSED`, and the host
reads the missing protections back with :func:`parse_refusal`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

#: The server's exit code when a protection is missing (``EX_CONFIG`` of sysexits.h).
REFUSED = 78
#: The protections a placement may hold where the server cannot see them, and name in the
#: server's ``--held-elsewhere``: a Kubernetes Pod always has an interface (a NetworkPolicy
#: isolates it) and its pids limit is the kubelet's, on a cgroup above the container's.
HELD_ELSEWHERE = ("network", "pids_limit", "memory_limit")
_PREFIX = "protolink-sandbox refused to serve, protections missing: "


def seccomp_profile() -> str:
    """The seccomp profile (JSON in Docker's format), stricter than Docker's default.

    Read beside this module (the package is always installed as files), not through
    ``importlib.resources``, whose import costs the server's start some 20 ms of CPU."""
    with open(os.path.join(os.path.dirname(__file__), "seccomp.json"), encoding="utf-8") as profile:
        return profile.read()


def refusal(missing: Mapping[str, str]) -> str:
    """The line that says which protections are missing (name -> what was found)."""
    return _PREFIX + json.dumps(dict(missing), sort_keys=True)


def parse_refusal(output: str) -> dict[str, str] | None:
    """The missing protections a :func:`refusal` line in ``output`` names (the last such line);
    None when there is none."""
    for line in reversed(output.splitlines()):
        if line.startswith(_PREFIX):
            try:
                missing = json.loads(line.removeprefix(_PREFIX))
            except ValueError:
                return None
            if isinstance(missing, dict) and all(isinstance(value, str) for value in missing.values()):
                return missing
            return None
    return None
