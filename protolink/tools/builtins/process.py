"""process_tool: ``execute_command`` runs an exact argv through an execution backend.

Also the pieces ``shell_tool`` and ``git_tool`` share with it: where commands are resolved,
the approval preview, and :func:`run_process`, which applies the run's live budget and emits
``process.finished``. Backend and result types are public here, as the spec documents.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, create_model

from protolink.core.tools import Artifact, Preparation, PreparedTool, ToolContext
from protolink.errors import BudgetExceededError
from protolink.execution.backends import ExecutionBackend, ProcessBackend, process_backend
from protolink.execution.local import LocalExecutionBackend
from protolink.execution.process_types import (
    ProcessCancelledError,
    ProcessResult,
    ProcessSpec,
)
from protolink.execution.resolve import (
    Resolved,
    check_arguments,
    check_command,
)

__all__ = [
    "ExecutionBackend",
    "LocalExecutionBackend",
    "ProcessCancelledError",
    "ProcessResult",
    "ProcessSpec",
    "process_tool",
]

PROCESS_EXECUTE = "process.execute"

#: JSON schema of a ProcessResult, the output of execute_command, run_shell and git.
PROCESS_RESULT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "exit_code": {"type": ["integer", "null"]},
        "stdout": {"type": "string"},
        "stderr": {"type": "string"},
        "truncated": {"type": "boolean"},
        "timed_out": {"type": "boolean"},
        "canceled": {"type": "boolean"},
        "duration_seconds": {"type": "number"},
        "budget_exceeded": {"type": "boolean"},
    },
    "required": ["exit_code", "stdout", "stderr", "truncated", "timed_out", "canceled",
                 "duration_seconds", "budget_exceeded"],
    "additionalProperties": False,
}

def process_tool(
    *,
    backend: ExecutionBackend | None = None,
    max_timeout_seconds: float = 300,
    max_output_bytes: int = 1048576,
) -> PreparedTool:
    """Create ``execute_command``: run an argv (no implicit shell) after authorization.

    ``max_timeout_seconds`` and ``max_output_bytes`` are ceilings: a call asking for more is
    rejected before authorization. ``backend`` defaults to a new LocalExecutionBackend
    (host execution, not a sandbox). Registration launches nothing.

    The call returns a :class:`ProcessResult`. A nonzero exit is data; so is a timeout
    (``timed_out=True``, ``exit_code`` the negative signal number that ended the process, or
    None if it never reported its end). Cancellation raises :class:`ProcessCancelledError`
    with the partial result.
    """
    check_limits(max_timeout_seconds, max_output_bytes)
    backend = backend if backend is not None else LocalExecutionBackend()
    resolver = process_backend(backend)  # once: a Protocol's isinstance costs more than the rest of a resolve
    arguments = arguments_model(
        "ExecuteCommandArguments",
        argv=(list[str], Field(min_length=1, description=(
            "Program and arguments, run without a shell. argv[0] is an absolute path, an "
            "explicit relative path, or a name found on env's PATH."))),
        cwd=(str, Field(description="Absolute path of an existing working directory.")),
        env=(dict[str, str], Field(description=(
            "The complete environment; nothing is inherited. Include PATH to look names up."))),
        timeout_seconds=(float, Field(min(60, max_timeout_seconds), gt=0, le=max_timeout_seconds,
                                      description="Wall-time limit; the process group is killed.")),
        max_output_bytes=(int, Field(min(65536, max_output_bytes), ge=0, le=max_output_bytes,
                                     description="Cap on stdout and stderr bytes kept, combined.")),
    )

    async def prepare(args: Any, context: ToolContext) -> Preparation:
        resolved = await resolve_on(resolver, args.argv, args.cwd, args.env)
        spec = ProcessSpec(resolved.argv, resolved.cwd, dict(args.env), args.timeout_seconds, args.max_output_bytes,
                           resolved.real_executable)
        return process_preparation(backend, spec, (PROCESS_EXECUTE,))

    return PreparedTool(
        name="execute_command",
        description=(
            "Run a program with an exact argument list, working directory and environment on "
            f"the {backend.boundary} execution backend. Returns exit_code, stdout, stderr and "
            "flags for truncated output, timeout, cancellation and budget."
        ),
        arguments=arguments,
        prepare=prepare,
        capabilities=(PROCESS_EXECUTE,),
        tags=("builtin", "process"),
        output_schema=PROCESS_RESULT_SCHEMA,
    )


def check_limits(timeout_seconds: float, max_output_bytes: int) -> None:
    """Validate application-configured limits (factory arguments)."""
    if not (isinstance(timeout_seconds, (int, float)) and math.isfinite(timeout_seconds)
            and timeout_seconds > 0):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout_seconds!r}")
    if not isinstance(max_output_bytes, int) or isinstance(max_output_bytes, bool) \
            or max_output_bytes < 0:
        raise ValueError(f"max_output_bytes must be an integer >= 0, got {max_output_bytes!r}")


async def resolve_on(
    backend: ProcessBackend, argv: Sequence[str], cwd: str, env: Mapping[str, str]
) -> Resolved:
    """Resolve argv[0], the file it runs and cwd where ``backend`` runs processes (a backend that
    does not resolve gets the host's rules: :func:`~protolink.execution.backends.process_backend`)."""
    check_command(argv, cwd, env)
    return await backend.resolve_command(argv, cwd, env)


def configured_environment(env: Mapping[str, str] | None) -> dict[str, str]:
    """``env=None`` supplies only ``PATH=os.defpath``; a mapping is copied as the whole environment."""
    return {"PATH": os.defpath} if env is None else dict(env)


class ConfiguredCommand:
    """An application-configured executable, directory, environment and limits (shell, git).

    Where the backend resolves at once (the host), the executable and directory are resolved
    now, at registration, without launching anything, and the file the executable runs when
    each call is prepared. A backend elsewhere is only checked now (absolute directory, valid
    environment, limits); it resolves them inside its boundary when each call is prepared,
    still before authorization. The model supplies only the arguments.
    """

    def __init__(self, backend: ExecutionBackend, executable: str, *, cwd: str,
                 env: Mapping[str, str], timeout_seconds: float, max_output_bytes: int) -> None:
        check_limits(timeout_seconds, max_output_bytes)
        check_command([executable], cwd, env)
        self.backend = backend
        self.executable = executable
        self.cwd = cwd
        self.env = dict(env)
        self.timeout_seconds = timeout_seconds
        self.max_output_bytes = max_output_bytes
        self._resolver = process_backend(backend)
        self._resolved = self._resolver.resolve_now([executable], cwd, self.env)

    async def prepare(self, arguments: Sequence[str], capabilities: tuple[str, ...],
                      title: str) -> Preparation:
        """The preparation for ``executable *arguments``; ``{cwd}`` in ``title`` is filled in."""
        if self._resolved is None:
            resolved = await resolve_on(self._resolver, [self.executable, *arguments], self.cwd, self.env)
        else:
            check_arguments(arguments)
            program = self._resolved.argv[0]
            real = await asyncio.to_thread(os.path.realpath, program)  # a symlink may have moved since
            resolved = Resolved((program, *arguments), self._resolved.cwd, real)
        spec = ProcessSpec(resolved.argv, resolved.cwd, self.env, self.timeout_seconds, self.max_output_bytes,
                           resolved.real_executable)
        return process_preparation(self.backend, spec, capabilities,
                                   title=f"{title.format(cwd=resolved.cwd)} ({self.backend.boundary})")


def process_preparation(
    backend: ExecutionBackend, spec: ProcessSpec, capabilities: tuple[str, ...], title: str = ""
) -> Preparation:
    """The authorization-ready action for ``spec``: capabilities, exact preview, execute step."""
    preview = Artifact(
        kind="process",
        title=title or f"Run {spec.argv[0]} ({backend.boundary})",
        content={**spec.to_dict(), "boundary": backend.boundary},
    )
    return Preparation(
        execute=lambda context: run_process(backend, spec, context),
        capabilities=capabilities,
        artifacts=(preview,),
        process=spec.to_dict(),
    )


async def run_process(
    backend: ExecutionBackend, spec: ProcessSpec, context: ToolContext
) -> ProcessResult:
    """Execute an approved spec within the run's remaining time, then emit ``process.finished``.

    When the remaining run budget is shorter than the spec's timeout, it becomes the
    deadline; a process stopped by it has ``timed_out`` and ``budget_exceeded`` set.
    ``process.finished`` carries the result's fields, partial output on cancellation included.
    """
    timeout, limited_by_budget = context.bound_timeout(spec.timeout_seconds)
    if timeout <= 0:
        raise BudgetExceededError(f"run {context.run_id} has no time left to start a process")
    try:
        result = await backend.execute(dataclasses.replace(spec, timeout_seconds=timeout), context)
    except ProcessCancelledError as cancel:
        await asyncio.shield(context.emit("process.finished", **cancel.result.to_dict()))
        raise
    if limited_by_budget and result.timed_out:
        result = dataclasses.replace(result, budget_exceeded=True)
    await context.emit("process.finished", **result.to_dict())
    return result


def arguments_model(name: str, **fields: Any) -> type[BaseModel]:
    """A closed (extra="forbid") pydantic arguments model built at factory time."""
    return create_model(name, __config__=ConfigDict(extra="forbid"), **fields)
