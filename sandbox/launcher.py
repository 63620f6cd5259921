"""The server's side of the spawner (:mod:`sandbox.spawner`): it starts and resolves commands.

The first spawner is forked from the server before gRPC starts its threads (it then costs no
start-up time); a spawner that dies or stops answering is killed and replaced by a fresh
``python -m sandbox.spawner``. Everything the spawner says is checked: it acts as the command
user, so a command could at worst stop it, and then it is replaced.
"""

from __future__ import annotations

import array
import asyncio
import itertools
import json
import logging
import os
import signal
import socket
import sys
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from protolink.execution.groups import signal_group
from protolink.execution.process import ProcessSpec
from protolink.sandbox.errors import SandboxError

from . import spawner
from .spawner import EXITED, FAILED, HEADER, REFUSED, RESOLVE, RESOLVED, SPAWN, STARTED

#: A spawner that leaves a request unanswered this long is replaced.
ANSWER_SECONDS = 10.0
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
        return cls(spec.argv, spec.cwd, spec.env, spec.timeout_seconds, spec.max_output_bytes, resolved_from)


class SpawnerError(SandboxError):
    """The spawner died, stopped answering or broke its protocol; it is being replaced."""


class Launcher:
    """Starts commands as ``uid``/``gid`` and resolves them with that user's permissions."""

    def __init__(self, uid: int, gid: int, *, max_answer_bytes: int, memory_bytes: int = 0) -> None:
        self._uid, self._gid = uid, gid
        self._memory_bytes = memory_bytes
        self._max_answer_bytes = max_answer_bytes
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
                code = spawner.run(theirs, self._uid, self._gid, server, self._memory_bytes)
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

    async def launch(self, spec: ProcessSpec, stdout: int, stderr: int) -> _Command:
        """Start ``spec`` (see :meth:`LocalProcesses.launch`); canceled, it is killed once it starts."""
        return await self._connection().launch(spec, stdout, stderr)

    async def resolve_command(
        self, argv: Sequence[str], cwd: str, env: Mapping[str, str]
    ) -> tuple[tuple[str, ...], str]:
        """argv[0] and the working directory resolved as the command user would find them."""
        request = {"argv": list(argv), "cwd": cwd, "env": dict(env)}
        try:
            return await self._connection().request(RESOLVE, request)
        except SpawnerError:
            # Resolving changes nothing: a fresh spawner is asked once (a command may have
            # killed the last one while it was starting another command).
            return await self._connection().request(RESOLVE, request)

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
            self._current = SpawnerConnection(pid, channel, loop, self._max_answer_bytes)
        return self._current

    def _start(self) -> tuple[int, socket.socket]:
        """A fresh spawner (this process has threads now: it must exec, not just fork)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            theirs.set_inheritable(True)
            argv = [sys.executable, "-I", "-m", "sandbox.spawner", "--uid", str(self._uid), "--gid", str(self._gid),
                    "--channel-fd", str(theirs.fileno()), "--server", str(os.getpid()),
                    "--memory-bytes", str(self._memory_bytes)]
            pid = os.posix_spawn(sys.executable, argv, {"PATH": os.defpath}, setsid=True)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        return pid, ours


class _Command:
    """A command the spawner started: the :class:`~protolink.execution.processes.Leader` the server supervises."""

    def __init__(self, pid: int, loop: asyncio.AbstractEventLoop) -> None:
        self.pid = pid
        self.exited: asyncio.Future[None] = loop.create_future()
        self.exit_code: int | None = None

    def close(self) -> None:
        """Nothing to stop watching: the spawner reports every exit."""

    def ended(self, code: int | None) -> None:
        if not self.exited.done():
            self.exit_code = code
            self.exited.set_result(None)


class SpawnerConnection:
    """One spawner process: its channel, the requests it has not answered, the commands it runs."""

    def __init__(self, pid: int, channel: socket.socket, loop: asyncio.AbstractEventLoop, max_answer_bytes: int) -> None:
        self.pid = pid
        self.alive = True
        self._channel = channel
        self._loop = loop
        self._max_answer_bytes = max_answer_bytes
        self._pending: dict[int, tuple[int, asyncio.Future[Any], asyncio.TimerHandle]] = {}
        self._commands: dict[int, _Command] = {}
        self._received = bytearray()
        self._outbox: deque[tuple[memoryview, list[int]]] = deque()
        self._reaped: asyncio.Future[None] = loop.create_future()
        channel.setblocking(False)
        loop.add_reader(channel, self._readable)

    async def launch(self, spec: ProcessSpec, stdout: int, stderr: int) -> _Command:
        """:meth:`Launcher.launch` through this spawner."""
        request: dict[str, Any] = {"argv": list(spec.argv), "cwd": spec.cwd, "env": dict(spec.env)}
        if isinstance(spec, CommandSpec) and spec.resolved_from is not None:
            request["written"] = list(spec.resolved_from)
        answer = self.request(SPAWN, request, (stdout, stderr))
        try:
            return await answer  # canceled, the request stays pending: a command it starts is then killed
        except SpawnerError as error:
            raise OSError(str(error)) from None  # this command could not start; the next one can

    def request(self, kind: int, payload: dict[str, Any], fds: Sequence[int] = ()) -> asyncio.Future[Any]:
        """Send a request; the future gets its answer, or SpawnerError."""
        request = next(_ids)
        answer: asyncio.Future[Any] = self._loop.create_future()
        overdue = self._loop.call_later(ANSWER_SECONDS, self._lose, f"it left a request unanswered for {ANSWER_SECONDS:g} s")
        self._pending[request] = (kind, answer, overdue)
        self._send(spawner.encode(kind, request, payload), fds)
        return answer

    async def close(self, reason: str) -> None:
        self._lose(reason, log_it=False)
        await self._reaped

    # Writing: a frame goes out at once unless earlier ones are still queued.

    def _send(self, frame: bytes, fds: Sequence[int]) -> None:
        if not self._outbox:
            try:
                sent = self._channel.sendmsg([frame], _rights(fds))
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
                sent = self._channel.sendmsg([data], _rights(fds))
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
            if length > self._max_answer_bytes:
                self._lose(f"it sent an answer of {length} bytes")
                return
            if len(self._received) < HEADER.size + length:
                return
            payload = bytes(self._received[HEADER.size : HEADER.size + length])
            del self._received[: HEADER.size + length]
            try:
                self._answer(kind, request, json.loads(payload))
            except (ValueError, TypeError, KeyError, RecursionError) as error:
                self._lose(f"it sent an invalid answer ({error!r})")

    def _answer(self, kind: int, request: int, payload: dict[str, Any]) -> None:
        if kind == EXITED:
            code = payload["code"]
            if not isinstance(code, int) or isinstance(code, bool):
                raise ValueError("exit code")
            self._commands.pop(request).ended(code)
            return
        asked, answer, overdue = self._pending[request]  # left pending while the answer is checked
        if asked == SPAWN and kind == STARTED:
            outcome: Any = _Command(_positive(payload["pid"]), self._loop)
            self._commands[request] = outcome
        elif asked == SPAWN and kind == FAILED:
            number, message = payload["errno"], _text(payload["message"])
            outcome = OSError(number, message) if isinstance(number, int) and number > 0 else ValueError(message)
        elif asked == RESOLVE and kind == RESOLVED:
            argv, cwd = payload["argv"], _text(payload["cwd"])
            if not argv or not isinstance(argv, list):
                raise ValueError("argv")
            outcome = (tuple(_text(item) for item in argv), cwd)
        elif asked == RESOLVE and kind == REFUSED:
            outcome = ValueError(_text(payload["message"]))
        else:
            raise ValueError(f"answer kind {kind} to request kind {asked}")
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


def _rights(fds: Sequence[int]) -> list[tuple[int, int, bytes]]:
    return [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())] if fds else []


def _fail(answer: asyncio.Future[Any], error: BaseException) -> None:
    if not answer.done():
        answer.set_exception(error)


def _positive(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError("pid")
    return value


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError("expected text")
    return value
