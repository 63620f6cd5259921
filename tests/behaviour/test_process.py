"""execute_command on a real backend: exact previews, isolation, limits, cleanup and events."""

from __future__ import annotations

import asyncio
import signal
import textwrap

import pytest

from process_helpers import observed_agent
from protolink import (
    Agent,
    AgentCard,
    ApprovalDecision,
    ApprovalDeniedError,
    BudgetExceededError,
    CapabilityPolicy,
    PolicyDeniedError,
    RunContext,
    ToolArgumentError,
)
from protolink.errors import DirectCallError
from protolink.tools.builtins import ProcessCancelledError, ProcessResult, process_tool
from tests.descriptors import open_descriptors


def py(code: str) -> str:
    return textwrap.dedent(code)


def spawning(marker, delay: float, then: str) -> list[str]:
    """A shell that starts a SIGTERM-ignoring grandchild writing ``marker`` after ``delay``,
    prints "started" once the grandchild ignores SIGTERM, then runs ``then``. A shell, not
    Python: a test with a 1 s timeout needs this done first, whatever the machine's load, and two
    Python start-ups took 0.3-0.4 s of that second beside two CPU hogs."""
    late_writer = f"trap '' TERM; touch '{marker}.armed'; sleep {delay}; echo survived > '{marker}'"
    return ["/bin/sh", "-c", f"({late_writer}) & while [ ! -e '{marker}.armed' ]; do sleep 0.01; done; "
                             f"echo started; {then}"]


@pytest.fixture
def tool(backend):
    return process_tool(backend=backend)


async def run(observed, workspace, argv, **arguments):
    arguments.setdefault("env", {})
    return await observed.agent.call_tool("execute_command", argv=argv, cwd=str(workspace), **arguments)


async def test_nonzero_exit_is_a_typed_result_with_both_channels(tool, workspace, backend_python):
    observed = observed_agent(tool)
    code = "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"
    result = await run(observed, workspace, [backend_python, "-c", code])
    assert isinstance(result, ProcessResult)
    assert (result.exit_code, result.stdout, result.stderr) == (3, "out\n", "err\n")
    assert not (result.truncated or result.timed_out or result.canceled or result.budget_exceeded)


async def test_empty_env_inherits_nothing_and_a_mapping_is_the_whole_environment(
        tool, workspace, monkeypatch):
    monkeypatch.setenv("PROTOLINK_HOST_SECRET", "must-not-leak")
    observed = observed_agent(tool)
    assert (await run(observed, workspace, ["/usr/bin/env"])).stdout == ""
    chosen = await run(observed, workspace, ["/usr/bin/env"], env={"ONLY": "this"})
    assert chosen.stdout == "ONLY=this\n"


async def test_preview_shows_exact_resolved_command_limits_and_boundary(
        tool, backend, workspace, backend_python):
    observed = observed_agent(tool)
    (workspace / "link").symlink_to(workspace, target_is_directory=True)
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    result = await observed.agent.call_tool(
        "execute_command", argv=["env", "-0"], cwd=str(workspace / "link"), env=env,
        timeout_seconds=7.5, max_output_bytes=1234)
    assert result.exit_code == 0
    [request] = observed.requests
    [artifact] = request.artifacts
    resolved = {
        "argv": ["/usr/bin/env", "-0"],
        "cwd": str(workspace),
        "env": env,
        "timeout_seconds": 7.5,
        "max_output_bytes": 1234,
        "real_executable": "/usr/bin/env",
    }
    assert artifact.kind == "process"
    assert artifact.content == {**resolved, "boundary": backend.boundary}
    assert request.action.process == resolved
    assert request.action.arguments["argv"] == ["env", "-0"]
    assert request.capabilities == ("process.execute",)


async def test_a_symlinked_executable_is_previewed_with_the_file_it_runs_and_checked_before_launch(
        tool, workspace, backend_python):
    """A virtualenv's python is a symbolic link: the preview names the link (argv[0], which the
    interpreter needs) and the file it runs; a link moved while the call awaits approval makes
    the call fail with nothing started."""
    link = workspace / "python"
    link.symlink_to(backend_python)
    where = "import os, sys; print(os.path.realpath(sys.executable))"
    observed = observed_agent(tool)
    result = await run(observed, workspace, ["./python", "-c", where])
    [request] = observed.requests
    assert request.action.process["argv"][0] == f"{workspace}/./python"
    assert request.artifacts[0].content["real_executable"] == result.stdout.strip() != str(link)
    marker = workspace / "ran"

    async def move_the_link_then_approve(request, context):
        link.unlink()
        link.symlink_to("/bin/sh")
        return ApprovalDecision(approved=True, request_id=request.request_id)

    moved = Agent(AgentCard(name="moved", description="moves a link", url="runtime://moved"),
                  policy=CapabilityPolicy({"process.execute": "require_approval"}),
                  approval_handler=move_the_link_then_approve)
    moved.add_tool(tool)
    with pytest.raises(ValueError, match="now resolves to .*nothing was started"):
        await moved.call_tool("execute_command", argv=["./python", "-c", f"open({str(marker)!r}, 'w')"],
                              cwd=str(workspace), env={})
    assert not marker.exists()


async def test_executables_resolve_from_supplied_path_or_explicit_paths_only(
        tool, workspace, backend_python):
    observed = observed_agent(tool)
    script = workspace / "hello.sh"
    script.write_text("#!/bin/sh\necho hi from script\n")
    script.chmod(0o755)
    assert (await run(observed, workspace, ["./hello.sh"])).stdout == "hi from script\n"
    assert (await run(observed, workspace, ["hello.sh"], env={"PATH": str(workspace)})).stdout \
        == "hi from script\n"
    with pytest.raises(ValueError, match="no PATH"):
        await run(observed, workspace, ["env"])
    with pytest.raises(ValueError, match="not found"):
        await run(observed, workspace, ["hello.sh"], env={"PATH": "/usr/bin:/bin"})
    with pytest.raises(ValueError, match="absolute"):
        await run(observed, "relative/dir", [backend_python, "-V"])
    with pytest.raises(ValueError, match="does not exist"):
        await run(observed, workspace / "missing", [backend_python, "-V"])
    assert len(observed.requests) == 2  # only the two valid commands reached approval


@pytest.mark.parametrize("policy", [None, CapabilityPolicy({"process.execute": "deny"})])
async def test_denial_prevents_execution(tool, workspace, backend_python, policy):
    observed = observed_agent(tool, approve=False, policy=policy)
    marker = workspace / "ran"
    code = f"import pathlib; pathlib.Path({str(marker)!r}).write_text('ran')"
    with pytest.raises(ApprovalDeniedError if policy is None else PolicyDeniedError):
        await run(observed, workspace, [backend_python, "-c", code])
    assert not marker.exists()
    assert "action.denied" in observed.types()
    assert "action.started" not in observed.types()


async def test_limits_above_factory_ceilings_are_rejected_before_authorization(
        backend, workspace, backend_python):
    observed = observed_agent(process_tool(backend=backend, max_timeout_seconds=5,
                                           max_output_bytes=100))
    with pytest.raises(ToolArgumentError, match="less than or equal to 5"):
        await run(observed, workspace, [backend_python, "-V"], timeout_seconds=6)
    with pytest.raises(ToolArgumentError, match="less than or equal to 100"):
        await run(observed, workspace, [backend_python, "-V"], max_output_bytes=101)
    assert observed.requests == []
    result = await run(observed, workspace, [backend_python, "-c", "print('x' * 500)"])
    assert result.truncated and len(result.stdout) == 100  # defaults are capped by the ceiling
    assert observed.requests[0].action.process["timeout_seconds"] == 5


async def test_prepared_tool_cannot_be_called_directly(tool, workspace, backend_python):
    with pytest.raises(DirectCallError):
        await tool(argv=[backend_python, "-V"], cwd=str(workspace), env={})


async def test_timeout_kills_the_whole_group(tool, workspace):
    observed = observed_agent(tool)
    marker = workspace / "grandchild-survived"
    result = await run(observed, workspace, spawning(marker, 2, "exec sleep 60"), timeout_seconds=1)
    assert result.timed_out and not result.canceled and not result.budget_exceeded
    assert result.exit_code == -signal.SIGTERM
    assert result.stdout == "started\n"
    await asyncio.sleep(3)
    assert not marker.exists()


async def test_normal_exit_kills_descendants_left_in_the_group(tool, workspace):
    observed = observed_agent(tool)
    marker = workspace / "background-survived"
    result = await run(observed, workspace, spawning(marker, 1.5, "exit 0"))
    assert (result.exit_code, result.stdout, result.timed_out) == (0, "started\n", False)
    await asyncio.sleep(3)
    assert not marker.exists()


async def test_a_descendant_in_its_own_session_cannot_hold_the_call_open(
        tool, workspace, backend_python):
    observed = observed_agent(tool)
    code = py("""
        import subprocess, sys
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                                 start_new_session=True)
        print(child.pid, flush=True)
    """)
    result = await asyncio.wait_for(run(observed, workspace, [backend_python, "-c", code]), 20)
    assert result.exit_code == 0 and not result.timed_out
    escaped = int(result.stdout)
    kill = "import os, signal, sys; os.kill(int(sys.argv[1]), signal.SIGKILL)"
    await run(observed, workspace, [backend_python, "-c", kill, str(escaped)])


async def test_cancellation_reaps_the_group_and_keeps_partial_output(tool, workspace):
    observed = observed_agent(tool)
    marker = workspace / "grandchild-survived"
    printed = asyncio.Event()
    observed.agent.events.add_sink(lambda event: printed.set() if event.type == "process.output" else None)
    call = asyncio.create_task(run(observed, workspace, spawning(marker, 2, "exec sleep 60"), timeout_seconds=60))
    await asyncio.wait_for(printed.wait(), 30)
    call.cancel()
    with pytest.raises(ProcessCancelledError) as raised:
        await call
    assert isinstance(raised.value, asyncio.CancelledError)
    partial = raised.value.result
    assert partial.canceled and partial.stdout == "started\n" and not partial.timed_out
    assert partial.exit_code == -signal.SIGTERM
    [finished] = observed.of_type("process.finished")
    assert finished.data["canceled"] is True and finished.data["stdout"] == "started\n"
    assert finished.data["exit_code"] == -signal.SIGTERM
    [canceled] = observed.of_type("action.canceled")
    assert canceled.data["partial_result"]["stdout"] == "started\n"
    await asyncio.sleep(3)
    assert not marker.exists()


async def test_a_canceled_call_returns_once_a_leader_that_ignores_sigterm_is_killed(tool, workspace):
    observed = observed_agent(tool)
    beats = workspace / "beats"
    printed = asyncio.Event()
    observed.agent.events.add_sink(lambda event: printed.set() if event.type == "process.output" else None)
    argv = ["/bin/sh", "-c", f"trap '' TERM; echo started; while :; do echo . >> '{beats}'; sleep 0.01; done"]
    call = asyncio.create_task(run(observed, workspace, argv, timeout_seconds=60))
    await asyncio.wait_for(printed.wait(), 30)
    call.cancel()
    with pytest.raises(ProcessCancelledError) as raised:
        await call
    assert raised.value.result.exit_code == -signal.SIGKILL
    size = beats.stat().st_size
    await asyncio.sleep(0.5)
    assert beats.stat().st_size == size  # dead before the call returned


async def test_flood_is_capped_while_the_pipes_keep_draining(tool, workspace, backend_python):
    observed = observed_agent(tool)
    code = py("""
        import sys
        chunk = b"x" * (1 << 20)
        for _ in range(200):
            sys.stdout.buffer.write(chunk)
        sys.stdout.flush()
        print("exit marker", file=sys.stderr)
    """)
    result = await run(observed, workspace, [backend_python, "-c", code], max_output_bytes=65536)
    assert result.exit_code == 0 and result.truncated
    assert result.stdout == "x" * 65536 and result.stderr == ""
    emitted = "".join(e.data["text"] for e in observed.of_type("process.output"))
    assert emitted == result.stdout


async def test_output_cap_is_combined_across_stdout_and_stderr(tool, workspace, backend_python):
    observed = observed_agent(tool)
    code = py("""
        import sys
        sys.stdout.write("o" * 3000); sys.stdout.flush()
        sys.stderr.write("e" * 3000); sys.stderr.flush()
    """)
    result = await run(observed, workspace, [backend_python, "-c", code], max_output_bytes=4096)
    assert result.truncated
    assert len(result.stdout) + len(result.stderr) == 4096
    assert set(result.stdout) <= {"o"} and set(result.stderr) <= {"e"}


async def test_output_is_decoded_as_utf8_with_replacement(tool, workspace, backend_python):
    observed = observed_agent(tool)
    code = py("""
        import sys, time
        out = sys.stdout.buffer
        out.write(b"bad \\xff\\xfe end|"); out.flush()
        out.write("caf\\u00e9".encode()[:-1]); out.flush()
        time.sleep(0.2)
        out.write("caf\\u00e9".encode()[-1:]); out.flush()
    """)
    result = await run(observed, workspace, [backend_python, "-c", code])
    assert result.stdout == "bad \ufffd\ufffd end|caf\u00e9"


async def test_output_events_precede_finished_and_match_the_result(tool, workspace, backend_python):
    observed = observed_agent(tool)
    code = "import sys\nfor i in range(3):\n    print(i, flush=True)\nprint('e', file=sys.stderr)"
    result = await run(observed, workspace, [backend_python, "-c", code])
    types = observed.types()
    process_events = [t for t in types if t.startswith("process.")]
    assert process_events[-1] == "process.finished" and process_events.count("process.finished") == 1
    assert types.index("action.started") < types.index("process.output")
    assert types.index("process.finished") < types.index("action.completed")
    by_channel = {"stdout": "", "stderr": ""}
    for event in observed.of_type("process.output"):
        by_channel[event.data["channel"]] += event.data["text"]
    assert by_channel == {"stdout": result.stdout, "stderr": result.stderr}
    [finished] = observed.of_type("process.finished")
    assert finished.data == result.to_dict()


async def test_budget_is_checked_before_launch_including_approval_time(
        tool, workspace, backend_python):
    observed = observed_agent(tool, approval_delay=2.0, max_run_seconds=0.5)
    marker = workspace / "ran"
    code = f"import pathlib; pathlib.Path({str(marker)!r}).write_text('ran')"
    with pytest.raises(BudgetExceededError):
        await run(observed, workspace, [backend_python, "-c", code])
    assert not marker.exists()
    assert "action.started" not in observed.types()


async def test_process_time_is_bounded_by_the_remaining_run_budget(tool, workspace, backend_python):
    observed = observed_agent(tool)
    context = RunContext(max_seconds=1.5)
    result = await observed.agent.call_tool(
        "execute_command", context=context, argv=[backend_python, "-c", "import time; time.sleep(60)"],
        cwd=str(workspace), env={}, timeout_seconds=60)
    assert result.timed_out and result.budget_exceeded
    assert observed.of_type("process.finished")[0].data["budget_exceeded"] is True


async def test_no_file_descriptor_leaks_after_exit_timeout_and_cancellation(
        tool, workspace, backend_python):
    observed = observed_agent(tool)
    await run(observed, workspace, [backend_python, "-c", "print(1)"])  # warm up lazy imports
    before = open_descriptors()
    await run(observed, workspace, [backend_python, "-c", "print(1)"])
    await run(observed, workspace, [backend_python, "-c", "import time; time.sleep(60)"],
              timeout_seconds=0.5)
    started = len(observed.of_type("action.started"))
    call = asyncio.create_task(
        run(observed, workspace, [backend_python, "-c", "import time; time.sleep(60)"]))
    while len(observed.of_type("action.started")) == started:
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)
    call.cancel()
    with pytest.raises(ProcessCancelledError):
        await call
    assert open_descriptors() <= before  # fixtures of other tests may close theirs meanwhile
