"""The server's own protections: what it establishes before anything runs, and what it checks.

A placement may silently drop what the server depends on (a Docker Swarm service drops the
seccomp profile and ``no-new-privileges``). So the server closes those gaps itself, in the
process every other one descends from, before it starts anything: :func:`establish` sets
no_new_privs and loads the product's seccomp profile as a filter of its own
(:mod:`protolink_sandboxd.seccomp_filter`), which the spawner, the keepers, the commands and the
workers inherit. :func:`missing` then reads what the process has: no_new_privs and a seccomp
filter, no capability but SETUID, SETGID and KILL in any set, no network interface but ``lo``
(TCP mode listens on the engine's bridge), a read-only root file system, and the pids and
memory limits of its cgroup where it can read them. gVisor shows no cgroups inside: there the
sandbox's tasks are bounded by RLIMIT_NPROC, which stands for the pids limit, and the memory
limit is not seen.
"""

from __future__ import annotations

import ctypes
import json
import logging
import resource
import socket
import sys
from collections.abc import Collection, Iterable

from protolink.wire.protections import refusal, seccomp_profile

from . import seccomp_filter
from .config import ServerConfig
from .privileges import forbid_new_privileges

#: The capabilities the server may hold (it runs commands as another uid and kills them).
ALLOWED_CAPABILITIES = frozenset({"KILL", "SETGID", "SETUID"})
#: Linux's capabilities by number.
CAPABILITY_NAMES = (
    "CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "SETPCAP",
    "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW", "IPC_LOCK", "IPC_OWNER",
    "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT", "SYS_ADMIN", "SYS_BOOT", "SYS_NICE",
    "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD", "LEASE", "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP",
    "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG", "WAKE_ALARM", "BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF",
    "CHECKPOINT_RESTORE",
)
CAPABILITY_SETS = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")
#: Where a cgroup shows its limits: cgroup v2's files, then v1's (the first that exists is read).
LIMIT_FILES = {
    "pids_limit": ("/sys/fs/cgroup/pids.max", "/sys/fs/cgroup/pids/pids.max"),
    "memory_limit": ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"),
}
#: cgroup v1 shows no memory limit as a number near 2**63.
_UNLIMITED_BYTES = 1 << 62
_PR_GET_SECCOMP = 21
_PR_GET_NO_NEW_PRIVS = 39
_SECCOMP_MODE_FILTER = 2

_libc = ctypes.CDLL(None, use_errno=True)
log = logging.getLogger("sandbox")


def hold(config: ServerConfig) -> bool:
    """Establish the protections, then check them all; whether the server may serve. When one
    is missing it writes the :func:`~protolink.wire.protections.refusal` on stderr, unless
    ``config.serve_unprotected`` (a server on a development host), which logs it and serves."""
    failed = establish()
    # Why establishing one failed says more than what is left of it.
    lacking = {**missing(tcp=config.tcp, held_elsewhere=config.held_elsewhere), **failed}
    if config.held_elsewhere:
        log.info("held by the placement where the server cannot see them: %s", ", ".join(sorted(config.held_elsewhere)))
    if not lacking:
        return True
    if config.serve_unprotected:
        log.warning("serving without these protections: %s", lacking)
        return True
    print(refusal(lacking), file=sys.stderr, flush=True)
    return False


def establish() -> dict[str, str]:
    """Set no_new_privs and load the seccomp profile as this process's filter; what failed
    (protection name -> the error). Call it while the process has one thread."""
    failed = {}
    try:
        forbid_new_privileges()
    except OSError as error:
        failed["no_new_privs"] = f"could not set it: {error.strerror or error}"
    try:
        seccomp_filter.load(json.loads(seccomp_profile()))
    except (OSError, ValueError) as error:
        failed["seccomp"] = f"could not load the filter: {getattr(error, 'strerror', None) or error}"
    return failed


def missing(*, tcp: bool, held_elsewhere: Collection[str] = ()) -> dict[str, str]:
    """The protections this process lacks (name -> what it has instead). ``tcp``: the server
    listens on a network (other interfaces than loopback are expected); ``held_elsewhere``: the
    protections not to look for (see :data:`~protolink.wire.protections.HELD_ELSEWHERE`)."""
    found = {}
    if _prctl(_PR_GET_NO_NEW_PRIVS) != 1:
        found["no_new_privs"] = "not set"
    if (mode := _prctl(_PR_GET_SECCOMP)) != _SECCOMP_MODE_FILTER:
        found["seccomp"] = f"mode {mode}, not a filter"
    if extra := _extra_capabilities():
        found["capabilities"] = "; ".join(f"{name}: {', '.join(caps)}" for name, caps in extra.items())
    if not tcp and "network" not in held_elsewhere and (interfaces := sorted(name for _, name in socket.if_nameindex() if name != "lo")):
        found["network"] = f"interfaces {', '.join(interfaces)}"
    if not _root_read_only():
        found["read_only_root"] = "the root file system is writable"
    for name, paths in LIMIT_FILES.items():
        if name in held_elsewhere:
            continue
        value = _first_readable(paths)
        if value is None and name == "pids_limit":
            value = _nproc()
        if value is not None and _unlimited(value):
            found[name] = f"none ({value})"
    return found


def _prctl(option: int) -> int:
    return _libc.prctl(option, 0, 0, 0, 0)


def _extra_capabilities() -> dict[str, list[str]]:
    """Each capability set of /proc/self/status that holds more than :data:`ALLOWED_CAPABILITIES`,
    with what it holds beyond them. (A set the kernel does not show, such as gVisor's ambient
    set, is bounded by the permitted and inheritable sets.)"""
    with open("/proc/self/status") as status:
        fields = dict(line.split(":", 1) for line in status if line.startswith("Cap"))
    extra = {}
    for name in CAPABILITY_SETS:
        if name in fields:
            held = _capabilities(int(fields[name], 16))
            if beyond := [cap for cap in held if cap not in ALLOWED_CAPABILITIES]:
                extra[name] = beyond
    return extra


def _capabilities(mask: int) -> Iterable[str]:
    return [CAPABILITY_NAMES[bit] if bit < len(CAPABILITY_NAMES) else str(bit)
            for bit in range(mask.bit_length()) if mask >> bit & 1]


def _root_read_only() -> bool:
    """Whether the mount on top of ``/`` is read-only (its options in /proc/self/mountinfo)."""
    options = ""
    with open("/proc/self/mountinfo") as mounts:
        for line in mounts:
            fields = line.split()
            if len(fields) > 5 and fields[4] == "/":
                options = fields[5]
    return "ro" in options.split(",")


def _first_readable(paths: Iterable[str]) -> str | None:
    for path in paths:
        try:
            with open(path) as limit:
                return limit.read().strip()
        except OSError:
            continue
    return None


def _nproc() -> str:
    """RLIMIT_NPROC's hard limit, as a cgroup would write it."""
    hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    return "max" if hard == resource.RLIM_INFINITY else str(hard)


def _unlimited(value: str) -> bool:
    return value == "max" or (value.isdigit() and int(value) >= _UNLIMITED_BYTES)
