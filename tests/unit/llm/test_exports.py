"""What ``protolink.llm`` offers, and that importing it needs no optional dependency."""

import subprocess
import sys

import protolink.llm
from protolink.llm.openai import OpenAICompatibleModel as DefinedModel


def test_openai_compatible_model_is_exported():
    from protolink.llm import OpenAICompatibleModel

    assert OpenAICompatibleModel is DefinedModel
    assert "OpenAICompatibleModel" in protolink.llm.__all__
    assert "OpenAICompatibleModel" in dir(protolink.llm)


def test_importing_the_package_does_not_import_httpx():
    check = "import sys, protolink.llm; print('httpx' in sys.modules, 'protolink.llm.openai' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.split() == ["False", "False"]
