"""The model protocol: messages and tool schemas in, text or tool calls out.

The runtime owns this interface, as it owns the inference loop (:mod:`.inference`); model
implementations (an OpenAI-compatible client, a scripted model) are in :mod:`protolink.llm`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

Role = Literal["system", "user", "assistant", "tool"]


@dataclass(frozen=True)
class ToolCall:
    """One tool call a model asked for."""

    id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Message:
    """One entry of the conversation history."""

    role: Role
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            data["tool_calls"] = [
                {"id": call.id, "name": call.name, "arguments": call.arguments} for call in self.tool_calls
            ]
        if self.tool_call_id is not None:
            data["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            data["name"] = self.name
        return data


@dataclass(frozen=True)
class ModelResponse:
    """A model step: final text, or tool calls to run before the next step."""

    text: str = ""
    tool_calls: tuple[ToolCall, ...] = field(default_factory=tuple)


@runtime_checkable
class Model(Protocol):
    """Anything that produces the next step from the history and the tool schemas."""

    async def complete(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> ModelResponse: ...
