"""Approval requests shown to a human, and the decisions that come back."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .ids import new_id

if TYPE_CHECKING:
    from .runs import RunContext
    from .tools import Action


@dataclass(frozen=True)
class ApprovalRequest:
    """What a human is asked to approve: the exact action, its capabilities and previews."""

    action: Action
    capabilities: tuple[str, ...]
    run_id: str | None
    task_id: str | None
    action_id: str
    request_id: str = field(default_factory=lambda: new_id("apr"))

    @property
    def artifacts(self) -> tuple[Any, ...]:
        return self.action.artifacts

    def to_dict(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "action": self.action.to_dict(),
            "capabilities": list(self.capabilities),
            "run_id": self.run_id,
            "task_id": self.task_id,
            "action_id": self.action_id,
        }


@dataclass(frozen=True)
class ApprovalDecision:
    """A human's answer to one ApprovalRequest, identified by its request_id."""

    approved: bool
    request_id: str
    reason: str | None = None
    approver: str | None = None


ApprovalHandler = Callable[
    [ApprovalRequest, "RunContext"], Awaitable["ApprovalDecision | bool"]
]
