"""Models for the inference loop: the protocol, a scripted model, an OpenAI-compatible client."""

from .base import Message, Model, ModelResponse, ToolCall
from .loop import RunResult
from .scripted import ScriptedModel

__all__ = ["Message", "Model", "ModelResponse", "RunResult", "ScriptedModel", "ToolCall"]
