"""Models for the inference loop: a scripted model and an OpenAI-compatible client.

The model protocol and the loop belong to the runtime (:mod:`protolink.core.models`,
:mod:`protolink.core.inference`); their names are offered here too.
"""

from protolink.core.inference import RunResult
from protolink.core.models import Message, Model, ModelResponse, ToolCall

from .scripted import ScriptedModel

__all__ = ["Message", "Model", "ModelResponse", "RunResult", "ScriptedModel", "ToolCall"]
