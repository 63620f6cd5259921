"""A seccomp profile in Docker's format, loaded as this process's own filter through libseccomp.

The server loads :func:`protolink.wire.protections.seccomp_profile` with :func:`load` before
it starts anything, so every process it starts inherits the filter, whatever the placement did
with the container's own profile. The translation follows Docker's: the native architecture
only (any other, x32 included, gets the default action), a rule kept when its ``includes`` and
``excludes`` name this architecture as they require, every name this architecture knows, the
rule's conditions on arguments, ``errnoRet`` or EPERM. Anything else in a profile (conditions on
capabilities or the kernel version) is refused rather than read differently from the engine.

libseccomp (``libseccomp.so.2``, Debian's ``libseccomp2``) is called through ctypes; the
filter is compiled as a binary tree of system call numbers.
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Mapping, Sequence
from typing import Any

_ACTIONS = {"SCMP_ACT_KILL": 0x00000000, "SCMP_ACT_KILL_THREAD": 0x00000000, "SCMP_ACT_KILL_PROCESS": 0x80000000,
            "SCMP_ACT_TRAP": 0x00030000, "SCMP_ACT_LOG": 0x7FFC0000, "SCMP_ACT_ALLOW": 0x7FFF0000}
_ACT_ERRNO = 0x00050000
_COMPARISONS = {"SCMP_CMP_NE": 1, "SCMP_CMP_LT": 2, "SCMP_CMP_LE": 3, "SCMP_CMP_EQ": 4, "SCMP_CMP_GE": 5,
                "SCMP_CMP_GT": 6, "SCMP_CMP_MASKED_EQ": 7}
_ATTR_ACT_BADARCH, _ATTR_CTL_NNP, _ATTR_CTL_OPTIMIZE = 2, 3, 8
#: Docker's names of the machines' architectures, as ``includes.arches`` writes them.
_DOCKER_ARCHES = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le", "s390x": "s390x",
                  "riscv64": "riscv64"}
_MACHINE = os.uname().machine  # what platform.machine() says, without importing platform at the server's start
_ARCH = _DOCKER_ARCHES.get(_MACHINE, _MACHINE)
_RULE_KEYS = {"names", "action", "errnoRet", "args", "includes", "excludes", "comment"}
_CONDITION_KEYS = {"arches"}


class _ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64),
                ("datum_b", ctypes.c_uint64)]


def _libseccomp() -> ctypes.CDLL:
    library = ctypes.CDLL("libseccomp.so.2", use_errno=True)
    library.seccomp_init.restype = ctypes.c_void_p
    library.seccomp_init.argtypes = [ctypes.c_uint32]
    library.seccomp_release.argtypes = [ctypes.c_void_p]
    library.seccomp_attr_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
    library.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    library.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint,
                                               ctypes.POINTER(_ArgCmp)]
    library.seccomp_load.argtypes = [ctypes.c_void_p]
    return library


def load(profile: Mapping[str, Any]) -> None:
    """Make ``profile`` this process's filter (and so its future children's). The process must
    already have no_new_privs, or CAP_SYS_ADMIN. OSError when the kernel refuses it; ValueError
    for a profile this translation does not read."""
    library = _libseccomp()
    default = _action(profile["defaultAction"], profile.get("defaultErrnoRet"))
    context = library.seccomp_init(default)
    if not context:
        raise OSError(errno.EINVAL, "seccomp_init failed")
    try:
        _check(library.seccomp_attr_set(context, _ATTR_ACT_BADARCH, default), "seccomp_attr_set")
        _check(library.seccomp_attr_set(context, _ATTR_CTL_NNP, 0), "seccomp_attr_set")  # set by the caller
        _check(library.seccomp_attr_set(context, _ATTR_CTL_OPTIMIZE, 2), "seccomp_attr_set")
        for rule in profile["syscalls"]:
            _add_rule(library, context, rule, default)
        _check(library.seccomp_load(context), "seccomp_load")
    finally:
        library.seccomp_release(context)


def _add_rule(library: ctypes.CDLL, context: int, rule: Mapping[str, Any], default: int) -> None:
    unknown = set(rule) - _RULE_KEYS
    conditions = {**rule.get("includes", {}), **rule.get("excludes", {})}
    if unknown or set(conditions) - _CONDITION_KEYS:
        raise ValueError(f"a seccomp rule this translation does not read: {sorted(unknown | set(conditions))}")
    if "arches" in rule.get("includes", {}) and _ARCH not in rule["includes"]["arches"]:
        return
    if _ARCH in rule.get("excludes", {}).get("arches", ()):
        return
    action = _action(rule["action"], rule.get("errnoRet"))
    if action == default:  # libseccomp refuses a rule that changes nothing
        return
    arguments = _arguments(rule.get("args") or ())
    for name in rule["names"]:
        number = library.seccomp_syscall_resolve_name(name.encode())
        if number < 0:  # not a system call of this architecture
            continue
        _check(library.seccomp_rule_add_array(context, action, number, len(arguments), arguments), f"rule for {name}")


def _arguments(args: Sequence[Mapping[str, Any]]) -> ctypes.Array[_ArgCmp]:
    return (_ArgCmp * len(args))(*(
        _ArgCmp(arg["index"], _COMPARISONS[arg["op"]], arg["value"], arg.get("valueTwo", 0)) for arg in args))


def _action(name: str, errno_ret: int | None) -> int:
    if name == "SCMP_ACT_ERRNO":
        return _ACT_ERRNO | ((errno.EPERM if errno_ret is None else errno_ret) & 0xFFFF)
    if name not in _ACTIONS:
        raise ValueError(f"a seccomp action this translation does not read: {name}")
    return _ACTIONS[name]


def _check(result: int, what: str) -> None:
    if result < 0:
        raise OSError(-result, f"{what}: {os.strerror(-result)}")
