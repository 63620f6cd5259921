"""The server's side of the spawner (:mod:`protolink_sandboxd.spawner`): it starts and resolves commands.

The first spawner is forked from the server before gRPC starts its threads (it then costs no
start-up time); a spawner that dies or stops answering is killed and replaced by a fresh
``python -m protolink_sandboxd.spawner``. Everything the spawner says is checked: it acts as the command
user, so a command could at worst stop it, and then it is replaced.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import os
import signal
import socket
import sys
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from protolink.errors import SandboxError
from protolink.execution.groups import TERMINATE_GRACE_SECONDS, signal_group
from protolink.execution.process_types import ProcessSpec
from protolink.execution.resolve import (
    Resolved,
    check_command,
    executable_candidates,
    missing_directory,
    missing_executable,
)
from protolink.net.descriptors import rights

from . import spawner
from .spawner import (
    CHANGED,
    EXIT,
    EXITED,
    FAILED,
    HEADER,
    NUMBER,
    PIDS,
    PROGRAM,
    REFUSED,
    RESOLVED,
    STARTED,
    WARM,
)

#: A spawner that leaves a request unanswered this long is replaced.
ANSWER_SECONDS = 10.0
#: The largest answer a spawner may send (a number, or an errno and its message).
MAX_ANSWER_BYTES = 4096
#: How often a killed spawner is checked for its exit until it is reaped.
REAP_POLL_SECONDS = 0.01

log = logging.getLogger("sandbox")
_ids = itertools.count(1)


@dataclass(frozen=True)
class CommandSpec(ProcessSpec):
    """A ProcessSpec that may carry the command as written (argv[0], cwd) it was resolved from
    on the client: the spawner resolves that again and starts nothing else."""

    resolved_from: tuple[str, str] | None = None

    @classmethod
    def of(cls, spec: ProcessSpec, resolved_from: tuple[str, str] | None) -> CommandSpec:
        return cls(spec.argv, spec.cwd, spec.env, spec.timeout_seconds, spec.max_output_bytes, spec.real_executable,
                   resolved_from)


class SpawnerError(SandboxError):
    """The spawner died, stopped answering or broke its protocol; it is being replaced."""


class ResolutionChanged(Exception):
    """The command as written no longer names the approved directory and executable, or argv[0]
    no longer resolves to the approved file; nothing started."""


class SpawnerClient:
    """Starts commands as ``uid``/``gid`` through the spawner ``program``, and resolves them
    with that user's permissions."""

    def __init__(self, uid: int, gid: int, *, max_request_bytes: int, memory_bytes: int = 0,
                 program: str = PROGRAM) -> None:
        self._uid, self._gid = uid, gid
        self._memory_bytes = memory_bytes
        self._max_request_bytes = max_request_bytes
        self._program = program
        self._forked: tuple[int, socket.socket] | None = None
        self._current: SpawnerConnection | None = None
        self._closed = False

    def fork(self) -> None:
        """Fork the first spawner now; call this while the server has a single thread."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        server = os.getpid()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child never returns
            code = 1
            try:
                ours.close()
                code = spawner.run(theirs.fileno(), self._uid, self._gid, server, memory_bytes=self._memory_bytes,
                                   max_request_bytes=self._max_request_bytes, program=self._program)
            finally:
                os._exit(code)
        theirs.close()
        self._forked = (pid, ours)

    def start(self) -> None:
        """Watch the forked spawner (or start one) from the running event loop."""
        self._connection()

    @property
    def pid(self) -> int | None:
        """The running spawner's pid (its children lead the groups of running commands)."""
        return self._current.pid if self._current is not None and self._current.alive else None

    def keepers(self) -> set[int]:
        """The keepers of the commands the running spawner runs that have not ended for the server."""
        return self._current.keepers() if self._current is not None and self._current.alive else set()

    @property
    def waiting_keeper(self) -> int | None:
        """The keeper the running spawner forked ahead for the next command, as far as the server
        knows (None: none, or one a start may have taken)."""
        return self._current.waiting_keeper if self._current is not None and self._current.alive else None

    async def launch(self, spec: ProcessSpec, stdout: int, stderr: int, stdin: int | None = None) -> _Command:
        """Start ``spec`` (see :meth:`Launcher.launch`); canceled, it is killed once it starts."""
        return await self._connection().launch(spec, stdout, stderr, stdin)

    async def resolve_command(self, argv: Sequence[str], cwd: str, env: Mapping[str, str]) -> Resolved:
        """argv[0], the file it runs and the working directory resolved as the command user
        would find them, by the rules of :func:`protolink.execution.resolve.resolve_command`."""
        check_command(argv, cwd, env)

        def ask() -> Awaitable[tuple[str | None, int, str]]:
            # Relative candidates stay relative: the spawner takes them in the directory it finds.
            return self._connection().resolve(cwd, executable_candidates(argv[0], cwd=".", env=env))

        try:
            directory, index, real = await ask()
        except SpawnerError:
            # Resolving changes nothing: a fresh spawner is asked once (it may have died
            # meanwhile for another reason).
            directory, index, real = await ask()
        if directory is None:
            raise missing_directory(cwd)
        candidates = executable_candidates(argv[0], cwd=directory, env=env)
        if index < 0:
            raise missing_executable(argv[0], cwd=directory, env=env)
        return Resolved((next(itertools.islice(candidates, index, None)), *argv[1:]), directory, real)

    async def aclose(self) -> None:
        """Stop the spawner (commands it started are the stray sweep's to kill)."""
        self._closed = True
        if self._current is not None:
            await self._current.close("the server is stopping")

    def _connection(self) -> SpawnerConnection:
        if self._closed:
            raise SpawnerError("the server is stopping")
        if self._current is None or not self._current.alive:
            loop = asyncio.get_running_loop()
            pid, channel = self._forked if self._forked is not None else self._start()
            self._forked = None
            self._current = SpawnerConnection(pid, channel, loop, self._max_request_bytes)
        return self._current

    def _start(self) -> tuple[int, socket.socket]:
        """A fresh spawner (this process has threads now: it must exec, not just fork)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            theirs.set_inheritable(True)
            argv = [sys.executable, "-I", "-m", "protolink_sandboxd.spawner", "--uid", str(self._uid), "--gid", str(self._gid),
                    "--channel-fd", str(theirs.fileno()), "--server", str(os.getpid()),
                    "--memory-bytes", str(self._memory_bytes), "--max-request-bytes", str(self._max_request_bytes),
                    "--program", self._program]
            pid = os.posix_spawn(sys.executable, argv, {"PATH": os.defpath}, setsid=True)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        return pid, ours


class _Command:
    """A command the spawner started: the :class:`~protolink.execution.processes.Leader` the server supervises."""

    def __init__(self, pid: int, keeper: int, loop: asyncio.AbstractEventLoop) -> None:
        self.pid = pid
        self.keeper = keeper
        self.exited: asyncio.Future[None] = loop.create_future()
        self.exit_code: int | None = None
        #: See :attr:`~protolink.execution.local_processes.Leader.killed_at_deadline`.
        self.killed_at_deadline = False
        self.closed = False

    def close(self) -> None:
        """The command has ended for the server. A keeper that has not reported its exit yet (a
        fork bomb may starve it) is killed, so that what the command left drops out from under
        the spawner and the stray sweep takes it. Its pid is not free for reuse until the
        spawner has reaped it and reported the exit."""
        self.closed = True
        if not self.exited.done():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.keeper, signal.SIGKILL)

    def ended(self, code: int | None, *, killed_at_deadline: bool = False) -> None:
        if not self.exited.done():
            self.exit_code = code
            self.killed_at_deadline = killed_at_deadline
            self.exited.set_result(None)


class SpawnerConnection:
    """One spawner process: its channel, the requests it has not answered, the commands it runs."""

    def __init__(self, pid: int, channel: socket.socket, loop: asyncio.AbstractEventLoop,
                 max_request_bytes: int) -> None:
        self.pid = pid
        self.alive = True
        self._channel = channel
        self._loop = loop
        self._max_request_bytes = max_request_bytes
        self._pending: dict[int, tuple[Callable[[int, int, bytes], Any], asyncio.Future[Any], asyncio.TimerHandle]] = {}
        self._commands: dict[int, _Command] = {}
        #: See :attr:`SpawnerClient.waiting_keeper`.
        self.waiting_keeper: int | None = None
        self._received = bytearray()
        self._outbox: deque[tuple[memoryview, list[int]]] = deque()
        self._reaped: asyncio.Future[None] = loop.create_future()
        channel.setblocking(False)
        loop.add_reader(channel, self._readable)

    def keepers(self) -> set[int]:
        """See :meth:`SpawnerClient.keepers`."""
        return {command.keeper for command in self._commands.values() if not command.closed}

    async def launch(self, spec: ProcessSpec, stdout: int, stderr: int, stdin: int | None = None) -> _Command:
        """:meth:`SpawnerClient.launch` through this spawner: OSError when the command cannot start,
        ValueError when it cannot be passed, ResolutionChanged when its check fails."""
        check_command(spec.argv, spec.cwd, spec.env)
        check = None
        if isinstance(spec, CommandSpec) and spec.resolved_from is not None:
            executable, written_cwd = spec.resolved_from
            check = (written_cwd, executable_candidates(executable, cwd=spec.cwd, env=spec.env))
        request = next(_ids)
        # The keeper kills the group when the server would have killed it at the latest: after
        # the deadline and the grace its SIGTERM gives.
        frame = spawner.spawn_request(request, spec.argv, spec.cwd, spec.env, check, max_bytes=self._max_request_bytes,
                                      real_executable=spec.real_executable,
                                      kill_after_seconds=spec.timeout_seconds + TERMINATE_GRACE_SECONDS)
        fds = (stdout, stderr) if stdin is None else (stdout, stderr, stdin)
        answer = self._ask(request, frame, fds, self._started)
        try:
            command: _Command = await answer
            return command  # canceled, the request stays pending: a command it starts is then killed
        except SpawnerError as error:
            raise OSError(str(error)) from None  # this command could not start; the next one can
        except asyncio.CancelledError:
            if answer.done() and not answer.cancelled() and answer.exception() is None:
                started = answer.result()  # it started as the launch was canceled: nobody watches it
                signal_group(started.pid, signal.SIGKILL)
                started.close()
            raise

    async def resolve(self, cwd: str, candidates: Iterable[str]) -> tuple[str | None, int, str]:
        """The real path of the directory ``cwd`` names (None: none), the index of the first
        executable file among ``candidates`` (relative ones taken there; -1: none) and that
        file's real path ("" when none)."""
        request = next(_ids)
        frame, count = spawner.resolve_request(request, cwd, candidates, max_bytes=self._max_request_bytes)
        found: tuple[str | None, int, str] = await self._ask(request, frame, (), functools.partial(_resolution, count))
        return found

    def _ask(self, request: int, frame: bytes, fds: Sequence[int],
             read: Callable[[int, int, bytes], Any]) -> asyncio.Future[Any]:
        """Send ``frame``; its answer goes through ``read`` (kind, request, payload) into the future."""
        answer: asyncio.Future[Any] = self._loop.create_future()
        overdue = self._loop.call_later(ANSWER_SECONDS, self._lose, f"it left a request unanswered for {ANSWER_SECONDS:g} s")
        self._pending[request] = (read, answer, overdue)
        self._send(frame, fds)
        return answer

    async def close(self, reason: str) -> None:
        self._lose(reason, log_it=False)
        await self._reaped

    # Writing: a frame goes out at once unless earlier ones are still queued.

    def _send(self, frame: bytes, fds: Sequence[int]) -> None:
        if not self._outbox:
            try:
                sent = self._channel.sendmsg([frame], rights(fds))
            except BlockingIOError:
                sent = 0
            except OSError as error:
                self._lose(f"its channel failed: {error}")
                return
            if sent == len(frame):
                return
            if sent:
                frame, fds = frame[sent:], ()
        # Queued: the caller may close its descriptors before they go out.
        self._outbox.append((memoryview(frame), [os.dup(fd) for fd in fds]))
        if len(self._outbox) == 1:
            self._loop.add_writer(self._channel, self._writable)

    def _writable(self) -> None:
        while self._outbox:
            data, fds = self._outbox[0]
            try:
                sent = self._channel.sendmsg([data], rights(fds))
            except BlockingIOError:
                return
            except OSError as error:
                self._lose(f"its channel failed: {error}")
                return
            for fd in fds:
                os.close(fd)
            if sent < len(data):
                self._outbox[0] = (data[sent:], [])
                return
            self._outbox.popleft()
        self._loop.remove_writer(self._channel)

    # Reading and checking answers.

    def _readable(self) -> None:
        try:
            data = self._channel.recv(1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._lose("it exited")
            return
        self._received += data
        while len(self._received) >= HEADER.size and self.alive:
            kind, request, length = HEADER.unpack_from(self._received)
            if length > MAX_ANSWER_BYTES:
                self._lose(f"it sent an answer of {length} bytes")
                return
            if len(self._received) < HEADER.size + length:
                return
            payload = bytes(self._received[HEADER.size : HEADER.size + length])
            del self._received[: HEADER.size + length]
            try:
                self._answer(kind, request, payload)
            except (ValueError, KeyError) as error:
                self._lose(f"it sent an invalid answer ({error!r})")

    def _answer(self, kind: int, request: int, payload: bytes) -> None:
        if kind == EXITED:
            if len(payload) != EXIT.size:
                raise ValueError(f"an exit of {len(payload)} bytes")
            code, killed = EXIT.unpack(payload)
            if killed not in (0, 1):
                raise ValueError(f"a kill of {killed}")
            self._commands.pop(request).ended(code, killed_at_deadline=bool(killed))
            return
        if kind == WARM and request == 0:
            self.waiting_keeper = _positive(keeper) if (keeper := _number(payload)) else None
            return
        read, answer, overdue = self._pending[request]  # left pending while the answer is checked
        outcome = read(kind, request, payload)
        del self._pending[request]
        overdue.cancel()
        if answer.done():  # canceled while it was starting
            if isinstance(outcome, _Command):
                signal_group(outcome.pid, signal.SIGKILL)  # its EXITED still comes and is taken
            return
        if isinstance(outcome, Exception):
            answer.set_exception(outcome)
        else:
            answer.set_result(outcome)

    def _started(self, kind: int, request: int, payload: bytes) -> _Command | Exception:
        """A SPAWN's answer: the started command, or why nothing started. Any of them may have
        taken the keeper that waited."""
        self.waiting_keeper = None
        if kind == STARTED:
            if len(payload) != PIDS.size:
                raise ValueError(f"pids of {len(payload)} bytes")
            pid, keeper = PIDS.unpack(payload)
            command = _Command(_positive(pid), _positive(keeper), self._loop)
            self._commands[request] = command
            return command
        if kind == FAILED:
            number, message = _number(payload[: NUMBER.size]), payload[NUMBER.size :].decode("utf-8", "replace")
            return OSError(number, message) if number > 0 else ValueError(message)
        if kind == CHANGED and not payload:
            return ResolutionChanged()
        raise ValueError(f"answer kind {kind} with {len(payload)} bytes to a SPAWN")

    def _lose(self, reason: str, *, log_it: bool = True) -> None:
        """Give this spawner up: kill it, fail what waits on it, end what it ran."""
        if not self.alive:
            return
        self.alive = False
        if log_it:
            log.warning("the spawner (pid %d) is replaced: %s", self.pid, reason)
        self._loop.remove_reader(self._channel)
        self._loop.remove_writer(self._channel)
        self._channel.close()
        for _, fds in self._outbox:
            for fd in fds:
                os.close(fd)
        self._outbox.clear()
        for _, answer, overdue in self._pending.values():
            overdue.cancel()
            _fail(answer, SpawnerError(f"the command spawner stopped: {reason}"))
        self._pending.clear()
        for command in self._commands.values():
            command.ended(None)  # still running, it is now a stray: the sweep kills it
        self._commands.clear()
        self._reap()

    def _reap(self) -> None:
        """Kill the spawner and reap it, polled: it dies at once, and gVisor has no pidfds."""
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            reaped, _ = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            reaped = self.pid
        if reaped:
            self._reaped.set_result(None)
        else:
            self._loop.call_later(REAP_POLL_SECONDS, self._reap)


def _fail(answer: asyncio.Future[Any], error: BaseException) -> None:
    if not answer.done():
        answer.set_exception(error)


def _resolution(count: int, kind: int, request: int, payload: bytes) -> tuple[str | None, int, str]:
    """A RESOLVE's answer about ``count`` candidates: (directory or None, index or -1, the
    candidate's real path or "")."""
    if kind == REFUSED and not payload:
        return None, -1, ""
    if kind != RESOLVED:
        raise ValueError(f"answer kind {kind} with {len(payload)} bytes to a RESOLVE")
    index = _number(payload[: NUMBER.size])
    directory, separator, real = (os.fsdecode(part) for part in payload[NUMBER.size :].partition(b"\0"))
    if not -1 <= index < count or not directory.startswith("/") or not separator or "\0" in real:
        raise ValueError(f"resolution {index} of {count} in {directory!r}")
    if (index >= 0) != real.startswith("/") or (index < 0 and real):
        raise ValueError(f"resolution {index} of {count} to {real!r}")
    return directory, index, real


def _number(payload: bytes) -> int:
    if len(payload) != NUMBER.size:
        raise ValueError(f"a number of {len(payload)} bytes")
    value: int = NUMBER.unpack(payload)[0]
    return value


def _positive(value: int) -> int:
    if value <= 0:
        raise ValueError("pid")
    return value
