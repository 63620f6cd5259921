"""run_shell on a real backend: a fresh /bin/sh per call, application-owned settings."""

from __future__ import annotations

import os

import pytest
from process_helpers import observed_agent

from protolink import CapabilityPolicy, PolicyDeniedError
from protolink.tools.builtins import shell_tool


async def run(observed, command):
    return await observed.agent.call_tool("run_shell", command=command)


async def test_pipelines_and_redirects_work_in_the_configured_directory(backend, workspace):
    observed = observed_agent(shell_tool(cwd=str(workspace), backend=backend))
    result = await run(observed, "printf 'b\\na\\n' | sort > sorted.txt; cat sorted.txt; pwd; exit 4")
    assert (result.exit_code, result.stdout) == (4, f"a\nb\n{workspace}\n")
    assert (workspace / "sorted.txt").read_text() == "a\nb\n"


async def test_each_call_is_a_fresh_shell(backend, workspace):
    observed = observed_agent(shell_tool(cwd=str(workspace), backend=backend))
    await run(observed, "cd / && export CARRIED=yes")
    result = await run(observed, 'pwd; echo "carried=${CARRIED:-no}"')
    assert result.stdout == f"{workspace}\ncarried=no\n"


async def test_default_environment_is_only_the_default_path(backend, workspace, monkeypatch):
    monkeypatch.setenv("PROTOLINK_HOST_SECRET", "must-not-leak")
    observed = observed_agent(shell_tool(cwd=str(workspace), backend=backend))
    result = await run(observed, 'printenv PATH; env')
    path, *variables = result.stdout.splitlines()
    assert path == os.defpath
    assert "PROTOLINK_HOST_SECRET" not in result.stdout
    # the shell itself may export PWD; nothing else comes from anywhere
    assert {line.split("=", 1)[0] for line in variables} <= {"PATH", "PWD"}


async def test_an_explicit_environment_is_copied_at_registration(backend, workspace):
    env = {"PATH": "/usr/bin:/bin", "GREETING": "hi"}
    observed = observed_agent(shell_tool(cwd=str(workspace), env=env, backend=backend))
    env["GREETING"] = "changed later"
    assert (await run(observed, 'echo "$GREETING"')).stdout == "hi\n"


async def test_preview_shows_the_exact_shell_invocation(backend, workspace):
    tool = shell_tool(cwd=str(workspace), backend=backend, timeout_seconds=9, max_output_bytes=512)
    observed = observed_agent(tool)
    command = "-x is not an option here; echo ok"
    result = await run(observed, command)
    assert result.stdout.endswith("ok\n")  # "--" kept the leading "-x" out of the shell's options
    [request] = observed.requests
    assert request.capabilities == ("process.execute", "shell.execute")
    assert request.action.arguments == {"command": command}
    [artifact] = request.artifacts
    assert artifact.content == {
        "argv": ["/bin/sh", "-c", "--", command],
        "cwd": str(workspace),
        "env": {"PATH": os.defpath},
        "timeout_seconds": 9,
        "max_output_bytes": 512,
        "real_executable": (await run(observed, "readlink -f /bin/sh")).stdout.strip(),  # where it runs
        "boundary": backend.boundary,
    }


async def test_denial_prevents_execution(backend, workspace):
    observed = observed_agent(shell_tool(cwd=str(workspace), backend=backend),
                              policy=CapabilityPolicy({"shell.execute": "deny"}))
    with pytest.raises(PolicyDeniedError):
        await run(observed, "touch ran")
    assert not (workspace / "ran").exists()


async def test_configured_timeout_and_output_cap_apply(backend, workspace):
    # Long enough for the echo to come first wherever the shell starts (a sandbox on a loaded machine).
    tool = shell_tool(cwd=str(workspace), backend=backend, timeout_seconds=2, max_output_bytes=10)
    observed = observed_agent(tool)
    result = await run(observed, "echo 0123456789abcdef; sleep 30")
    assert result.timed_out and result.truncated and result.stdout == "0123456789"
    assert "timeout_seconds" not in tool.input_schema["properties"]


def test_registration_launches_nothing(backend, workspace):
    marker = workspace / "launched"
    fake_shell = workspace / "fake-shell"
    fake_shell.write_text(f"#!/bin/sh\ntouch {marker}\n")
    fake_shell.chmod(0o755)
    shell_tool(cwd=str(workspace), shell=str(fake_shell), backend=backend)
    assert not marker.exists()


@pytest.mark.parametrize(("settings", "problem"), [
    ({"cwd": "relative"}, "absolute"),
    ({"cwd": "{workspace}/missing"}, "does not exist"),
    ({"shell": "no-such-shell"}, "not found"),
    ({"shell": "{workspace}/missing-shell"}, "not an executable"),
])
async def test_invalid_settings_fail_before_any_authorization(backend, workspace, settings, problem):
    """On the host backend at registration; a backend elsewhere resolves in its boundary when
    the first call is prepared, still before approval."""
    settings = {"cwd": str(workspace), **{k: v.format(workspace=workspace) for k, v in settings.items()}}
    observed = None
    with pytest.raises(ValueError, match=problem):
        observed = observed_agent(shell_tool(backend=backend, **settings))
        await run(observed, "true")
    assert observed is None or observed.requests == []
