"""The spawner: a helper process that starts commands with the command user's identity.

CPython starts a child with ``vfork`` only when the child keeps its parent's credentials;
a server that changes the uid in each child pays a full ``fork`` (or an extra exec of a
launcher such as setpriv) for every command. So one small single-threaded process takes the
command user's identity once, and the server sends it each command's argv, working directory
and environment with the two ends of the output pipes (``SCM_RIGHTS``), and the read end of
its stdin pipe after them when it has one (else its stdin is /dev/null). It answers with the
command's pid and reports its exit code. Each command runs under a keeper of its own, a child
subreaper that adopts whatever the command's descendants orphan, so that everything descended
from a running command stays below the spawner whatever its group or session, and leaves it
when the command ends (see ``spawner.c`` and :mod:`protolink_sandboxd.strays`). The server keeps
everything else: output, caps, timeouts, group kills and strays. A keeper only kills its
command's group once the deadline and the grace the server gives have passed, as the server
does, for a server its commands starve of the CPU.

This module prepares the process (:func:`run`), then executes the compiled spawner
(``sandbox/spawner.c``, installed at :data:`PROGRAM`), which takes the identity below and
serves the channel with no interpreter in the way of each start. It starts a command exactly as
:func:`protolink.execution.processes.start_process` does on the host. It also resolves
commands with exactly the permissions commands will have, and checks again, before it starts
one, a command whose resolution the client reused. The rules stay in
:mod:`protolink.execution.resolve`: the server sends the candidates they give, and the spawner
says which directory the working directory names and which candidate is the first executable
file.

Identity: effective uid and gid the command user's, no supplementary groups, no new
privileges, non-dumpable, and a real and saved uid of its own
(:func:`~protolink_sandboxd.privileges.shielding_uid`) so that commands cannot signal or ``prlimit`` it.
A keeper has the same identity, and each command takes the command user's real uid itself
(from its effective uid, which needs no privilege) before it executes: neither the spawner nor
a keeper ever has it as real or saved uid, so commands can never signal them. Unlike a worker
(:func:`~protolink_sandboxd.privileges.drop_to_shielded`) they cannot keep the command uid out of their
effective uid, so commands may renice them (to a lower priority only) and set their CPU
affinity: a child could only take an identity its parent does not hold with CAP_SETUID (see
SECURITY.md, "The command spawner acts as the command user").

Wire format (stated here and in ``spawner.c``): :data:`HEADER` (kind, request id, payload
length), then the payload; :func:`spawn_request` and :func:`resolve_request` encode requests,
answers carry a :data:`NUMBER` and maybe text after it.
"""

from __future__ import annotations

import math
import os
import resource
import struct
import sys
import traceback
from collections.abc import Iterable, Mapping, Sequence

from .privileges import (
    OOM_COMMAND,
    OOM_HELPER,
    OOM_SCORE_ADJ,
    die_with_parent,
    forbid_new_privileges,
    helper_arguments,
    limit,
    make_non_dumpable,
    set_oom_score_adj,
    shielding_uid,
)

#: Where the image installs the compiled spawner (``python -m protolink_sandboxd --spawner-program``).
PROGRAM = "/opt/protolink/libexec/protolink-spawner"

HEADER = struct.Struct("!BQI")
#: The numbers answers carry: an errno before the message (FAILED), a candidate's index (RESOLVED).
NUMBER = struct.Struct("!i")
#: An EXITED answer: the exit code, negative for the signal that ended the command, and 1 when the
#: command's keeper killed its group at the kill-after time, else 0.
EXIT = struct.Struct("!ii")
#: A STARTED answer: the command's pid and its keeper's.
PIDS = struct.Struct("!ii")
# Requests (server -> spawner): payloads made by spawn_request and resolve_request.
SPAWN, RESOLVE = 1, 2
# Answers (spawner -> server). CHANGED: a SPAWN's check failed and nothing started; RESOLVED:
# the index of the first executable candidate (-1: none), then the directory's real path, NUL
# and the candidate's real path (empty when none); REFUSED: the working directory names no directory.
STARTED, FAILED, EXITED, RESOLVED, REFUSED, CHANGED = 11, 12, 13, 14, 15, 16
#: Unasked (request 0): the pid of the keeper forked ahead for the next command, 0 once none waits.
WARM = 17
#: The longest kill-after time a SPAWN carries (``MAX_KILL_AFTER_MS`` in ``spawner.c``; about 24
#: days); a later deadline is the server's alone.
MAX_KILL_AFTER_SECONDS = (1 << 31) - 1
_TOO_LARGE = "the command, its environment and the places its executable may be are too large to pass on"


def spawn_request(request: int, argv: Sequence[str], cwd: str, env: Mapping[str, str],
                  check: tuple[str, Iterable[str]] | None, *, max_bytes: int, real_executable: str | None = None,
                  kill_after_seconds: float | None = None) -> bytes:
    """A SPAWN frame. ``check``, when given, is the working directory as written and the
    executable's candidates: the command starts only if the first names ``cwd`` and the first
    executable file among the others is ``argv[0]``. ``real_executable``, when given, is the
    file argv[0] must still resolve to. ``kill_after_seconds``, when given, is how long after
    its start the command's keeper kills its group (in whole milliseconds, rounded up; none
    beyond :data:`MAX_KILL_AFTER_SECONDS`). No text may contain NUL (see
    :func:`protolink.execution.resolve.check_command`); ValueError when the payload would
    exceed ``max_bytes``."""
    written, candidates = check if check is not None else ("", ())
    listed = _bounded(candidates, max_bytes)
    kill_after = 0
    if kill_after_seconds is not None and kill_after_seconds <= MAX_KILL_AFTER_SECONDS:
        kill_after = max(math.ceil(kill_after_seconds * 1000), 1)
    fields = [str(len(argv)), *argv, cwd, str(len(env)), *(f"{name}={value}" for name, value in env.items()),
              str(kill_after), written, str(len(listed)), *listed, real_executable or ""]
    return _frame(SPAWN, request, fields, max_bytes)


def resolve_request(request: int, cwd: str, candidates: Iterable[str], *, max_bytes: int) -> tuple[bytes, int]:
    """A RESOLVE frame for the working directory ``cwd`` as written and the executable's
    candidates, and how many candidates it carries; see :func:`spawn_request`."""
    listed = _bounded(candidates, max_bytes)
    return _frame(RESOLVE, request, [cwd, str(len(listed)), *listed], max_bytes), len(listed)


def _bounded(candidates: Iterable[str], max_bytes: int) -> list[str]:
    """The candidates, refused once they would exceed ``max_bytes`` (a PATH of many entries and
    a long name must not fill the server's memory)."""
    listed, room = [], max_bytes
    for candidate in candidates:
        room -= len(candidate) + 1
        if room < 0:
            raise ValueError(_TOO_LARGE)
        listed.append(candidate)
    return listed


def _frame(kind: int, request: int, fields: list[str], max_bytes: int) -> bytes:
    payload = b"".join(os.fsencode(field) + b"\0" for field in fields)
    if len(payload) > max_bytes:
        raise ValueError(_TOO_LARGE)
    return HEADER.pack(kind, request, len(payload)) + payload


def run(channel: int, uid: int, gid: int, server: int, *, memory_bytes: int, max_request_bytes: int,
        program: str = PROGRAM) -> int:
    """Prepare this process, then become ``program`` serving ``channel`` as ``uid``/``gid``;
    returns (an exit code) only when that fails.

    ``memory_bytes`` (0: none) becomes the address-space limit of the spawner and so of every
    command it starts.
    """
    try:
        if os.getsid(0) != os.getpid():
            os.setsid()  # a group of its own: the stray sweep spares it, group kills miss it
        make_non_dumpable()
        os.chdir("/")
        # Opened while this process is root: once non-dumpable, its /proc files are root's.
        oom_score_adj = os.open(OOM_SCORE_ADJ, os.O_WRONLY)
        set_oom_score_adj(OOM_HELPER, fd=oom_score_adj)
        forbid_new_privileges()
        die_with_parent(server)  # until the program sets it again, after it has changed its identity
        if memory_bytes:
            limit(resource.RLIMIT_AS, memory_bytes)
        os.set_inheritable(channel, True)
        os.set_inheritable(oom_score_adj, True)
        # Executed as root, it takes its identity itself: an exec after the drop would make the
        # saved uid the command user's (Linux) or the effective uid the shield (gVisor).
        os.execve(program, [program, "--channel-fd", str(channel), "--oom-fd", str(oom_score_adj),
                            "--oom-command", str(OOM_COMMAND), "--oom-helper", str(OOM_HELPER),
                            "--uid", str(uid), "--gid", str(gid), "--shield", str(shielding_uid(uid)),
                            "--server", str(server), "--max-request-bytes", str(max_request_bytes)], {})
    except Exception:
        traceback.print_exc()
    return 1


def main(argv: list[str] | None = None) -> int:
    """``python -I -m protolink_sandboxd.spawner``: a replacement spawner, started by the server."""
    args = helper_arguments("python -m protolink_sandboxd.spawner", argv, "--channel-fd", "--memory-bytes",
                            "--max-request-bytes", text=("--program",))
    return run(args.channel_fd, args.uid, args.gid, args.server, memory_bytes=args.memory_bytes,
               max_request_bytes=args.max_request_bytes, program=args.program)


if __name__ == "__main__":
    sys.exit(main())
