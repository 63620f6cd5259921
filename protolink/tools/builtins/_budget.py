"""Timeouts of tool calls, cut to the run's remaining time budget."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from protolink.core.tools import ToolContext
from protolink.errors import BudgetExceededError

T = TypeVar("T")


async def within_budget(ctx: ToolContext, timeout_seconds: float, operation: str,
                        call: Callable[[float], Awaitable[T]]) -> T:
    """Await ``call(timeout)``, where ``timeout`` is ``timeout_seconds`` cut to the run's budget.

    ``call`` applies the timeout and raises TimeoutError when it expires; when the run's
    budget was the tighter bound, that expiry becomes BudgetExceededError.
    """
    timeout, limited_by_budget = ctx.bound_timeout(timeout_seconds)
    if timeout <= 0:
        raise BudgetExceededError(f"run {ctx.run_id} exhausted its time budget before {operation}")
    try:
        return await call(timeout)
    except TimeoutError:
        if limited_by_budget:
            raise BudgetExceededError(f"run {ctx.run_id} exhausted its time budget during {operation}") from None
        raise
