"""execute_command and run_shell preparation: ceilings, exact previews, resolution, budgets."""

from __future__ import annotations

import os
import sys

import pytest

from protolink import BudgetExceededError, EventBus, RunContext, ToolContext
from protolink.execution.backends import process_backend
from protolink.execution.process_types import (
    ProcessCancelledError,
    ProcessResult,
    ProcessSpec,
)
from protolink.execution.resolve import Resolved
from protolink.tools.builtins import process_tool, shell_tool
from protolink.tools.builtins.process import resolve_on, run_process


class RecordingBackend:
    """A backend elsewhere: it records what it is asked and answers with a fixed outcome."""

    boundary = "test:recording"

    def __init__(self, result: ProcessResult | None = None, cancel: bool = False) -> None:
        self.result = result or ProcessResult(0, "done\n", "")
        self.cancel = cancel
        self.specs: list[ProcessSpec] = []

    async def execute(self, spec: ProcessSpec, execution) -> ProcessResult:
        self.specs.append(spec)
        if self.cancel:
            raise ProcessCancelledError(ProcessResult(None, "partial", "", canceled=True))
        return self.result


class ResolvingBackend(RecordingBackend):
    """A backend that resolves commands inside its own boundary."""

    def __init__(self) -> None:
        super().__init__()
        self.resolved: list[tuple] = []

    async def resolve_command(self, argv, cwd, env):
        self.resolved.append((tuple(argv), cwd, dict(env)))
        return Resolved(("/inside/" + argv[0], *argv[1:]), "/inside" + cwd, "/inside/real/" + argv[0])

    def resolve_now(self, argv, cwd, env):
        return None


def context(run: RunContext | None = None) -> tuple[ToolContext, list]:
    bus, events = EventBus(), []
    bus.add_sink(events.append)
    return ToolContext(run or RunContext(), "act_test", bus), events


async def prepare(tool, **arguments):
    ctx, _ = context()
    return await tool.prepare(tool.validate(arguments), ctx)


@pytest.mark.parametrize(("options", "problem"), [
    ({"max_timeout_seconds": 0}, "positive"),
    ({"max_timeout_seconds": float("inf")}, "positive"),
    ({"max_output_bytes": -1}, ">= 0"),
    ({"max_output_bytes": 1.5}, "integer"),
])
def test_factory_limits_are_validated(options, problem):
    with pytest.raises(ValueError, match=problem):
        process_tool(**options)


def test_schema_advertises_ceilings_and_caps_defaults_by_them():
    properties = process_tool().input_schema["properties"]
    assert properties["timeout_seconds"]["maximum"] == 300
    assert properties["timeout_seconds"]["default"] == 60
    assert properties["max_output_bytes"]["maximum"] == 1048576
    assert properties["max_output_bytes"]["default"] == 65536
    low = process_tool(max_timeout_seconds=10, max_output_bytes=1000).input_schema["properties"]
    assert (low["timeout_seconds"]["default"], low["max_output_bytes"]["default"]) == (10, 1000)
    assert set(process_tool().input_schema["required"]) == {"argv", "cwd", "env"}


def test_tool_identity_capabilities_and_output_schema():
    tool = process_tool()
    assert tool.name == "execute_command"
    assert tool.capabilities == ("process.execute",)
    assert tool.output_schema["required"][0] == "exit_code"


async def test_preparation_resolves_and_previews_without_launching(tmp_path):
    preparation = await prepare(process_tool(), argv=["python3", "-c", "pass"], cwd=str(tmp_path),
                                env={"PATH": os.path.dirname(sys.executable)}, timeout_seconds=2)
    python3 = os.path.join(os.path.dirname(sys.executable), "python3")
    spec = {
        "argv": [python3, "-c", "pass"],
        "cwd": str(tmp_path),
        "env": {"PATH": os.path.dirname(sys.executable)},
        "timeout_seconds": 2,
        "max_output_bytes": 65536,
        "real_executable": os.path.realpath(python3),  # python3 is a symbolic link to python3.11
    }
    assert preparation.capabilities == ("process.execute",)
    assert preparation.process == spec
    [artifact] = preparation.artifacts
    assert artifact.kind == "process" and artifact.content == {**spec, "boundary": "host"}


async def test_backends_that_resolve_do_so_inside_their_boundary(tmp_path):
    backend = ResolvingBackend()
    preparation = await prepare(process_tool(backend=backend), argv=["tool", "x"], cwd="/work",
                                env={"A": "1"})
    assert backend.resolved == [(("tool", "x"), "/work", {"A": "1"})]
    assert preparation.process["argv"] == ["/inside/tool", "x"]
    assert preparation.process["real_executable"] == "/inside/real/tool"
    assert preparation.artifacts[0].content["boundary"] == "test:recording"
    assert preparation.artifacts[0].content["real_executable"] == "/inside/real/tool"


async def test_other_backends_get_the_host_rules(tmp_path):
    with pytest.raises(ValueError, match="no PATH"):
        await resolve_on(process_backend(RecordingBackend()), ["python3"], str(tmp_path), {})
    resolved = await resolve_on(process_backend(RecordingBackend()), [sys.executable], str(tmp_path), {})
    assert resolved == Resolved((sys.executable,), str(tmp_path), os.path.realpath(sys.executable))


async def test_run_process_bounds_the_timeout_by_the_remaining_budget():
    spec = ProcessSpec(("/bin/true",), "/", {}, 60, 10)
    timed_out = RecordingBackend(ProcessResult(-15, "", "", timed_out=True))
    ctx, events = context(RunContext(max_seconds=30))
    result = await run_process(timed_out, spec, ctx)
    assert 0 < timed_out.specs[0].timeout_seconds <= 30
    assert result.timed_out and result.budget_exceeded
    assert events[-1].type == "process.finished" and events[-1].data["budget_exceeded"] is True


async def test_own_timeout_is_not_reported_as_the_budget():
    spec = ProcessSpec(("/bin/true",), "/", {}, 5, 10)
    backend = RecordingBackend(ProcessResult(-15, "", "", timed_out=True))
    ctx, _ = context(RunContext(max_seconds=300))
    result = await run_process(backend, spec, ctx)
    assert backend.specs[0].timeout_seconds == 5
    assert result.timed_out and not result.budget_exceeded


async def test_run_process_refuses_to_launch_without_time_left():
    now = [0.0]
    run = RunContext(max_seconds=1, clock=lambda: now[0])
    now[0] = 2.0
    backend = RecordingBackend()
    with pytest.raises(BudgetExceededError):
        await run_process(backend, ProcessSpec(("/bin/true",), "/", {}, 5, 10), context(run)[0])
    assert backend.specs == []


async def test_cancellation_reports_the_partial_result_in_process_finished():
    ctx, events = context()
    with pytest.raises(ProcessCancelledError) as raised:
        await run_process(RecordingBackend(cancel=True), ProcessSpec(("/bin/true",), "/", {}, 5, 10), ctx)
    assert raised.value.result.stdout == "partial"
    [finished] = events
    assert finished.type == "process.finished" and finished.data["canceled"] is True
    assert finished.data["stdout"] == "partial"


async def test_shell_invocation_and_default_environment(tmp_path):
    tool = shell_tool(cwd=str(tmp_path), timeout_seconds=3, max_output_bytes=99)
    assert tool.capabilities == ("process.execute", "shell.execute")
    assert set(tool.input_schema["properties"]) == {"command"}
    preparation = await prepare(tool, command="echo hi | cat")
    assert preparation.process == {
        "argv": ["/bin/sh", "-c", "--", "echo hi | cat"],
        "cwd": str(tmp_path),
        "env": {"PATH": os.defpath},
        "timeout_seconds": 3,
        "max_output_bytes": 99,
        "real_executable": os.path.realpath("/bin/sh"),
    }
    with pytest.raises(ValueError, match="NUL"):
        await prepare(tool, command="echo \0")


async def test_shell_on_a_backend_elsewhere_resolves_there_per_call():
    backend = ResolvingBackend()
    tool = shell_tool(cwd="/not/on/this/host", backend=backend)
    assert backend.resolved == []  # nothing can be checked on this host
    preparation = await prepare(tool, command="ls")
    assert preparation.process["argv"] == ["/inside//bin/sh", "-c", "--", "ls"]
    assert backend.resolved == [(("/bin/sh", "-c", "--", "ls"), "/not/on/this/host", {"PATH": os.defpath})]


def test_shell_factory_validates_settings_at_registration(tmp_path):
    with pytest.raises(ValueError, match="positive"):
        shell_tool(cwd=str(tmp_path), timeout_seconds=-1)
    with pytest.raises(ValueError, match="does not exist"):
        shell_tool(cwd=str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="not found"):
        shell_tool(cwd=str(tmp_path), shell="sh", env={"PATH": str(tmp_path)})
    with pytest.raises(ValueError, match="absolute"):
        shell_tool(cwd="relative", backend=ResolvingBackend())  # checked even for a backend elsewhere
