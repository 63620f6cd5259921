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
        from protolink_sandboxd.strays import _only_ours
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
