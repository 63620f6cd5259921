"""What the calendar and email tool bundles share: previews, timestamps and bounded awaits."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from typing import Any

from protolink import deadlines
from protolink.core.tools import Artifact, Preparation, ToolContext, jsonable
from protolink.errors import ToolExecutionError

from ._budget import within_budget

BUILTIN_TAGS = ("builtin", "service")
MAX_TOKEN_CHARS = 8192  # page tokens are opaque; signed Graph links are the longest


def target_of(backend: object) -> dict[str, Any]:
    """The configured target a backend names for previews (never its credentials)."""
    describe = getattr(backend, "describe_target", None)
    if callable(describe):
        return dict(describe())
    return {"backend": type(backend).__name__}


def request_preview(backend: object, operation: str, arguments: Mapping[str, Any]) -> Artifact:
    """The approval preview of one service call: its configured target and exact arguments."""
    return Artifact(
        kind="service_request",
        title=f"{operation} on {target_of(backend).get('service', type(backend).__name__)}",
        content={"target": target_of(backend), "operation": operation, "arguments": jsonable(arguments)},
    )


def parse_instant(value: str, field: str) -> datetime:
    """An ISO 8601 timestamp with an explicit UTC offset, or ValueError naming ``field``."""
    text = value.strip()
    try:
        instant = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{field} must be an ISO 8601 timestamp such as 2025-03-01T09:00:00+01:00, "
                         f"not {value!r}") from None
    if "T" not in text.upper() or instant.tzinfo is None or instant.utcoffset() is None:
        raise ValueError(f"{field} must be an ISO 8601 timestamp with an explicit offset "
                         f"(e.g. +02:00 or Z), not {value!r}")
    return instant


def check_interval(start: str, end: str) -> tuple[datetime, datetime]:
    """Both timestamps parsed; ValueError unless end follows start."""
    begin, finish = parse_instant(start, "start"), parse_instant(end, "end")
    if finish <= begin:
        raise ValueError(f"end ({end}) must follow start ({start})")
    return begin, finish


def describe_tool(base: str, backend: object) -> str:
    """A tool description extended by the backend's optional ``query_help``."""
    help_text = getattr(backend, "query_help", None)
    if isinstance(help_text, str) and help_text.strip():
        return f"{base} Query syntax: {help_text.strip()}"
    return base


async def call_bounded(ctx: ToolContext, timeout_seconds: float, operation: str,
                       start: Callable[[], Awaitable[Any]]) -> dict[str, Any]:
    """Await ``start()`` within ``timeout_seconds`` and the run's remaining budget.

    A timed-out or canceled write may already have happened remotely.
    """

    async def bounded(timeout: float) -> Any:
        deadline = deadlines.timeout(timeout)
        try:
            async with deadline:
                return await start()
        except TimeoutError:
            if not deadline.expired():
                raise
        raise TimeoutError(f"{operation} did not finish within {timeout:g} seconds; "
                           "a write may already have happened remotely")

    result = await within_budget(ctx, timeout_seconds, operation, bounded)
    if not isinstance(result, Mapping):
        raise ToolExecutionError(f"{operation}: the backend returned {type(result).__name__}, "
                                 "expected a JSON-compatible dictionary")
    return jsonable(result)


def require_method(backend: object, method: str) -> None:
    """TypeError unless ``backend`` implements ``method`` (checked when a bundle is built)."""
    if not callable(getattr(backend, method, None)):
        raise TypeError(f"{type(backend).__name__} has no {method}() method")


def service_preparation(backend: object, method: str, call: Mapping[str, Any], *, tool: str,
                        capability: str, timeout_seconds: float) -> Preparation:
    """The authorized action of one service tool: ``backend.<method>(**call)``, bounded, with its
    target and exact arguments as the preview."""

    async def execute(ctx: ToolContext) -> dict[str, Any]:
        return await call_bounded(ctx, timeout_seconds, tool, lambda: getattr(backend, method)(**call))

    return Preparation(execute=execute, capabilities=(capability,),
                       artifacts=(request_preview(backend, method, call),))
