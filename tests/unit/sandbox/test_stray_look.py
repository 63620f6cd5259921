"""The quick look after a command: /proc listing only the server's own processes means no
stray, and a helper counts as the server's own only while it is its unreaped child."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from sandbox.reaper import _unreaped_child

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
        from sandbox.reaper import _only_ours
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
