"""Conversions between wire messages and the plain types of :mod:`protolink.execution`.

Both ends use these functions: the host client to build requests and read answers, the
sandbox server to read requests and build answers. Decoding checks shapes and bounds and
raises ValueError; the client reports that as a protocol error (the answer is untrusted), the
server as ``INVALID_ARGUMENT`` (the request is malformed). The semantics themselves (path
rules, limits, extraction) stay in :mod:`protolink.execution`.

The workspace and document operations' messages are converted in
:mod:`protolink.wire.operation_convert`, which loads with the operations' table: the sandbox
server's start, which a cold sandbox's first command waits for, needs none of their types.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

from google.protobuf.message import DecodeError, Message

from protolink.execution.output import Channel
from protolink.execution.process_types import ProcessSpec
from protolink.execution.resolve import Resolved

from ._pb import process_pb2 as process

M = TypeVar("M", bound=Message)

#: A process exit code or the negative number of the signal that ended it.
EXIT_CODES = range(-255, 256)
CHANNELS: dict[int, Channel] = {process.CHANNEL_STDOUT: "stdout", process.CHANNEL_STDERR: "stderr"}
CHANNEL_NUMBERS = {name: number for number, name in CHANNELS.items()}


def parse(cls: type[M], data: bytes) -> M:
    """A ``cls`` message from ``data``; ValueError when the bytes are not one."""
    try:
        return cls.FromString(data)
    except DecodeError:
        raise ValueError(f"malformed {cls.DESCRIPTOR.name}") from None


def require(condition: bool, problem: str) -> None:
    """ValueError(``problem``) unless ``condition`` holds."""
    if not condition:
        raise ValueError(problem)


def beneath(path: str, roots: Iterable[str]) -> bool:
    """True when ``path`` is one of ``roots`` or lies beneath one, compared component-wise."""
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def count(value: int, what: str) -> int:
    """``value``; ValueError naming ``what`` when it is negative."""
    require(value >= 0, f"{what} must not be negative")
    return value


def _finite(value: float, what: str) -> float:
    require(math.isfinite(value) and value >= 0, f"{what} must be a finite number >= 0")
    return value


# Processes ---------------------------------------------------------------------------------


def execute_request(spec: ProcessSpec, written: tuple[str, str] | None = None) -> process.ExecuteRequest:
    """The request for ``spec``; ``written`` is the (argv[0], cwd) it was resolved from, to check again."""
    resolved_from = process.CommandAsWritten(executable=written[0], cwd=written[1]) if written else None
    return process.ExecuteRequest(
        argv=spec.argv,
        cwd=spec.cwd,
        env=dict(spec.env),
        timeout_seconds=spec.timeout_seconds,
        max_output_bytes=spec.max_output_bytes,
        resolved_from=resolved_from,
        real_executable=spec.real_executable or "",
    )


def process_spec(request: process.ExecuteRequest) -> ProcessSpec:
    require(len(request.argv) > 0, "argv must contain at least the executable")
    require(request.cwd.startswith("/"), "cwd must be an absolute path")
    require(math.isfinite(request.timeout_seconds) and request.timeout_seconds > 0,
            "timeout_seconds must be a positive finite number")
    require(not request.real_executable or request.real_executable.startswith("/"),
            "real_executable must be an absolute path")
    return ProcessSpec(
        argv=tuple(request.argv),
        cwd=request.cwd,
        env=dict(request.env),
        timeout_seconds=request.timeout_seconds,
        max_output_bytes=count(request.max_output_bytes, "max_output_bytes"),
        real_executable=request.real_executable or None,
    )


def command_as_written(request: process.ExecuteRequest) -> tuple[str, str] | None:
    """The (argv[0], cwd) the request's command was resolved from, when it asks for a check."""
    if not request.HasField("resolved_from"):
        return None
    written = request.resolved_from
    require(written.cwd.startswith("/"), "resolved_from.cwd must be an absolute path")
    return written.executable, written.cwd


def finished_facts(finished: process.Finished) -> dict[str, Any]:
    """The ProcessResult fields a Finished event carries (everything but the output)."""
    exit_code = finished.exit_code if finished.HasField("exit_code") else None
    require(exit_code is None or exit_code in EXIT_CODES, f"exit code {exit_code} is out of range")
    return {
        "exit_code": exit_code,
        "truncated": finished.truncated,
        "timed_out": finished.timed_out,
        "canceled": finished.canceled,
        "duration_seconds": _finite(finished.duration_seconds, "duration_seconds"),
    }


def resolve_request(argv: Sequence[str], cwd: str, env: Mapping[str, str]) -> process.ResolveCommandRequest:
    return process.ResolveCommandRequest(argv=argv, cwd=cwd, env=dict(env))


def resolved_command(response: process.ResolveCommandResponse, argv: Sequence[str]) -> Resolved:
    """The resolved command; only argv[0] may differ from the request, and paths are absolute."""
    resolved = tuple(response.argv)
    require(len(resolved) == len(argv) and resolved[1:] == tuple(argv[1:]),
            "the resolved argv must differ from the request only in argv[0]")
    require(all(path.startswith("/") for path in (resolved[0], response.cwd, response.real_executable)),
            "the resolved executable, its real path and the directory must be absolute paths")
    return Resolved(resolved, response.cwd, response.real_executable)


def resolve_response(resolved: Resolved) -> process.ResolveCommandResponse:
    return process.ResolveCommandResponse(argv=resolved.argv, cwd=resolved.cwd,
                                          real_executable=resolved.real_executable)
