"""The spawner: a helper process that starts commands with the command user's identity.

CPython starts a child with ``vfork`` only when the child keeps its parent's credentials;
a server that changes the uid in each child pays a full ``fork`` (or an extra exec of a
launcher such as setpriv) for every command. So one small single-threaded process takes the
command user's identity once, and the server sends it each command's argv, working directory
and environment with the two ends of the output pipes (``SCM_RIGHTS``). It starts the command
through :func:`protolink.execution.processes.start_process` (the same call the host backend
makes), answers with its pid, reaps it and reports its exit code. The server keeps everything
else: output, caps, timeouts, group kills and strays. The spawner also resolves commands
(:func:`protolink.execution.resolve.resolve_command`) with exactly the permissions commands
will have.

Identity: effective uid and gid the command user's, no supplementary groups, no new
privileges, non-dumpable, and a real and saved uid of its own
(:func:`~sandbox.privileges.shielding_uid`) so that commands cannot signal or ``prlimit`` it.
Only while it starts a command is its real uid the command user's (the child must get it);
changing the real uid alone keeps the process non-dumpable and keeps its parent-death signal.
Unlike a worker (:func:`~sandbox.privileges.drop_to_shielded`) it cannot keep the command uid
out of its effective uid, so commands may renice it (it is at nice 19 already) and set its CPU
affinity: a child that changes uids would need CAP_SETUID and a fork instead of vfork (see
SECURITY.md, "The command spawner acts as the command user").

Wire format, both ways: :data:`HEADER` (kind, request id, payload length), then a JSON payload.
"""

from __future__ import annotations

import array
import errno
import json
import os
import resource
import selectors
import signal
import socket
import struct
import sys
import traceback
from typing import Any

from protolink.execution.processes import start_process
from protolink.execution.resolve import resolve_command

from .privileges import (OOM_COMMAND, OOM_HELPER, OOM_SCORE_ADJ, die_with_parent, drop_to, forbid_new_privileges,
                         helper_arguments, limit, make_non_dumpable, set_oom_score_adj, shielding_uid)

HEADER = struct.Struct("!BQI")
# Requests (server -> spawner). SPAWN carries the stdout and stderr pipe ends, and may carry
# "written": the command as written, resolved again before anything starts.
SPAWN, RESOLVE = 1, 2
# Answers (spawner -> server).
STARTED, FAILED, EXITED, RESOLVED, REFUSED = 11, 12, 13, 14, 15
#: Commands start with this umask, whatever the server's own.
COMMAND_UMASK = 0o022


def encode(kind: int, request: int, payload: dict[str, Any]) -> bytes:
    data = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()
    return HEADER.pack(kind, request, len(data)) + data


class Spawner:
    """The spawner's loop: requests from ``channel``, children reaped on SIGCHLD."""

    def __init__(self, channel: socket.socket, uid: int, oom_score_adj: int) -> None:
        self._channel = channel
        self._uid = uid
        self._shield = shielding_uid(uid)
        self._oom_score_adj = oom_score_adj
        self._cpus = os.sched_getaffinity(0)
        self._children: dict[int, tuple[int, Any]] = {}  # pid -> (request id, Popen)

    def serve(self) -> None:
        """Serve until the server closes the channel."""
        wakeup_read, wakeup_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wakeup_write)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        with selectors.DefaultSelector() as selector:
            selector.register(self._channel, selectors.EVENT_READ)
            selector.register(wakeup_read, selectors.EVENT_READ)
            while True:
                for key, _ in selector.select():
                    if key.fileobj == wakeup_read:
                        _drain(wakeup_read)
                    elif not self._serve_one():
                        return
                self._reap()

    def _serve_one(self) -> bool:
        header, fds = _receive(self._channel, HEADER.size, with_fds=True)
        try:
            if len(header) < HEADER.size:
                return False
            kind, request, length = HEADER.unpack(header)
            payload, _ = _receive(self._channel, length)
            if len(payload) < length:
                return False
            message = json.loads(payload)
            if kind == SPAWN:
                self._spawn(request, message, fds)
            elif kind == RESOLVE:
                self._resolve(request, message)
            return True
        finally:
            for fd in fds:
                os.close(fd)

    def _spawn(self, request: int, message: dict[str, Any], fds: list[int]) -> None:
        if len(fds) != 2:
            self._send(FAILED, request, {"errno": errno.EMFILE, "message": "the output pipes did not arrive"})
            return
        if "written" in message and (change := _resolution_change(message)) is not None:
            self._send(FAILED, request, {"errno": 0, "message": change})
            return
        # The child takes the real uid, OOM preference and CPUs this process has when it starts;
        # commands can signal it only between the two setresuid calls, kept around the start alone.
        set_oom_score_adj(OOM_COMMAND, fd=self._oom_score_adj)
        os.sched_setaffinity(0, self._cpus)  # a command may have pinned this process: its children get every CPU
        try:
            os.setresuid(self._uid, -1, -1)
            try:
                popen = start_process(message["argv"], message["cwd"], message["env"], fds[0], fds[1],
                                      umask=COMMAND_UMASK)
            finally:
                os.setresuid(self._shield, -1, -1)
        except OSError as error:
            self._send(FAILED, request, {"errno": error.errno or 0, "message": error.strerror or str(error)})
            return
        except (ValueError, TypeError) as error:
            self._send(FAILED, request, {"errno": 0, "message": str(error)})
            return
        finally:
            set_oom_score_adj(OOM_HELPER, fd=self._oom_score_adj)
        self._children[popen.pid] = (request, popen)
        self._send(STARTED, request, {"pid": popen.pid})

    def _resolve(self, request: int, message: dict[str, Any]) -> None:
        try:
            argv, cwd = resolve_command(message["argv"], message["cwd"], message["env"])
        except ValueError as error:
            self._send(REFUSED, request, {"message": str(error)})
        else:
            self._send(RESOLVED, request, {"argv": argv, "cwd": cwd})

    def _reap(self) -> None:
        while self._children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            request, popen = self._children.pop(pid, (None, None))
            if popen is not None:
                popen.returncode = os.waitstatus_to_exitcode(status)  # Popen must not wait for it again
                self._send(EXITED, request, {"code": popen.returncode})

    def _send(self, kind: int, request: int, payload: dict[str, Any]) -> None:
        self._channel.sendall(encode(kind, request, payload))


def _resolution_change(message: dict[str, Any]) -> str | None:
    """Why the command as written no longer resolves to the argv[0] and cwd it was approved
    with (``message["written"]``), or None when it still does."""
    executable, cwd = message["written"]
    try:
        (resolved, *_), directory = resolve_command([executable], cwd, message["env"])
    except ValueError as error:
        return str(error)
    if (resolved, directory) == (message["argv"][0], message["cwd"]):
        return None
    return (f"{executable!r} in {cwd!r} now resolves to {resolved!r} in {directory!r}, not to the "
            f"{message['argv'][0]!r} in {message['cwd']!r} resolved before approval; nothing was started")


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def _receive(channel: socket.socket, size: int, *, with_fds: bool = False) -> tuple[bytes, list[int]]:
    """``size`` bytes (fewer at end of stream) and, with ``with_fds``, the descriptors sent with them."""
    data, fds = bytearray(), array.array("i")
    while len(data) < size:
        if with_fds:
            chunk, ancillary, _, _ = channel.recvmsg(size - len(data), socket.CMSG_SPACE(2 * fds.itemsize),
                                                     socket.MSG_CMSG_CLOEXEC)
            for level, kind, item in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds.frombytes(item[: len(item) - len(item) % fds.itemsize])
        else:
            chunk = channel.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return bytes(data), list(fds)


def run(channel: socket.socket, uid: int, gid: int, server: int, memory_bytes: int = 0) -> int:
    """Take the command user's identity, then serve ``channel``; the process's exit code.

    ``memory_bytes`` (0: none) becomes the address-space limit of the spawner and so of every
    command it starts.
    """
    try:
        if os.getsid(0) != os.getpid():
            os.setsid()  # a group of its own: the stray sweep spares it, group kills miss it
        make_non_dumpable()
        os.chdir("/")
        # Opened while this process is root: once non-dumpable, its /proc files are root's.
        oom_score_adj = os.open(OOM_SCORE_ADJ, os.O_WRONLY | os.O_CLOEXEC)
        set_oom_score_adj(OOM_HELPER, fd=oom_score_adj)
        drop_to(uid, gid, real_uid=shielding_uid(uid))
        forbid_new_privileges()
        die_with_parent(server)  # after the drop, which clears the parent-death signal
        # Commands inherit the lowest priority and cannot raise it (RLIMIT_NICE is 0): however
        # many of them spin, the server and its workers still get the CPU they need.
        os.setpriority(os.PRIO_PROCESS, 0, 19)
        if memory_bytes:
            limit(resource.RLIMIT_AS, memory_bytes)
        Spawner(channel, uid, oom_score_adj).serve()
        return 0
    except Exception:
        traceback.print_exc()
        return 1


def main(argv: list[str] | None = None) -> int:
    """``python -I -m sandbox.spawner``: a replacement spawner, started by the server."""
    args = helper_arguments("python -m sandbox.spawner", argv, "--channel-fd", "--memory-bytes")
    return run(socket.socket(fileno=args.channel_fd), args.uid, args.gid, args.server, args.memory_bytes)


if __name__ == "__main__":
    sys.exit(main())
