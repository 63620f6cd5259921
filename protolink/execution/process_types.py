"""Process execution types shared by every backend: what to run, where its output goes, and
what happened."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class ProcessSpec:
    """An exact process to run: argv (argv[0] resolved), cwd, the complete environment,
    a timeout in seconds and a cap on combined stdout+stderr bytes kept and emitted.

    ``real_executable``, when set, is the file argv[0] resolved to before approval (its real
    path): the backend starts nothing unless argv[0] still resolves to it.
    """

    argv: tuple[str, ...]
    cwd: str
    env: Mapping[str, str]
    timeout_seconds: float
    max_output_bytes: int
    real_executable: str | None = None

    def to_dict(self) -> dict[str, Any]:
        described: dict[str, Any] = {
            "argv": list(self.argv),
            "cwd": self.cwd,
            "env": dict(self.env),
            "timeout_seconds": self.timeout_seconds,
            "max_output_bytes": self.max_output_bytes,
        }
        if self.real_executable is not None:
            described["real_executable"] = self.real_executable
        return described


@dataclass(frozen=True)
class ProcessResult:
    """What a process did. A nonzero exit or a timeout is data, not an exception."""

    exit_code: int | None
    stdout: str
    stderr: str
    truncated: bool = False
    timed_out: bool = False
    canceled: bool = False
    duration_seconds: float = 0.0
    budget_exceeded: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "exit_code": self.exit_code,
            "stdout": self.stdout,
            "stderr": self.stderr,
            "truncated": self.truncated,
            "timed_out": self.timed_out,
            "canceled": self.canceled,
            "duration_seconds": self.duration_seconds,
            "budget_exceeded": self.budget_exceeded,
        }


class Emitter(Protocol):
    """Where a process's output events go: a tool call's context, the sandbox server's event
    stream, or anything else with this one method."""

    async def emit(self, type: str, **data: Any) -> None: ...


class _NoEvents:
    async def emit(self, type: str, **data: Any) -> None:
        return None


#: An Emitter that drops every event: for a caller that wants only the result.
NO_EVENTS: Emitter = _NoEvents()


class ProcessCancelledError(asyncio.CancelledError):
    """Cancellation of a running process; ``result`` holds the partial output."""

    def __init__(self, result: ProcessResult) -> None:
        super().__init__("process canceled")
        self.result = result
