"""Models for the inference loop: a scripted model and an OpenAI-compatible client.

The model protocol and the loop belong to the runtime (:mod:`protolink.core.models`,
:mod:`protolink.core.inference`); their names are offered here too. ``OpenAICompatibleModel``
loads on first use, so importing this package does not import httpx (``integrations`` extra).
"""

from protolink._lazy import lazy_exports
from protolink.core.inference import RunResult
from protolink.core.models import Message, Model, ModelResponse, ToolCall

from .scripted import ScriptedModel

_LAZY = {"OpenAICompatibleModel": ".openai"}

__all__ = sorted(["Message", "Model", "ModelResponse", "RunResult", "ScriptedModel", "ToolCall", *_LAZY])

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
