"""Capability policy: which capabilities an agent may use, and which need a human."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal, Protocol, get_args, runtime_checkable

from protolink.errors import SerializationError

Effect = Literal["allow", "deny", "require_approval"]
EFFECTS: tuple[Effect, ...] = get_args(Effect)
_STRICTNESS = {"allow": 0, "require_approval": 1, "deny": 2}


@runtime_checkable
class Policy(Protocol):
    """Anything that maps a set of capabilities to one effect."""

    def evaluate(self, capabilities: Iterable[str]) -> Effect: ...


def strictest(effects: Iterable[Effect]) -> Effect:
    """The strictest of several effects (``deny`` > ``require_approval`` > ``allow``)."""
    return max(effects, key=_STRICTNESS.__getitem__, default="allow")


def _check_effect(effect: str, where: str) -> Effect:
    if effect not in EFFECTS:
        raise ValueError(f"{where}: effect must be one of {', '.join(EFFECTS)}, not {effect!r}")
    return effect  # type: ignore[return-value]


class CapabilityPolicy:
    """Declarative rules from capability patterns to effects.

    Keys are exact capabilities (``"filesystem.read"``) or wildcards (``"filesystem.*"``,
    ``"*"``). For one capability the most specific matching rule applies: an exact key, then the
    longest wildcard prefix, then ``default_effect``. When an action needs several capabilities
    the strictest effect wins. An action that needs no capability is allowed.
    """

    def __init__(self, rules: Mapping[str, str] | None = None, *, default_effect: str = "allow") -> None:
        self.default_effect: Effect = _check_effect(default_effect, "default_effect")
        self.rules: dict[str, Effect] = {}
        for pattern, effect in (rules or {}).items():
            if not isinstance(pattern, str) or not pattern or (
                "*" in pattern and pattern != "*" and not (pattern.endswith(".*") and "*" not in pattern[:-2])
            ):
                raise ValueError(f"invalid capability pattern {pattern!r}: use 'name', 'prefix.*' or '*'")
            self.rules[pattern] = _check_effect(effect, f"rule {pattern!r}")

    def effect_for(self, capability: str) -> Effect:
        """The effect of the most specific rule matching one capability."""
        if capability in self.rules:
            return self.rules[capability]
        parts = capability.split(".")
        for length in range(len(parts) - 1, 0, -1):
            wildcard = ".".join(parts[:length]) + ".*"
            if wildcard in self.rules:
                return self.rules[wildcard]
        return self.rules.get("*", self.default_effect)

    def evaluate(self, capabilities: Iterable[str]) -> Effect:
        """The strictest effect over all capabilities an action needs."""
        return strictest(self.effect_for(capability) for capability in capabilities)

    def to_dict(self) -> dict[str, Any]:
        return {"type": "capability", "rules": dict(self.rules), "default_effect": self.default_effect}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CapabilityPolicy:
        if data.get("type", "capability") != "capability":
            raise SerializationError(f"not a capability policy: type {data.get('type')!r}")
        return cls(data.get("rules", {}), default_effect=data.get("default_effect", "allow"))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CapabilityPolicy) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        return f"CapabilityPolicy({self.rules!r}, default_effect={self.default_effect!r})"
