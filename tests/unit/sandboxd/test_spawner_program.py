"""The compiled spawner (sandbox/spawner.c), started the way the server starts it: a command
starts as the host's start_process would start it, as the command user; resolution answers
follow the candidates the server sends; a broken frame ends the spawner with a reason, never a
crash or a hang."""

from __future__ import annotations

import array
import os
import platform
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from protolink_sandboxd import spawner

from tests.sandbox_server import spawner_program, unused_uid

pytestmark = pytest.mark.root

MAX_REQUEST_BYTES = 1 << 16
ENV = {"PATH": "/usr/bin:/bin", "ONLY": "this"}
#: rt_sigaction's system call number here: the C library's own wrappers refuse signal 32.
RT_SIGACTION = {"x86_64": 13, "aarch64": 134}[platform.machine()]
#: ``python -m protolink_sandboxd.spawner`` with signal 32 ignored, as whatever starts a server may leave it
#: (a CI run did): commands must not inherit it. Python itself ignores SIGPIPE.
IGNORING_32 = f"""
import ctypes, os, sys
ignore = (ctypes.c_ulong * 4)(1, 0, 0, 0)  # SIG_IGN, no flags, an empty mask
if ctypes.CDLL(None, use_errno=True).syscall({RT_SIGACTION}, 32, ignore, None, 8) != 0:
    raise OSError(ctypes.get_errno(), "rt_sigaction")
os.execv(sys.executable, [sys.executable, "-I", "-m", "protolink_sandboxd.spawner", *sys.argv[1:]])
"""


class Spawner:
    """A spawner process serving this test over a socket pair."""

    def __init__(self) -> None:
        self.uid = unused_uid()
        ours, theirs = socket.socketpair()
        self.channel = ours
        self.channel.settimeout(30)
        self.process = subprocess.Popen(
            [sys.executable, "-I", "-c", IGNORING_32, "--uid", str(self.uid), "--gid", str(self.uid),
             "--server", str(os.getpid()), "--channel-fd", str(theirs.fileno()), "--memory-bytes", "0",
             "--max-request-bytes", str(MAX_REQUEST_BYTES), "--program", spawner_program()],
            pass_fds=(theirs.fileno(),), stderr=subprocess.PIPE, cwd="/", env={})
        theirs.close()
        self._next = 1
        #: The pids of the keepers the spawner reported forked ahead (0: the last one died unused).
        self.warm: list[int] = []

    def send(self, kind: int, payload: bytes, fds: tuple[int, ...] = ()) -> int:
        request, self._next = self._next, self._next + 1
        frame = spawner.HEADER.pack(kind, request, len(payload)) + payload
        rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())] if fds else []
        self.channel.sendmsg([frame], rights)
        return request

    def answer(self) -> tuple[int, int, bytes]:
        """The next answer, past the reports of keepers forked ahead (in :attr:`warm`)."""
        while True:
            kind, request, length = spawner.HEADER.unpack(self._exactly(spawner.HEADER.size))
            payload = self._exactly(length)
            if kind != spawner.WARM:
                return kind, request, payload
            self.warm.append(spawner.NUMBER.unpack(payload)[0])

    def run(self, argv: list[str], cwd: str = "/", env: dict[str, str] = ENV,
            check: tuple[str, list[str]] | None = None, real: str | None = None,
            stdin: int | None = None) -> tuple[int, int | str, bytes]:
        """Start ``argv`` (its stdin on ``stdin`` when given); (kind of the first answer, exit
        code or failure, its output)."""
        kind, code, output, _ = self.run_to_end(argv, cwd, env, check, real, stdin)
        return kind, code, output

    def run_to_end(self, argv: list[str], cwd: str = "/", env: dict[str, str] = ENV,
                   check: tuple[str, list[str]] | None = None, real: str | None = None,
                   stdin: int | None = None, kill_after: float | None = None) -> tuple[int, int | str, bytes, int]:
        """:meth:`run` with the keeper's kill-after time, and whether the keeper reported that it
        killed the command (0 or 1)."""
        read, write = os.pipe()
        try:
            frame = spawner.spawn_request(0, argv, cwd, env, check, max_bytes=MAX_REQUEST_BYTES, real_executable=real,
                                          kill_after_seconds=kill_after)
            fds = (write, write) if stdin is None else (write, write, stdin)
            self.send(spawner.SPAWN, frame[spawner.HEADER.size :], fds)
        finally:
            os.close(write)
        with os.fdopen(read, "rb") as output:
            kind, _, payload = self.answer()
            if kind != spawner.STARTED:
                return kind, payload[spawner.NUMBER.size :].decode(), b"", 0
            text = output.read()
        exited, _, ended = self.answer()
        assert exited == spawner.EXITED
        code, killed = spawner.EXIT.unpack(ended)
        return kind, code, text, killed

    def next_warm(self) -> int:
        """The pid of the next keeper the spawner reports forked ahead (the next frame)."""
        kind, _, length = spawner.HEADER.unpack(self._exactly(spawner.HEADER.size))
        assert kind == spawner.WARM, kind
        pid: int = spawner.NUMBER.unpack(self._exactly(length))[0]
        return pid

    def resolve(self, cwd: str, candidates: list[str]) -> tuple[int, bytes]:
        frame, _ = spawner.resolve_request(0, cwd, candidates, max_bytes=MAX_REQUEST_BYTES)
        self.send(spawner.RESOLVE, frame[spawner.HEADER.size :])
        kind, _, payload = self.answer()
        return kind, payload

    def ended(self) -> tuple[int, str]:
        """The exit status and stderr of a spawner that should stop by itself."""
        _, errors = self.process.communicate(timeout=30)
        return self.process.returncode, errors.decode()

    def _exactly(self, size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = self.channel.recv(size - len(data))
            assert chunk, "the spawner closed the channel"
            data += chunk
        return data


@pytest.fixture
def started() -> Iterator[Spawner]:
    serving = Spawner()
    yield serving
    serving.channel.close()
    if serving.process.poll() is None:
        try:
            serving.process.communicate(timeout=30)
        finally:
            serving.process.kill()
            serving.process.wait()


@pytest.fixture
def place() -> Iterator[Path]:
    """A directory the command user may enter (pytest's own are private to root)."""
    path = Path(tempfile.mkdtemp(prefix="protolink-spawner-test-")).resolve()
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_the_wire_constants_match_the_c_source():
    source = (Path(spawner.__file__).parents[1] / "spawner.c").read_text()
    enum = dict(re.findall(r"\b([A-Z]+) = (\d+)", source.split("enum {", 1)[1].split("};", 1)[0]))
    python = {name: getattr(spawner, name) for name in enum}
    assert {name: int(value) for name, value in enum.items()} == python
    assert re.search(r"HEADER_SIZE = (\d+)", source).group(1) == str(spawner.HEADER.size)


def test_a_command_starts_like_a_host_command_as_the_command_user(started, place):
    script = ("id -u; id -G; umask; cut -d' ' -f6 /proc/$$/stat; echo $$; readlink /proc/self/fd/0; "
              "ls /proc/self/fd | tr '\\n' ' '; echo; grep -E '^Sig(Blk|Ign)' /proc/self/status; pwd")
    kind, code, output = started.run(["/bin/sh", "-c", script], str(place))
    uid, groups, umask, sid, pid, stdin, fds, blocked, ignored, cwd, _ = output.decode().split("\n")
    assert (kind, code) == (spawner.STARTED, 0)
    assert (uid, groups, umask) == (str(started.uid), str(started.uid), "0022")
    assert sid == pid  # the leader of a new session
    assert stdin == "/dev/null"
    assert fds.split() == ["0", "1", "2", "3"]  # 3: ls's own directory
    assert blocked.split()[1] == ignored.split()[1] == "0" * 16
    assert cwd == str(place)
    kind, code, output = started.run(["/usr/bin/env"])
    assert sorted(output.decode().splitlines()) == ["ONLY=this", "PATH=/usr/bin:/bin"]


def test_a_third_descriptor_passed_is_the_commands_stdin(started):
    read, write = os.pipe()
    os.write(write, bytes(range(256)))
    os.close(write)
    try:
        kind, code, output = started.run(["/bin/sh", "-c", "cat; ls /proc/self/fd | tr '\\n' ' '"], stdin=read)
    finally:
        os.close(read)
    assert (kind, code, output) == (spawner.STARTED, 0, bytes(range(256)) + b"0 1 2 3 ")  # 3: ls's own directory


def test_exit_codes_and_signals_are_reported(started):
    assert started.run(["/bin/sh", "-c", "exit 3"])[:2] == (spawner.STARTED, 3)
    assert started.run(["/bin/sh", "-c", "kill -TERM $$"])[:2] == (spawner.STARTED, -signal.SIGTERM)


def test_the_keeper_kills_the_commands_group_at_its_kill_after_time(started):
    """The server's timers can starve (gVisor): the keeper kills the whole group itself, SIGTERM
    ignored or not, and says so; a command that ends first is reported as it ended."""
    script = "trap '' TERM; sleep 60 & echo $!; sleep 60"
    kind, code, output, killed = started.run_to_end(["/bin/sh", "-c", script], kill_after=0.3)
    assert (kind, code, killed) == (spawner.STARTED, -signal.SIGKILL, 1)
    assert _ends_within(int(output), seconds=10)  # SIGKILLed: it ends as soon as it is scheduled
    assert started.run_to_end(["/bin/sh", "-c", "exit 4"], kill_after=30)[1:] == (4, b"", 0)
    assert started.run_to_end(["/bin/sh", "-c", "kill -KILL $$"], kill_after=30)[1:] == (-signal.SIGKILL, b"", 0)


def test_a_commands_orphans_stay_below_the_spawner_until_the_command_exits(started, place):
    """Each command's parent is its keeper, a child subreaper below the spawner holding nothing
    of the spawner's: what the command orphans is reparented to the keeper while the command
    runs, and the keeper exits with the command."""
    go = place / "go"
    script = f"(setsid sleep 30 >/dev/null 2>&1 & echo $!); echo $PPID; while [ ! -e {go} ]; do sleep 0.01; done"
    read, write = os.pipe()
    frame = spawner.spawn_request(0, ["/bin/sh", "-c", script], "/", ENV, None, max_bytes=MAX_REQUEST_BYTES)
    started.send(spawner.SPAWN, frame[spawner.HEADER.size :], (write, write))
    os.close(write)
    with os.fdopen(read, "rb") as output:
        kind, _, payload = started.answer()
        orphan, keeper = int(output.readline()), int(output.readline())
        try:
            assert (kind, spawner.PIDS.unpack(payload)[1]) == (spawner.STARTED, keeper)
            assert _parent(orphan) == keeper and _parent(keeper) == started.process.pid
            assert _status(keeper, "NoNewPrivs") == "1"
            held = _descriptors(keeper)
            spawners = set(_descriptors(started.process.pid))
            # 0-2 and its end of the link to the spawner: none of the spawner's (its channel)
            assert len(held) == 4 and [link for link in held[3:] if link.startswith("socket:")] == held[3:], held
            assert not spawners & set(held[3:]), (held, spawners)
            go.touch()
            output.read()
            kind, _, code = started.answer()
            assert (kind, spawner.EXIT.unpack(code)) == (spawner.EXITED, (0, 0))
            assert not os.path.exists(f"/proc/{keeper}")
            assert _parent(orphan) not in (keeper, started.process.pid)  # out from under the spawner
        finally:
            go.touch()  # a failed check above leaves no command waiting for it
            os.kill(orphan, signal.SIGKILL)


def _descriptors(pid: int) -> list[str]:
    """What the descriptors of ``pid`` lead to, in the order of their numbers."""
    return [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in sorted(os.listdir(f"/proc/{pid}/fd"), key=int)]


def _parent(pid: int) -> int:
    return int(_status(pid, "PPid"))


def _ends_within(pid: int, seconds: float) -> bool:
    """Whether the process is gone or ends (is a zombie) within the time: a bound on a hang, not
    a measure of speed."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([pidfd], [], [], seconds)[0])
    finally:
        os.close(pidfd)


def _status(pid: int, field: str) -> str:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return next(line.split(":", 1)[1].strip() for line in lines if line.startswith(f"{field}:"))


def test_a_command_that_cannot_start_fails_with_its_errno(started, place):
    kind, message, _ = started.run(["/no/such/program"])
    assert (kind, message) == (spawner.FAILED, os.strerror(2))
    kind, message, _ = started.run(["/bin/true"], str(place / "missing"))
    assert (kind, message) == (spawner.FAILED, f"its working directory: {os.strerror(2)}")
    private = place / "private"
    private.mkdir(mode=0o700)
    tool = private / "tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    kind, message, _ = started.run([str(tool)])
    assert (kind, message) == (spawner.FAILED, os.strerror(13))  # the command user cannot reach it
    assert started.run(["/bin/true"])[:2] == (spawner.STARTED, 0)  # it serves on


def test_resolution_takes_the_first_executable_candidate_with_the_command_users_permissions(started, place):
    (place / "bin").mkdir()
    plain, runnable, hidden = place / "bin" / "plain", place / "bin" / "tool", place / "hidden"
    plain.write_text("")
    runnable.write_text("#!/bin/sh\n")
    runnable.chmod(0o755)
    hidden.mkdir(mode=0o700)
    (hidden / "tool").write_text("#!/bin/sh\n")
    (hidden / "tool").chmod(0o755)
    (place / "link").symlink_to(place / "bin")
    candidates = [str(hidden / "tool"), str(plain), str(place / "bin"), "./tool", str(runnable)]
    kind, payload = started.resolve(str(place / "link"), candidates)
    assert kind == spawner.RESOLVED
    assert (spawner.NUMBER.unpack_from(payload)[0], payload[4:].decode()) == (3, f"{place / 'bin'}\0{runnable}")
    (place / "bin" / "alias").symlink_to(runnable)
    kind, payload = started.resolve(str(place), ["bin/alias"])
    assert (spawner.NUMBER.unpack_from(payload)[0], payload[4:].decode()) == (0, f"{place}\0{runnable}")
    kind, payload = started.resolve(str(place), [str(plain)])
    assert (kind, spawner.NUMBER.unpack_from(payload)[0], payload[4:].decode()) == (spawner.RESOLVED, -1, f"{place}\0")
    assert started.resolve(str(place / "missing"), ["/bin/true"]) == (spawner.REFUSED, b"")
    assert started.resolve(str(plain), ["/bin/true"]) == (spawner.REFUSED, b"")


def test_a_stale_resolution_starts_nothing(started, place):
    (place / "out").mkdir(mode=0o777)
    (place / "out").chmod(0o777)  # the command user writes the marker
    marker = place / "out" / "ran"
    early, late = place / "early", place / "late"
    for directory in (early, late):
        directory.mkdir()
        (directory / "tool").write_text(f"#!/bin/sh\necho {directory.name} > {marker}\n")
        (directory / "tool").chmod(0o755)
    candidates = [str(early / "tool"), str(late / "tool")]
    kind, _, _ = started.run([str(late / "tool")], str(place), check=(str(place), candidates))
    assert kind == spawner.CHANGED and not marker.exists()
    kind, _, _ = started.run([str(late / "tool")], str(place), check=(str(place / "early"), candidates))
    assert kind == spawner.CHANGED and not marker.exists()
    (early / "tool").chmod(0o644)
    assert started.run([str(late / "tool")], str(place), check=(str(place), candidates))[:2] == (spawner.STARTED, 0)
    assert marker.read_text() == "late\n"


def test_a_link_that_moved_since_its_resolution_starts_nothing(started, place):
    (place / "out").mkdir(mode=0o777)
    (place / "out").chmod(0o777)  # the command user writes the marker
    marker = place / "out" / "ran"
    for name in ("approved", "other"):
        (place / name).write_text(f"#!/bin/sh\necho {name} > {marker}\n")
        (place / name).chmod(0o755)
    link = place / "python"
    link.symlink_to(place / "other")
    kind, _, _ = started.run([str(link)], str(place), real=str(place / "approved"))
    assert kind == spawner.CHANGED and not marker.exists()
    link.unlink()
    link.symlink_to(place / "approved")
    assert started.run([str(link)], str(place), real=str(place / "approved"))[:2] == (spawner.STARTED, 0)
    assert marker.read_text() == "approved\n"


@pytest.mark.parametrize("payload, reason", [
    (b"1\0/bin/true\0/\x000\0", "in the middle of a field"),
    (b"x\0/bin/true\0/\x000\0\x000\0", "bad count"),
    (b"99\0/bin/true\0/\x000\0\x000\0", "bad count"),
    (b"1\0/bin/true\0/\x000\x000\0\x000\0\0extra\0", "left over"),
    (b"0\0/\x000\x000\0\x000\0\0", "no argv"),
    (b"1\0/bin/true\0/\x000\0-1\0\x000\0\0", "bad kill-after time"),
    (b"1\0/bin/true\0/\x000\0\0\x000\0\0", "bad kill-after time"),
    (b"1\0/bin/true\0/\x000\x002147483648000\0\x000\0\0", "bad kill-after time"),
])
def test_a_broken_spawn_request_ends_the_spawner_with_a_reason(started, payload, reason):
    read, write = os.pipe()
    started.send(spawner.SPAWN, payload, (write, write))
    os.close(write)
    os.close(read)
    code, errors = started.ended()
    assert code == 1 and reason in errors


def test_an_unknown_request_kind_ends_the_spawner(started):
    started.channel.sendall(spawner.HEADER.pack(7, 1, 0))
    assert started.ended() == (1, "protolink-spawner: an unknown request kind\n")


def test_an_oversized_request_ends_the_spawner(started):
    started.channel.sendall(spawner.HEADER.pack(spawner.SPAWN, 1, MAX_REQUEST_BYTES + 1))
    code, errors = started.ended()
    assert code == 1 and "--max-request-bytes" in errors


def test_a_spawn_without_its_pipes_fails_and_the_spawner_serves_on(started):
    frame = spawner.spawn_request(0, ["/bin/true"], "/", ENV, None, max_bytes=MAX_REQUEST_BYTES)
    started.send(spawner.SPAWN, frame[spawner.HEADER.size :])
    kind, _, payload = started.answer()
    assert (kind, payload[4:]) == (spawner.FAILED, b"the output pipes did not arrive")
    assert started.run(["/bin/true"])[:2] == (spawner.STARTED, 0)


def test_the_spawner_ends_when_the_server_closes_the_channel(started):
    started.channel.close()
    assert started.ended() == (0, "")


def test_a_keeper_forked_ahead_runs_the_next_command_with_every_cpu(started, place):
    """Once a command's exit is reported and nothing waits, the spawner forks the next keeper
    and names it; the next command runs under it, with every CPU even if something pinned the
    keeper while it waited, and nothing else of the keeper's changes."""
    assert started.run(["/bin/true"])[:2] == (spawner.STARTED, 0)
    keeper = started.next_warm()
    assert keeper > 0 and _parent(keeper) == started.process.pid
    assert _status(keeper, "NoNewPrivs") == "1"
    everywhere = os.sched_getaffinity(0)
    os.sched_setaffinity(keeper, {min(everywhere)})
    kind, parent, text = started.run(["/bin/sh", "-c", "echo $PPID; grep Cpus_allowed_list /proc/self/status"])
    assert (kind, parent) == (spawner.STARTED, 0)
    ppid, cpus = text.decode().splitlines()
    assert int(ppid) == keeper  # what it holds while it runs its command: see the test of orphans
    assert cpus.split()[1] == Path(f"/proc/{os.getpid()}/status").read_text().split("Cpus_allowed_list:")[1].split()[0]
