"""RunContext: the live state of one run, its budgets and its lifecycle."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal

from protolink.errors import BudgetExceededError

from .ids import new_id

RunStatus = Literal["working", "completed", "failed", "canceled"]


class RunContext:
    """Budgets and identity shared by every call that is given the same context.

    ``max_tool_calls`` bounds the tool calls that reach execution; ``max_seconds`` bounds the
    wall time since the context was created: approvals and model steps are stopped when it is
    spent, built-in tools bound their own waits by it, and a tool of your own does the same with
    ``ToolContext.bound_timeout``. A child context (delegation) counts its calls against its
    parent too and never outlives it.
    """

    def __init__(
        self,
        *,
        run_id: str | None = None,
        task_id: str | None = None,
        max_tool_calls: int | None = None,
        max_seconds: float | None = None,
        parent: RunContext | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_tool_calls is not None and max_tool_calls < 0:
            raise ValueError("max_tool_calls must be >= 0")
        if max_seconds is not None and max_seconds <= 0:
            raise ValueError("max_seconds must be > 0")
        self.run_id = run_id or (parent.run_id if parent else new_id("run"))
        self.task_id = task_id
        self.max_tool_calls = max_tool_calls
        self.max_seconds = max_seconds
        self.parent = parent
        self.tool_calls = 0
        self.status: RunStatus = "working"
        self._clock = clock
        self._started = clock()

    def child(self, *, task_id: str | None = None, max_tool_calls: int | None = None,
              max_seconds: float | None = None) -> RunContext:
        """A delegated context whose calls also count against this one."""
        return RunContext(task_id=task_id, max_tool_calls=max_tool_calls, max_seconds=max_seconds,
                          parent=self, clock=self._clock)

    @property
    def elapsed_seconds(self) -> float:
        return self._clock() - self._started

    def remaining_seconds(self) -> float | None:
        """Wall time left in this run (and its parents), or None when unbounded."""
        own = None if self.max_seconds is None else self.max_seconds - self.elapsed_seconds
        inherited = self.parent.remaining_seconds() if self.parent else None
        candidates = [value for value in (own, inherited) if value is not None]
        return min(candidates) if candidates else None

    def check_time(self) -> None:
        """Raise BudgetExceededError when the wall-time budget is spent."""
        remaining = self.remaining_seconds()
        if remaining is not None and remaining <= 0:
            raise BudgetExceededError(
                f"run {self.run_id} exhausted its time budget ({self._limit_text('max_seconds')})"
            )

    def begin_tool_call(self) -> None:
        """Check every budget, then count one tool call here and in every parent."""
        self.check_time()
        context: RunContext | None = self
        while context is not None:
            if context.max_tool_calls is not None and context.tool_calls >= context.max_tool_calls:
                raise BudgetExceededError(
                    f"run {context.run_id} exhausted its tool-call budget "
                    f"({context.max_tool_calls} calls)"
                )
            context = context.parent
        context = self
        while context is not None:
            context.tool_calls += 1
            context = context.parent

    def bound_timeout(self, timeout: float) -> tuple[float, bool]:
        """``timeout`` limited by the remaining budget, and whether the budget is the limit."""
        remaining = self.remaining_seconds()
        if remaining is not None and remaining < timeout:
            return max(remaining, 0.0), True
        return timeout, False

    def _limit_text(self, name: str) -> str:
        limits = [f"{getattr(c, name)}" for c in self._lineage() if getattr(c, name) is not None]
        return f"{name}={', '.join(limits)}"

    def _lineage(self) -> list[RunContext]:
        chain, context = [], self
        while context is not None:
            chain.append(context)
            context = context.parent
        return chain
