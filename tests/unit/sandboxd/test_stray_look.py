"""The quick look after a command: /proc listing only the server's own processes means no
stray, and a helper counts as the server's own only while it is its unreaped child."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from protolink_sandboxd.strays import _unreaped_child

pytestmark = pytest.mark.root

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def test_a_child_is_unreaped_while_it_runs_and_as_a_zombie_and_not_after():
    child = subprocess.Popen(["sleep", "60"])
    assert _unreaped_child(child.pid)
    child.kill()
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # a zombie now
    assert _unreaped_child(child.pid)
    assert _unreaped_child(child.pid)  # looking did not reap it
    child.wait()
    assert not _unreaped_child(child.pid)


def test_a_process_that_is_not_a_child_is_not_ours():
    assert not _unreaped_child(os.getppid())
    assert not _unreaped_child(1)


def test_only_the_servers_own_processes_listed_is_a_clean_look():
    """In a pid namespace of its own (as in the container), the look is clean with nothing
    else running, not clean beside an unknown process, clean when that process is a helper."""
    script = textwrap.dedent("""
        import subprocess
        from protolink_sandboxd.strays import _helpers, _listed, _server_and_ancestors

        def _only_ours(spawner, workers):
            listed = _listed()
            return listed == _server_and_ancestors() | _helpers(spawner, workers)

        assert _only_ours(None, []), "alone"
        other = subprocess.Popen(["sleep", "60"])
        assert not _only_ours(None, []), "an unknown process"
        assert _only_ours(other.pid, []), "the spawner"
        assert _only_ours(None, [other.pid]), "a worker"
        other.kill(); other.wait()
        assert _only_ours(None, [other.pid]), "a reaped worker is gone from both lists"
        stray = subprocess.Popen(["sh", "-c", "setsid sleep 60 & exit 0"]); stray.wait()
        assert not _only_ours(None, []), "a stray"
        print("ok")
    """)
    done = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", script],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "ok", done.stderr


def test_the_quickest_look_trusts_only_processes_started_since_a_quiet_moment_and_gone():
    """In a pid namespace of its own: after a clean look, a command that came and went leaves a
    clean look without reading /proc's listing; a process still there, a zombie, a stray or too
    many new processes send the look the long way."""
    script = textwrap.dedent("""
        import os, subprocess
        from protolink_sandboxd.strays import NEW_PIDS_CHECKED, StraySweeper
        reaper = StraySweeper(65533, lambda: None, lambda: [])
        assert not reaper._none_left_since_quiet(), "no quiet moment yet"
        assert reaper._idle_and_clean(), "alone"
        subprocess.run(["true"], check=True)
        subprocess.run(["sh", "-c", "true & wait"], check=True)
        assert reaper._none_left_since_quiet(), "commands that came and went"
        running = subprocess.Popen(["sleep", "60"])
        assert not reaper._none_left_since_quiet(), "a process still running"
        running.kill(); os.waitid(os.P_PID, running.pid, os.WEXITED | os.WNOWAIT)
        assert not reaper._none_left_since_quiet(), "a zombie"
        running.wait()
        assert reaper._none_left_since_quiet(), "reaped"
        daemon = subprocess.run(["sh", "-c", "setsid sleep 60 >/dev/null 2>&1 & echo $!"],
                                capture_output=True, text=True, check=True)
        stray = int(daemon.stdout)
        assert not reaper._none_left_since_quiet(), "a stray"
        assert not reaper._none_left_since_quiet(), "still a stray"
        os.kill(stray, 9)
        assert not reaper._none_left_since_quiet(), "a killed stray not yet reaped"
        os.waitpid(stray, 0)  # this process is the namespace's init: orphans are its children
        assert reaper._none_left_since_quiet(), "the stray is gone"
        for _ in range(NEW_PIDS_CHECKED + 1):
            subprocess.run(["true"], check=True)
        assert not reaper._none_left_since_quiet(), "more new processes than checked one by one"
        assert reaper._idle_and_clean(), "alone again"
        subprocess.run(["true"], check=True)
        assert reaper._none_left_since_quiet(), "quiet again"
        print("ok")
    """)
    done = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", script],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "ok", done.stderr


def test_a_keeper_waiting_for_its_command_keeps_the_looks_quick_while_the_server_knows_it():
    """In a pid namespace of its own: the keeper the spawner forked ahead (named to the server)
    counts as the server's own in the quick looks; one it was not told of sends the look the long
    way."""
    script = textwrap.dedent("""
        import subprocess
        from protolink_sandboxd.strays import StraySweeper
        spawner = subprocess.Popen(["sleep", "60"])
        waiting = []
        reaper = StraySweeper(65533, lambda: spawner.pid, lambda: [], waiting=lambda: waiting[0] if waiting else None)
        assert reaper._idle_and_clean(), "the spawner alone"
        keeper = subprocess.Popen(["sleep", "60"])
        assert not reaper._none_left_since_quiet(), "an unknown process"
        waiting.append(keeper.pid)
        assert reaper._none_left_since_quiet(), "the keeper forked ahead since"
        assert reaper._idle_and_clean(), "listed with the spawner"
        assert reaper._none_left_since_quiet(), "quiet with it"
        subprocess.Popen(["sleep", "60"])  # the next one, not named yet
        assert not reaper._none_left_since_quiet(), "a keeper the server was not told of"
        print("ok")
    """)
    done = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", script],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "ok", done.stderr


def test_a_pid_counter_that_does_not_count_is_not_used():
    from protolink_sandboxd.strays import _PidCounter

    assert _PidCounter(lambda: 0).last() is None  # gVisor's /proc/loadavg ends in 0, whatever starts
    counter = _PidCounter(lambda: subprocess.Popen(["true"]).pid)
    assert counter.last() is not None


def test_no_sweep_runs_once_the_last_command_has_ended():
    """Sweeps run while commands run and once after each: a process of the command uid started
    after the last command ended lives on until the next command (the periodic sweep's timer,
    still running when the command ended, does not fire once more). In a pid namespace of its
    own, under an init that is not the reaper's process (as in the container)."""
    script = textwrap.dedent("""
        import asyncio, subprocess
        from protolink_sandboxd.strays import INTERVAL_SECONDS, StraySweeper

        def alive(pid):
            try:
                with open(f"/proc/{pid}/stat") as stat:
                    return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
            except (FileNotFoundError, ProcessLookupError):  # gone, or going
                return False

        async def main():
            reaper = StraySweeper(65533, lambda: None, lambda: [])
            async with reaper.command():
                await asyncio.sleep(INTERVAL_SECONDS * 1.2)  # the timer is mid-wait when it ends
            daemon = subprocess.run(["sh", "-c", "setsid sleep 60 >/dev/null 2>&1 & echo $!"], user=65533,
                                    capture_output=True, text=True, check=True)
            pid = int(daemon.stdout)
            await asyncio.sleep(INTERVAL_SECONDS * 2)
            assert alive(pid), "swept with no command running"
            async with reaper.command():
                pass
            for _ in range(100):  # signalled: dead as soon as the kernel delivers it
                if not alive(pid):
                    break
                await asyncio.sleep(0.05)
            assert not alive(pid), "the next command's sweep kills it"
            print("ok")

        asyncio.run(main())
    """)
    init = ["sh", "-c", '"$@" & wait', "init", sys.executable, "-c", script]
    done = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", *init],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "ok", done.stderr


def test_a_look_after_a_look_reads_only_what_changed_and_still_finds_what_a_command_left():
    """In a pid namespace of its own, with a spawner whose keepers are child subreapers (as in
    the container): while a command runs, a second look reads none of its processes' statuses;
    once the command has ended for the server, the daemon it left is a stray, before its keeper
    is reaped and after, and so is a process of the uid that no command started."""
    script = textwrap.dedent("""
        import os, subprocess, sys, tempfile, textwrap, time
        from protolink_sandboxd import strays
        from protolink_sandboxd.strays import Descent, _PidCounter, _helpers, _listed

        UID = 65533
        SPAWNER = '''
        import ctypes, os, sys
        for line in sys.stdin:
            verb, argument = line.rstrip("\\\\n").split(" ", 1)
            if verb == "reap":
                os.waitpid(int(argument), 0)
                print("reaped", flush=True)
                continue
            keeper = os.fork()
            if keeper == 0:
                ctypes.CDLL(None).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
                command = os.fork()
                if command == 0:
                    os.setsid()
                    os.setuid(%d)
                    os.execv("/bin/sh", ["sh", "-c", argument])
                os.waitpid(command, 0)
                os._exit(0)
            print(keeper, flush=True)
        ''' % UID

        directory = tempfile.mkdtemp()
        os.chmod(directory, 0o777)
        fifo, daemon_file = os.path.join(directory, "fifo"), os.path.join(directory, "daemon")
        os.mkfifo(fifo, 0o666)

        def start():
            started = subprocess.Popen(["true"])
            started.wait()
            return started.pid

        counter = _PidCounter(start)
        assert counter.last() is not None, "the pid counter counts here"
        spawner = subprocess.Popen([sys.executable, "-c", textwrap.dedent(SPAWNER)], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, text=True)
        running = set()  # the keepers of commands that have not ended for the server
        descent = Descent(UID, lambda: spawner.pid, lambda: running, counter, seconds=3600)
        read = []
        real_read = strays._read
        strays._read = lambda pid: read.append(pid) or real_read(pid)

        def state(pid):
            try:
                return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
            except (FileNotFoundError, ProcessLookupError):  # reaped before or while it was read
                return None

        def look():
            read.clear()
            last = counter.last()
            return descent.clean(last, spawner.pid, _listed(), _helpers(spawner.pid, []))

        assert look(), "nothing runs"
        spawner.stdin.write(f"run setsid sleep 60 >/dev/null 2>&1 & echo $! > {daemon_file}; read x < {fifo}\\n")
        spawner.stdin.flush()
        keeper = int(spawner.stdout.readline())
        running.add(keeper)
        for _ in range(6000):  # a hang guard: the command writes the daemon's pid at once
            if os.path.exists(daemon_file) and open(daemon_file).read().endswith("\\n"):
                break
            time.sleep(0.01)
        daemon = int(open(daemon_file).read())
        assert look(), "the command and its daemon are below its keeper"
        assert daemon in read and keeper in read, "first seen: read"
        assert look(), "still below"
        assert not {daemon, keeper} & set(read), f"read again: {read}"
        with open(fifo, "w") as release:
            release.write("x\\n")
        while state(keeper) != "Z":  # the keeper exits with its command; the spawner has not reaped it
            time.sleep(0.01)
        running.discard(keeper)  # the command has ended for the server
        assert not look(), "the daemon its ended command left, beside the keeper not yet reaped"
        assert daemon in read
        spawner.stdin.write(f"reap {keeper}\\n")
        spawner.stdin.flush()
        assert spawner.stdout.readline() == "reaped\\n"
        assert not look(), "the daemon, once the keeper is reaped"
        os.kill(daemon, 9)
        while state(daemon) not in ("Z", None):  # orphans come to this namespace's init
            time.sleep(0.01)
        assert look(), "the daemon is dead"
        started = subprocess.run(["sh", "-c", "setsid sleep 60 >/dev/null 2>&1 & echo $!"], user=UID,
                                 capture_output=True, text=True, check=True)
        assert not look(), "a process of the uid that no command started"
        os.kill(int(started.stdout), 9)
        spawner.stdin.close()
        spawner.wait()
        print("ok")
    """)
    init = ["sh", "-c", '"$@" & wait', "init", sys.executable, "-c", script]
    done = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", *init],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "ok", done.stderr
