"""Running an example script the way a user does: a fresh interpreter, offline."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run_example(name: str) -> str:
    """The standard output of ``python examples/<name>``; fails with its stderr unless it succeeds."""
    completed = subprocess.run([sys.executable, str(EXAMPLES / name)], capture_output=True, text=True,
                               timeout=120, check=False)
    assert completed.returncode == 0, completed.stderr
    return completed.stdout
