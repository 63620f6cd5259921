"""Fixtures for tests against real sandbox containers: running one command."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import pytest

from protolink.execution.process_types import NO_EVENTS, ProcessResult, ProcessSpec

COMMAND_ENV = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}

Run = Callable[..., Awaitable[ProcessResult]]


@pytest.fixture(scope="session")
def run() -> Run:
    """``await run(backend, argv, cwd=..., timeout=...)``: one command through ``backend.execute``."""

    async def run(backend: Any, argv: list[str], *, cwd: str = "/tmp", timeout: float = 30,
                  max_output_bytes: int = 1 << 20, env: Mapping[str, str] = COMMAND_ENV) -> ProcessResult:
        spec = ProcessSpec(tuple(argv), cwd, dict(env), timeout, max_output_bytes)
        return await backend.execute(spec, NO_EVENTS)

    return run
