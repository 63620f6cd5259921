"""Agent presets that compose the built-in tools under a safe default policy."""

from .assistant import ASSISTANT_POLICY, Assistant, assistant_policy

__all__ = ["ASSISTANT_POLICY", "Assistant", "assistant_policy"]
