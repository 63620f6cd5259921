"""Agent configuration as plain data (dict / YAML).

What serializes: the card, run limits, a declarative CapabilityPolicy, and the parameterless
built-in tools by stable identity (``module:factory`` under ``protolink.tools``). What does not:
configured tools, backends, credentials and callbacks; loading names the tools to register again.
"""

from __future__ import annotations

import importlib
import math
import reprlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import yaml
from pydantic import ValidationError
from yaml.composer import ComposerError

from protolink.errors import SerializationError

from .cards import AgentCard
from .policy import CapabilityPolicy

if TYPE_CHECKING:
    from .tools import Tool


class Configured(Protocol):
    """What of an agent its configuration holds."""

    card: AgentCard
    policy: Any
    max_tool_calls: int | None
    max_run_seconds: float | None
    max_steps: int
    system_prompt: str | None
    tools: Mapping[str, Tool]
    unattached_tools: tuple[str, ...]

    def add_tool(self, tool: Tool) -> Any: ...


A = TypeVar("A", bound=Configured)

FORMAT_VERSION = 1
_FIELDS = frozenset({"version", "card", "policy", "limits", "system_prompt", "tools"})
_LIMITS = frozenset({"max_tool_calls", "max_run_seconds", "max_steps"})
_POLICY_FIELDS = frozenset({"type", "rules", "default_effect", "class"})
_TOOL_FIELDS = frozenset({"name", "builtin", "configured"})
#: The built-in tools whose factory takes no argument: the only ones a configuration can name.
_BUILTIN_TOOLS = frozenset({
    "protolink.tools.builtins.calculator:calculator",
    "protolink.tools.builtins.clock:current_datetime",
    "protolink.tools.builtins.fetch:fetch_url",
    "protolink.tools.builtins.web:web_search",
})


def agent_to_dict(agent: Configured) -> dict[str, Any]:
    if isinstance(agent.policy, CapabilityPolicy):
        policy: dict[str, Any] = agent.policy.to_dict()
    else:
        policy = {"type": "custom", "class": type(agent.policy).__qualname__}
    return {
        "version": FORMAT_VERSION,
        "card": agent.card.to_dict(),
        "policy": policy,
        "limits": {
            "max_tool_calls": agent.max_tool_calls,
            "max_run_seconds": agent.max_run_seconds,
            "max_steps": agent.max_steps,
        },
        "system_prompt": agent.system_prompt,
        "tools": [_tool_entry(tool) for tool in agent.tools.values()]
        + [{"name": name, "configured": True} for name in agent.unattached_tools],
    }


def _tool_entry(tool: Tool) -> dict[str, Any]:
    if tool.builtin:
        return {"name": tool.name, "builtin": tool.builtin}
    return {"name": tool.name, "configured": True}


def agent_from_dict(cls: Callable[..., A], data: Mapping[str, Any], *, policy: Any, approval_handler: Any,
                    llm: Any, redactor: Any, tools: Iterable[Tool]) -> A:
    """Build an agent from its configuration; any malformed part is a SerializationError naming it."""
    data = _mapping(data, "an agent configuration", _FIELDS)
    version = data.get("version")
    if isinstance(version, bool) or version != FORMAT_VERSION:
        raise SerializationError(f"unsupported agent configuration version {reprlib.repr(version)}")
    try:
        card = AgentCard.from_dict(data.get("card"))
    except ValidationError as error:
        raise SerializationError(f"invalid agent card: {_describe(error)}") from None
    if policy is None:
        policy = _load_policy(data.get("policy"))
    limits = _mapping({} if data.get("limits") is None else data["limits"], "limits", _LIMITS)
    system_prompt = data.get("system_prompt")
    if system_prompt is not None and not isinstance(system_prompt, str):
        raise SerializationError("system_prompt must be a string or null")
    agent = cls(
        card,
        policy=policy,
        approval_handler=approval_handler,
        llm=llm,
        redactor=redactor,
        max_tool_calls=_count(limits, "max_tool_calls", None),
        max_run_seconds=_seconds(limits, "max_run_seconds"),
        max_steps=_count(limits, "max_steps", 20, nullable=False),
        system_prompt=system_prompt,
    )
    supplied = {tool.name: tool for tool in tools}
    unattached = []
    for where, name, builtin in _tool_entries(data.get("tools")):
        if name in supplied:
            agent.add_tool(supplied.pop(name))
        elif builtin is not None:
            agent.add_tool(_load_builtin(builtin, name, where))
        else:
            unattached.append(name)
    for tool in supplied.values():
        agent.add_tool(tool)
    agent.unattached_tools = tuple(unattached)
    return agent


def _mapping(value: Any, field: str, keys: frozenset[str]) -> Mapping[str, Any]:
    """``value`` if it is a mapping holding no key but ``keys``: a misspelt key would be silently lost."""
    if not isinstance(value, Mapping):
        raise SerializationError(f"{field} must be a mapping, not {type(value).__name__}")
    for key in value:
        if key not in keys:
            raise SerializationError(f"{field} has an unknown key {reprlib.repr(key)}")
    return value


def _count(limits: Mapping[str, Any], field: str, default: int | None, *, nullable: bool = True) -> int | None:
    """A count as RunContext accepts it: an integer >= 0, or null for no limit where ``nullable``."""
    value = limits.get(field, default)
    if (value is None and nullable) or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        return value
    raise SerializationError(f"limits.{field} must be an integer >= 0{' or null' if nullable else ''}, "
                             f"not {reprlib.repr(value)}")


def _seconds(limits: Mapping[str, Any], field: str) -> float | None:
    """A number of seconds as RunContext accepts it: finite and > 0, or null for no limit."""
    value = limits.get(field)
    if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < math.inf):
        return value
    raise SerializationError(f"limits.{field} must be a finite number > 0 or null, not {reprlib.repr(value)}")


def _tool_entries(data: Any) -> Iterator[tuple[str, str, str | None]]:
    """Each tool entry as (where, name, builtin identity or None); names must be unique."""
    if data is None:
        return
    if not isinstance(data, list):
        raise SerializationError(f"tools must be a list, not {type(data).__name__}")
    seen: set[str] = set()
    for index, entry in enumerate(data):
        where = f"tools[{index}]"
        entry = _mapping(entry, where, _TOOL_FIELDS)
        name, builtin = entry.get("name"), entry.get("builtin")
        if not isinstance(name, str) or not name:
            raise SerializationError(f"{where}.name must be a non-empty string")
        if builtin is not None and not isinstance(builtin, str):
            raise SerializationError(f"{where}.builtin must be a string")
        if name in seen:
            raise SerializationError(f"{where}: the tool {_short(name)!r} is listed twice")
        seen.add(name)
        yield where, name, builtin


def _load_policy(data: Any) -> CapabilityPolicy:
    if data is None:
        return CapabilityPolicy()
    data = _mapping(data, "policy", _POLICY_FIELDS)
    if data.get("type") == "custom":
        raise SerializationError(
            f"the saved agent used a custom policy ({reprlib.repr(data.get('class'))}); pass policy= when loading"
        )
    if data.get("rules") is not None and not isinstance(data["rules"], Mapping):
        raise SerializationError("policy.rules must be a mapping")
    try:
        return CapabilityPolicy.from_dict(data)
    except ValueError as error:
        raise SerializationError(f"invalid policy: {_short(str(error))}") from None


def _load_builtin(identity: str, name: str, where: str) -> Tool:
    """The tool of a known parameterless built-in; its identity is checked before anything is imported."""
    if identity not in _BUILTIN_TOOLS:
        raise SerializationError(f"{where}: {_short(identity)!r} is not a parameterless built-in tool")
    module_name, _, factory_name = identity.partition(":")
    tool: Tool = getattr(importlib.import_module(module_name), factory_name)()
    if tool.name != name:
        raise SerializationError(f"{where}: {identity} makes a tool named {tool.name!r}, not {_short(name)!r}")
    return tool


def _describe(error: ValidationError) -> str:
    """The first few problems of a validation error, without their input: short whatever the input."""
    problems = []
    for problem in error.errors(include_url=False, include_context=False, include_input=False)[:3]:
        where = ".".join(map(str, problem["loc"]))
        problems.append(_short(f"{where}: {problem['msg']}" if where else problem["msg"]))
    more = error.error_count() - len(problems)
    return "; ".join(problems) + (f" (and {more} more)" if more else "")


def _short(text: str, limit: int = 120) -> str:
    """``text`` cut to ``limit`` characters, so that no message grows with the input."""
    return text if len(text) <= limit else text[:limit] + "..."


def dump_yaml(data: Mapping[str, Any]) -> str:
    return yaml.safe_dump(dict(data), sort_keys=False, allow_unicode=True)


class _PlainLoader(yaml.SafeLoader):
    """SafeLoader that refuses anchors and aliases: a configuration has no use for them, and they
    let a few hundred bytes expand into millions of nodes."""

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        event = self.peek_event()
        if event.anchor is not None:  # every node event has one: an alias's, or the anchor it sets
            raise ComposerError(
                None, None, "anchors and aliases (&, *) are not allowed in an agent configuration", event.start_mark
            )
        return super().compose_node(parent, index)


def load_yaml(text: str) -> dict[str, Any]:
    """Parse a YAML configuration; anything PyYAML refuses, or fails on, is a SerializationError."""
    try:
        data = yaml.load(text, Loader=_PlainLoader)
    # PyYAML's scalar constructors raise plain errors (a 2024-02-30 date, a 5000-digit integer);
    # deep nesting exhausts the composer's recursion
    except (yaml.YAMLError, ValueError, TypeError, AttributeError, RecursionError) as error:
        raise SerializationError(f"invalid YAML: {_yaml_problem(error)}") from None
    if not isinstance(data, dict):
        raise SerializationError("an agent configuration must be a YAML mapping")
    return data


def _yaml_problem(error: Exception) -> str:
    """What PyYAML found wrong, and where, without its excerpt of the input."""
    if isinstance(error, yaml.MarkedYAMLError) and error.problem_mark is not None:
        mark = error.problem_mark
        return f"{_short(error.problem or '')} (line {mark.line + 1}, column {mark.column + 1})"
    return _short(str(error))
