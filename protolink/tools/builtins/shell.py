"""shell_tool: ``run_shell`` runs one command string in a fresh noninteractive shell."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from pydantic import Field

from protolink.core.tools import Preparation, PreparedTool, ToolContext
from protolink.execution.process import ExecutionBackend, ProcessSpec
from protolink.execution.local import LocalExecutionBackend

from .process import (
    PROCESS_EXECUTE,
    PROCESS_RESULT_SCHEMA,
    arguments_model,
    bind_command,
    check_limits,
    process_preparation,
)

SHELL_EXECUTE = "shell.execute"


def shell_tool(
    *,
    cwd: str,
    env: Mapping[str, str] | None = None,
    shell: str = "/bin/sh",
    timeout_seconds: float = 60,
    max_output_bytes: int = 65536,
    backend: ExecutionBackend | None = None,
) -> PreparedTool:
    """Create ``run_shell``: each call runs ``[shell, "-c", "--", command]`` in ``cwd``.

    The application owns every setting; the model supplies only the command. ``env=None``
    supplies only ``PATH=os.defpath``; a mapping is the complete, copied environment. The
    directory and shell are resolved at registration on the host backend (nothing is
    launched). ``--`` ends the shell's own options, so a command starting with ``-`` or
    ``+`` is still the command. Pipelines, redirects and ordinary shell syntax work; state
    does not persist between calls. ``cwd`` is not an access boundary.
    """
    check_limits(timeout_seconds, max_output_bytes)
    environment = {"PATH": os.defpath} if env is None else dict(env)
    backend = backend if backend is not None else LocalExecutionBackend()
    complete = bind_command(backend, shell, cwd, environment)
    arguments = arguments_model(
        "RunShellArguments",
        command=(str, Field(min_length=1, description=(
            "POSIX shell command; pipelines and redirects work. Runs in a fresh shell each call."))),
    )

    async def prepare(args: Any, context: ToolContext) -> Preparation:
        argv, directory = await complete(["-c", "--", args.command])
        spec = ProcessSpec(argv, directory, environment, timeout_seconds, max_output_bytes)
        return process_preparation(backend, spec, (PROCESS_EXECUTE, SHELL_EXECUTE),
                                   title=f"Run a shell command in {directory} ({backend.boundary})")

    return PreparedTool(
        name="run_shell",
        description=(
            "Run a POSIX shell command (pipelines, redirects) in a fresh noninteractive shell "
            "in the configured directory. Returns exit_code, stdout, stderr and limit flags."
        ),
        arguments=arguments,
        prepare=prepare,
        capabilities=(PROCESS_EXECUTE, SHELL_EXECUTE),
        tags=("builtin", "process", "shell"),
        output_schema=PROCESS_RESULT_SCHEMA,
    )
