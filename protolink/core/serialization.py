"""Agent configuration as plain data (dict / YAML).

What serializes: the card, run limits, a declarative CapabilityPolicy, and the parameterless
built-in tools by stable identity (``module:factory`` under ``protolink.tools``). What does not:
configured tools, backends, credentials and callbacks; loading names the tools to register again.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import yaml

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
_BUILTIN_PREFIX = "protolink.tools."


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
    if not isinstance(data, Mapping):
        raise SerializationError("an agent configuration must be a mapping")
    if data.get("version") != FORMAT_VERSION:
        raise SerializationError(f"unsupported agent configuration version {data.get('version')!r}")
    try:
        card = AgentCard.from_dict(data["card"])
    except Exception as error:
        raise SerializationError(f"invalid agent card: {error}") from None
    if policy is None:
        policy = _load_policy(data.get("policy"))
    limits = data.get("limits") or {}
    agent = cls(
        card,
        policy=policy,
        approval_handler=approval_handler,
        llm=llm,
        redactor=redactor,
        max_tool_calls=limits.get("max_tool_calls"),
        max_run_seconds=limits.get("max_run_seconds"),
        max_steps=limits.get("max_steps", 20),
        system_prompt=data.get("system_prompt"),
    )
    supplied = {tool.name: tool for tool in tools}
    unattached = []
    for entry in data.get("tools", []):
        name = entry.get("name")
        if name in supplied:
            agent.add_tool(supplied.pop(name))
        elif entry.get("builtin"):
            agent.add_tool(_load_builtin(entry["builtin"]))
        else:
            unattached.append(name)
    for tool in supplied.values():
        agent.add_tool(tool)
    agent.unattached_tools = tuple(unattached)
    return agent


def _load_policy(data: Mapping[str, Any] | None) -> CapabilityPolicy:
    if data is None:
        return CapabilityPolicy()
    if data.get("type") == "custom":
        raise SerializationError(
            f"the saved agent used a custom policy ({data.get('class')}); pass policy= when loading"
        )
    return CapabilityPolicy.from_dict(data)


def _load_builtin(identity: str) -> Tool:
    module_name, _, factory_name = identity.partition(":")
    if not module_name.startswith(_BUILTIN_PREFIX) or not factory_name.isidentifier():
        raise SerializationError(f"{identity!r} is not a ProtoLink built-in tool identity")
    try:
        factory = getattr(importlib.import_module(module_name), factory_name)
    except (ImportError, AttributeError):
        raise SerializationError(f"unknown built-in tool {identity!r}") from None
    tool = factory()
    if getattr(tool, "builtin", None) != identity:
        raise SerializationError(f"{identity!r} does not name a parameterless built-in tool")
    return tool


def dump_yaml(data: Mapping[str, Any]) -> str:
    return yaml.safe_dump(dict(data), sort_keys=False, allow_unicode=True)


def load_yaml(text: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise SerializationError(f"invalid YAML: {error}") from None
    if not isinstance(data, dict):
        raise SerializationError("an agent configuration must be a YAML mapping")
    return data
