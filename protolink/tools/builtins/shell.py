"""shell_tool: ``run_shell`` runs one command string in a fresh noninteractive shell."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field

from protolink.core.tools import Preparation, PreparedTool, ToolContext
from protolink.execution.backends import ExecutionBackend
from protolink.execution.local import LocalExecutionBackend

from .process import (
    PROCESS_EXECUTE,
    PROCESS_RESULT_SCHEMA,
    ConfiguredCommand,
    arguments_model,
    configured_environment,
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
    backend = backend if backend is not None else LocalExecutionBackend()
    command = ConfiguredCommand(
        backend, shell, cwd=cwd, env=configured_environment(env),
        timeout_seconds=timeout_seconds, max_output_bytes=max_output_bytes,
    )
    arguments = arguments_model(
        "RunShellArguments",
        command=(str, Field(min_length=1, description=(
            "POSIX shell command; pipelines and redirects work. A fresh shell runs each call."))),
    )

    async def prepare(args: Any, context: ToolContext) -> Preparation:
        return await command.prepare(["-c", "--", args.command], (PROCESS_EXECUTE, SHELL_EXECUTE),
                                     title="Run a shell command in {cwd}")

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
