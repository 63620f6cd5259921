"""The README's first example, run as it is written: a repository's ``make check`` through the
agent's shell tool, in a sandbox of the CI image named by its short name."""

from __future__ import annotations

import os
import re
import tempfile
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.docker

README = Path(__file__).resolve().parents[2] / "README.md"
#: The repository the example names; the test puts one of its own there.
EXAMPLE_REPOSITORY = "/work/repo"


def first_example() -> str:
    """The first Python block of the README."""
    found = re.search(r"```python\n(.*?)```", README.read_text(), re.DOTALL)
    assert found is not None, "the README has no Python example"
    return found[1]


async def test_the_readmes_first_example_runs_make_check_in_a_repository(ci_image):
    with tempfile.TemporaryDirectory(prefix="protolink-readme-") as directory:
        os.chmod(directory, 0o755)  # the command uid (nobody) reads the repository
        (Path(directory) / "Makefile").write_text("check:\n\t@echo checks pass\n")
        code = first_example()
        assert EXAMPLE_REPOSITORY in code
        code = code.replace(EXAMPLE_REPOSITORY, directory)
        namespace: dict[str, object] = {}
        exec(compile(f"async def example():\n{textwrap.indent(code, '    ')}\n    return result\n",
                     str(README), "exec"), namespace)
        result = await namespace["example"]()  # type: ignore[operator]
    assert (result.exit_code, result.stdout, result.stderr) == (0, "checks pass\n", "")
