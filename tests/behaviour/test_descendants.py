"""A command's descendants, whatever their process group or session, live while it runs.

Tools such as ``timeout``, ``setsid``, ``nohup``, shells with job control, test runners that
start workers in sessions of their own and double-forking daemons all work as on a host. Once
the command ends (exit, timeout or cancellation), a sandbox kills everything descended from
it. The host backend kills the command's process group; what left the group or the session
escapes it there, as the spec says, so the tests of those (``contained``) run on sandboxes only.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import shlex
import textwrap

import pytest
from process_helpers import observed_agent

from protolink.tools.builtins import ProcessCancelledError, process_tool

#: How long the waited-for descendants live: longer than a few of the sandbox's stray sweeps.
LIFETIME = "1.2"
_markers = itertools.count(random.randrange(1, 10**6) * 1000)

DOUBLE_FORK = textwrap.dedent("""
    import os, sys, time
    pidfile, lifetime = sys.argv[1], float(sys.argv[2])
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            with open(pidfile + ".tmp", "w") as file:
                file.write(str(os.getpid()))
            os.rename(pidfile + ".tmp", pidfile)
            time.sleep(lifetime)
            open(pidfile + ".done", "w").close()
        os._exit(0)
    os.wait()
    while not os.path.exists(pidfile):
        time.sleep(0.01)
    daemon = int(open(pidfile).read())
    while True:  # the daemon is nobody's child here: poll it until it is gone
        try:
            os.kill(daemon, 0)
        except ProcessLookupError:
            break
        time.sleep(0.02)
    print("rc=0" if os.path.exists(pidfile + ".done") else "rc=killed")
""")

NEW_SESSIONS = textwrap.dedent("""
    import subprocess, sys
    children = [subprocess.Popen(["sleep", sys.argv[1]], start_new_session=True) for _ in range(3)]
    print(f"rc={max(child.wait() for child in children)}")
""")

#: Scripts (for bash) that start descendants and wait for them; each prints rc=0 when all
#: of them lived to exit by themselves.
WAITED_FOR = {
    "timeout": f"timeout 30 sleep {LIFETIME}; echo rc=$?",
    "setsid": f"setsid sleep {LIFETIME}; echo rc=$?",
    "job control": f"set -m; sleep {LIFETIME} & wait $!; echo rc=$?",
    "nohup": f"nohup sleep {LIFETIME} >/dev/null 2>&1 & wait $!; echo rc=$?",
    "parallel jobs": (f"pids=''; for i in 1 2 3; do sleep {LIFETIME} & pids=\"$pids $!\"; done; "
                      "rc=0; for pid in $pids; do wait $pid || rc=$?; done; echo rc=$rc"),
    "parallel jobs under job control": (f"set -m; pids=''; for i in 1 2 3; do sleep {LIFETIME} & pids=\"$pids $!\"; "
                                        "done; rc=0; for pid in $pids; do wait $pid || rc=$?; done; echo rc=$rc"),
    "python sessions": f'"$PYTHON" -c {shlex.quote(NEW_SESSIONS)} {LIFETIME}',
    "double-forked daemon": f'"$PYTHON" -c {shlex.quote(DOUBLE_FORK)} "$PWD/daemon.pid" {LIFETIME}',
}

#: Scripts that leave descendants running and exit; ``{m}`` makes each one's command line unique
#: (sleep adds up its arguments). Those whose descendants leave the command's process group are
#: ``contained``: the host backend kills the group only.
LEFT_RUNNING = {
    "timeout": pytest.param("timeout 300 sleep 600 {m} &", marks=pytest.mark.contained),
    "setsid": pytest.param("setsid sleep 600 {m} &", marks=pytest.mark.contained),
    "job control": pytest.param("set -m; sleep 600 {m} & sleep 600 {m} &", marks=pytest.mark.contained),
    "nohup": "nohup sleep 600 {m} >/dev/null 2>&1 &",
    "parallel jobs": "sleep 600 {m} & sleep 600 {m} & sleep 600 {m} &",
    "python sessions": pytest.param('"$PYTHON" -c "import subprocess; [subprocess.Popen([\'sleep\', \'600\', \'{m}\'], '
                                    'start_new_session=True) for _ in range(3)]"', marks=pytest.mark.contained),
    "double-forked daemon": pytest.param('"$PYTHON" -c "import os; os.fork() and os._exit(0); os.setsid(); '
                                         'os.fork() and os._exit(0); os.execvp(\'sleep\', [\'sleep\', \'600\', \'{m}\'])"',
                                         marks=pytest.mark.contained),
}

#: Prints the pids of processes whose command line holds argv[1], once none is left or after
#: argv[2] seconds (a killed process is gone as soon as the kernel has delivered the signal).
SURVIVORS = textwrap.dedent("""
    import os, sys, time
    marker, deadline = sys.argv[1].encode(), time.monotonic() + float(sys.argv[2])
    while True:
        found = []
        for name in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{name}/cmdline", "rb") as file:
                    argv = file.read().split(b"\\0")
            except OSError:
                continue
            if marker in argv and int(name) != os.getpid():
                found.append(name)
        if not found or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    print(" ".join(found))
""")


@pytest.fixture
def tool(backend):
    return process_tool(backend=backend)


def shell(observed, workspace, backend_python, script, **arguments):
    """Run ``script`` with bash (dash turns job control off without a terminal)."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "PYTHON": backend_python}
    return observed.agent.call_tool("execute_command", argv=["/bin/bash", "-c", script], cwd=str(workspace),
                                    env=env, **arguments)


async def survivors(observed, workspace, backend_python, marker: str) -> list[str]:
    """Pids of processes with ``marker`` in their command line that are still there after a
    while (a killed process is gone once the kernel has delivered the signal)."""
    result = await observed.agent.call_tool("execute_command", argv=[backend_python, "-c", SURVIVORS, marker, "10"],
                                            cwd=str(workspace), env={})
    assert result.exit_code == 0, result
    return result.stdout.split()


def unique_marker() -> str:
    return f"0.{next(_markers):09d}"


@pytest.mark.parametrize("script", WAITED_FOR.values(), ids=WAITED_FOR.keys())
async def test_descendants_a_command_waits_for_live_until_they_exit(tool, workspace, backend_python, script):
    observed = observed_agent(tool)
    result = await shell(observed, workspace, backend_python, script)
    assert (result.exit_code, result.stdout) == (0, "rc=0\n"), result.stderr


@pytest.mark.parametrize("script", LEFT_RUNNING.values(), ids=LEFT_RUNNING.keys())
async def test_descendants_left_running_are_gone_once_the_command_exits(tool, workspace, backend_python, script):
    observed = observed_agent(tool)
    marker = unique_marker()
    result = await shell(observed, workspace, backend_python, f"{script.format(m=marker)}\necho started")
    assert (result.exit_code, result.stdout) == (0, "started\n")
    assert await survivors(observed, workspace, backend_python, marker) == []


ESCAPING = ("setsid sleep 600 {m} & timeout 300 sleep 600 {m} & "
            '"$PYTHON" -c "import subprocess; subprocess.Popen([\'sleep\', \'600\', \'{m}\'], start_new_session=True)"; '
            "echo started; sleep 60")


@pytest.mark.contained
async def test_descendants_in_other_sessions_are_gone_once_the_command_times_out(tool, workspace, backend_python):
    observed = observed_agent(tool)
    marker = unique_marker()
    # Past the Python start-up that comes before "started" (tenths of a second beside CPU hogs), tenfold.
    result = await shell(observed, workspace, backend_python, ESCAPING.format(m=marker), timeout_seconds=10)
    assert result.timed_out and result.stdout == "started\n"
    assert await survivors(observed, workspace, backend_python, marker) == []


@pytest.mark.contained
async def test_descendants_in_other_sessions_are_gone_once_the_command_is_canceled(tool, workspace, backend_python):
    observed = observed_agent(tool)
    marker = unique_marker()
    printed = asyncio.Event()
    observed.agent.events.add_sink(lambda event: printed.set() if event.type == "process.output" else None)
    call = asyncio.create_task(shell(observed, workspace, backend_python, ESCAPING.format(m=marker)))
    await asyncio.wait_for(printed.wait(), 30)
    call.cancel()
    with pytest.raises(ProcessCancelledError):
        await call
    assert await survivors(observed, workspace, backend_python, marker) == []
