"""ScriptedModel: replays a fixed script, for offline examples and tests."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Union

from protolink.core.models import Message, ModelResponse

Step = Union[ModelResponse, str, Callable[[Sequence[Message]], "ModelResponse | str | Awaitable[ModelResponse | str]"]]


class ScriptedModel:
    """A model whose steps are given in advance.

    Each step is a :class:`ModelResponse`, a plain string (final text), or a callable that
    receives the history so far and returns either; callables show how a real model would
    continue from tool results. Running past the end of the script raises ``RuntimeError``.
    """

    def __init__(self, steps: Iterable[Step]) -> None:
        self._steps = list(steps)
        self.calls: list[list[Message]] = []

    async def complete(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> ModelResponse:
        if len(self.calls) >= len(self._steps):
            raise RuntimeError(f"the script has only {len(self._steps)} steps")
        step = self._steps[len(self.calls)]
        self.calls.append(list(messages))
        if callable(step):
            step = step(messages)
            if inspect.isawaitable(step):
                step = await step
        return ModelResponse(text=step) if isinstance(step, str) else step
