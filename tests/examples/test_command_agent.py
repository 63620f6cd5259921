"""examples/command_agent.py runs offline: it shows the exact preview, approves, and prints the result."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "command_agent.py"


def test_command_agent_example_shows_the_preview_and_runs():
    completed = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=120,
                               check=False)
    assert completed.returncode == 0, completed.stderr
    output = completed.stdout
    assert "approval requested for execute_command (process.execute):" in output
    assert '"env": {}' in output and '"boundary": "host"' in output
    assert "[stdout] 'hello\\n'" in output
    assert output.endswith("0 'hello\\n' False\n")
