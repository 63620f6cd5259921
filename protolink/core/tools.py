"""Tools: plain tools that can be called directly, and prepared tools that only an Agent runs.

A tool validates its arguments against a pydantic model (its input schema), then *prepares*:
it resolves exactly what it will do into a :class:`Preparation` (capabilities, preview
artifacts, the execute step). The Agent authorizes that preparation before executing it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from protolink.errors import DirectCallError, ToolArgumentError

from .ids import new_id
from .runs import RunContext

if TYPE_CHECKING:
    from .events import EventBus


@dataclass(frozen=True)
class Artifact:
    """One preview item shown for approval: a diff, a preimage, a resolved process, a request."""

    kind: str
    title: str
    content: Any

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "title": self.title, "content": jsonable(self.content)}


@dataclass(frozen=True)
class Action:
    """One authorized unit of work: model arguments, capabilities and the exact preview."""

    action_id: str
    tool: str
    arguments: Mapping[str, Any]
    capabilities: tuple[str, ...]
    artifacts: tuple[Artifact, ...] = ()
    process: Mapping[str, Any] | None = None
    run_id: str | None = None
    task_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "action_id": self.action_id,
            "tool": self.tool,
            "arguments": jsonable(self.arguments),
            "capabilities": list(self.capabilities),
            "artifacts": [artifact.to_dict() for artifact in self.artifacts],
            "process": jsonable(self.process),
            "run_id": self.run_id,
            "task_id": self.task_id,
        }


class ToolContext:
    """What an executing tool may use: its run's budgets, its ids, and the event stream."""

    def __init__(self, run: RunContext, action_id: str, events: EventBus | None = None) -> None:
        self.run = run
        self.action_id = action_id
        self._events = events

    @property
    def run_id(self) -> str:
        return self.run.run_id

    @property
    def task_id(self) -> str | None:
        return self.run.task_id

    def remaining_seconds(self) -> float | None:
        return self.run.remaining_seconds()

    def bound_timeout(self, timeout: float) -> tuple[float, bool]:
        """``timeout`` limited by the run's remaining time, and whether the run is the limit."""
        return self.run.bound_timeout(timeout)

    async def emit(self, type: str, **data: Any) -> None:
        """Publish a tool event (``process.output``, ``user_input.requested``, ...)."""
        if self._events is not None:
            await self._events.publish(
                type, data, run_id=self.run_id, task_id=self.task_id, action_id=self.action_id
            )


Execute = Callable[[ToolContext], Awaitable[Any]]


@dataclass(frozen=True)
class Preparation:
    """The resolved action a tool will perform once authorized."""

    execute: Execute
    capabilities: tuple[str, ...]
    artifacts: tuple[Artifact, ...] = ()
    process: Mapping[str, Any] | None = None


Handler = Callable[[Any, ToolContext], Awaitable[Any]]
Prepare = Callable[[Any, ToolContext], Awaitable[Preparation]]
#: The keyword of ``Agent.call_tool`` that carries the run: no tool may take an argument so named.
RESERVED_ARGUMENT = "context"


def capability_names(capabilities: Iterable[str]) -> tuple[str, ...]:
    """``capabilities`` as a tuple of names. TypeError for one string (``"fs.write"`` would be
    read as its characters, and a policy denying ``fs.write`` would not match) or a non-string."""
    if isinstance(capabilities, str):
        raise TypeError(f"capabilities must be a collection of names, not the string {capabilities!r}")
    names = tuple(capabilities)
    if not all(isinstance(name, str) for name in names):
        raise TypeError(f"capabilities must be strings, got {names!r}")
    return names


class Tool:
    """A named tool with an input schema, capabilities and tags, callable directly.

    ``arguments`` is a pydantic model; its JSON schema is the tool's input schema.
    ``handler(args, context)`` does the work. Calling the tool directly bypasses any Agent
    policy, approval and budget: it validates and runs the handler.
    """

    def __init__(
        self,
        *,
        name: str,
        description: str,
        arguments: type[BaseModel],
        handler: Handler,
        capabilities: Iterable[str] = (),
        tags: Iterable[str] = (),
        output_schema: Mapping[str, Any] | None = None,
        builtin: str | None = None,
    ) -> None:
        if RESERVED_ARGUMENT in arguments.model_fields:
            raise ValueError(f"tool {name!r} takes an argument named {RESERVED_ARGUMENT!r}, which "
                             "Agent.call_tool keeps for the run: rename it")
        self.name = name
        self.description = description
        self.arguments = arguments
        self.capabilities = capability_names(capabilities)
        self.tags = tuple(tags)
        self.output_schema = dict(output_schema) if output_schema else None
        self.builtin = builtin
        self._handler = handler

    @property
    def input_schema(self) -> dict[str, Any]:
        return self.arguments.model_json_schema()

    def validate(self, arguments: Mapping[str, Any]) -> BaseModel:
        """Validate model-supplied arguments; the error names each offending field."""
        try:
            return self.arguments.model_validate(dict(arguments))
        except ValidationError as error:
            raise ToolArgumentError(describe_validation_error(self.name, error)) from None

    async def prepare(self, args: BaseModel, context: ToolContext) -> Preparation:
        """Resolve the action: a plain tool needs its declared capabilities and no preview."""
        return Preparation(
            execute=lambda ctx: self._handler(args, ctx),
            capabilities=self.capabilities,
        )

    def schema(self) -> dict[str, Any]:
        """The model-facing description: name, description and JSON-schema parameters."""
        return {"name": self.name, "description": self.description, "parameters": self.input_schema}

    async def __call__(self, **arguments: Any) -> Any:
        args = self.validate(arguments)
        context = ToolContext(RunContext(), new_id("act"))
        preparation = await self.prepare(args, context)
        return await preparation.execute(context)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, capabilities={self.capabilities!r})"


class PreparedTool(Tool):
    """A tool that executes only through an Agent's authorization pipeline.

    ``prepare(args, context)`` returns the exact :class:`Preparation` (per-call capabilities,
    preview artifacts, execute step). Calling the tool directly raises :class:`DirectCallError`.
    """

    def __init__(
        self,
        *,
        name: str,
        description: str,
        arguments: type[BaseModel],
        prepare: Prepare,
        capabilities: Iterable[str] = (),
        tags: Iterable[str] = (),
        output_schema: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(
            name=name,
            description=description,
            arguments=arguments,
            handler=_never,
            capabilities=capabilities,
            tags=tags,
            output_schema=output_schema,
        )
        self._prepare = prepare

    async def prepare(self, args: BaseModel, context: ToolContext) -> Preparation:
        return await self._prepare(args, context)

    async def __call__(self, **arguments: Any) -> Any:
        raise DirectCallError(
            f"{self.name} is a prepared tool: register it on an Agent and use agent.call_tool"
        )


async def _never(args: Any, context: ToolContext) -> Any:  # pragma: no cover - unreachable
    raise DirectCallError("prepared tools execute only through an Agent")


def describe_validation_error(tool: str, error: ValidationError) -> str:
    """One readable line per invalid field: ``tool: field: message``."""
    problems = []
    for item in error.errors():
        field_name = ".".join(str(part) for part in item["loc"]) or "arguments"
        problems.append(f"{field_name}: {item['msg']}")
    return f"{tool}: invalid arguments: " + "; ".join(problems)


_SCALARS = frozenset((str, int, float, bool))


def jsonable(value: Any) -> Any:
    """A JSON-compatible view of a result, preview or argument value."""
    kind = type(value)
    if value is None or kind in _SCALARS:
        return value
    if kind is dict:  # the usual containers first; their subclasses take the general path below
        return {str(key): jsonable(item) for key, item in value.items()}
    if kind is list or kind is tuple:
        return [jsonable(item) for item in value]
    if isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if hasattr(value, "to_dict") and callable(value.to_dict):
        return jsonable(value.to_dict())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(key): jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(item) for item in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)
