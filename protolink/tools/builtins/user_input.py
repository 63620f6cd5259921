"""ask_user: the model asks the application's user a question and continues with the answer.

The tool awaits an application callback with a :class:`UserInputRequest` and returns a
:class:`UserInputResult`; inside the inference loop that result enters the tool history before
the next model step. Events: ``user_input.requested`` (request), ``user_input.answered`` /
``user_input.declined`` (result), ``user_input.timed_out`` / ``user_input.canceled`` /
``user_input.failed`` (request id).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

from protolink import deadlines
from protolink.core.ids import new_id
from protolink.core.tools import Artifact, Preparation, PreparedTool, ToolContext
from protolink.errors import BudgetExceededError

MAX_QUESTION_CHARS = 8_000
MAX_OPTIONS = 10
MAX_OPTION_CHARS = 500
DEFAULT_TIMEOUT_SECONDS = 300.0
DEFAULT_MAX_ANSWER_CHARS = 16_384

UserInputStatus = Literal["answered", "declined", "timed_out"]


@dataclass(frozen=True)
class UserInputRequest:
    """A question for the user; ids correlate simultaneous questions but authenticate nobody."""

    request_id: str
    question: str
    options: tuple[str, ...] = ()
    run_id: str | None = None
    task_id: str | None = None
    action_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "question": self.question,
            "options": list(self.options),
            "run_id": self.run_id,
            "task_id": self.task_id,
            "action_id": self.action_id,
        }


@dataclass(frozen=True)
class UserInputResult:
    """The outcome: ``answered`` keeps the exact answer; ``declined`` and ``timed_out`` have none."""

    request_id: str
    status: UserInputStatus
    answer: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"request_id": self.request_id, "status": self.status, "answer": self.answer}


UserInputCallback = Callable[[UserInputRequest], Awaitable[str | None]]


def _nonblank(text: str) -> str:
    if not text.strip():
        raise ValueError("must not be blank")
    return text


def _distinct(options: list[str] | None) -> list[str] | None:
    if options is not None and len(set(options)) != len(options):
        raise ValueError("options must be distinct")
    return options


class AskUserArguments(BaseModel):
    """Arguments of ``ask_user``."""

    model_config = ConfigDict(extra="forbid")

    question: Annotated[str, StringConstraints(max_length=MAX_QUESTION_CHARS), AfterValidator(_nonblank)] = Field(
        description="The question for the user"
    )
    options: Annotated[
        list[Annotated[str, StringConstraints(max_length=MAX_OPTION_CHARS), AfterValidator(_nonblank)]] | None,
        Field(max_length=MAX_OPTIONS),
        AfterValidator(_distinct),
    ] = Field(None, description="Suggested answers; the user may still answer freely")


OUTPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "request_id": {"type": "string"},
        "status": {"enum": ["answered", "declined", "timed_out"]},
        "answer": {"type": ["string", "null"]},
    },
    "required": ["request_id", "status", "answer"],
    "additionalProperties": False,
}


def ask_user_tool(
    callback: UserInputCallback,
    *,
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
    max_answer_chars: int = DEFAULT_MAX_ANSWER_CHARS,
) -> PreparedTool:
    """The ``ask_user`` tool (``user.interact``), answered by the async ``callback``.

    The callback receives a :class:`UserInputRequest` and returns nonblank text of at most
    ``max_answer_chars`` characters, or None to decline. It is given ``timeout_seconds``, bounded
    by the remaining run budget: a question timeout returns status ``timed_out``, an exhausted run
    budget raises BudgetExceededError. A callback exception or invalid answer is a tool failure
    (RuntimeError); canceling the task interrupts the callback.
    """
    if not callable(callback):
        raise TypeError("callback must be an async callable taking a UserInputRequest")
    if not timeout_seconds > 0:
        raise ValueError("timeout_seconds must be > 0")
    if max_answer_chars < 1:
        raise ValueError("max_answer_chars must be >= 1")

    async def prepare(args: AskUserArguments, context: ToolContext) -> Preparation:
        options = tuple(args.options or ())
        preview = Artifact("question", "Question for the user", {"question": args.question, "options": list(options)})

        async def execute(ctx: ToolContext) -> UserInputResult:
            request = UserInputRequest(new_id("uir"), args.question, options, ctx.run_id, ctx.task_id, ctx.action_id)
            return await _ask(callback, request, ctx, timeout_seconds, max_answer_chars)

        return Preparation(execute=execute, capabilities=("user.interact",), artifacts=(preview,))

    return PreparedTool(
        name="ask_user",
        description=(
            "Ask the user a question and wait for the answer. Options are suggestions; the user "
            "may answer freely or decline."
        ),
        arguments=AskUserArguments,
        prepare=prepare,
        capabilities=("user.interact",),
        tags=("builtin", "user", "interactive"),
        output_schema=OUTPUT_SCHEMA,
    )


async def _ask(
    callback: UserInputCallback,
    request: UserInputRequest,
    ctx: ToolContext,
    timeout_seconds: float,
    max_answer_chars: int,
) -> UserInputResult:
    await ctx.emit("user_input.requested", request=request.to_dict())
    timeout, limited_by_budget = ctx.bound_timeout(timeout_seconds)
    scope = deadlines.timeout(timeout)
    try:
        async with scope:
            pending = callback(request)
            if not inspect.isawaitable(pending):
                raise TypeError("the callback must be async (it returned a plain value)")
            answer = await pending
    except asyncio.CancelledError:
        await asyncio.shield(ctx.emit("user_input.canceled", request_id=request.request_id))
        raise
    except Exception as error:
        if isinstance(error, TimeoutError) and scope.expired():
            await ctx.emit("user_input.timed_out", request_id=request.request_id)
            if limited_by_budget:
                raise BudgetExceededError(
                    f"run {ctx.run_id} exhausted its time budget while awaiting the user's answer"
                ) from None
            return UserInputResult(request.request_id, "timed_out")
        await ctx.emit("user_input.failed", request_id=request.request_id)
        raise RuntimeError(f"ask_user callback failed: {error}") from error
    if answer is None:
        result = UserInputResult(request.request_id, "declined")
        await ctx.emit("user_input.declined", result=result.to_dict())
        return result
    if not isinstance(answer, str) or not answer.strip() or len(answer) > max_answer_chars:
        await ctx.emit("user_input.failed", request_id=request.request_id)
        raise RuntimeError(
            f"ask_user callback must return nonblank text of at most {max_answer_chars} characters, or None"
        )
    result = UserInputResult(request.request_id, "answered", answer)
    await ctx.emit("user_input.answered", result=result.to_dict())
    return result
