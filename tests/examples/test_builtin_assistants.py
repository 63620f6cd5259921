"""examples/builtin_assistants.py runs offline and shows every promised part working."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "builtin_assistants.py"


def test_builtin_assistants_example_runs_offline():
    completed = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=120,
                               check=False)
    assert completed.returncode == 0, completed.stderr
    output = completed.stdout
    assert '"result": 8.0' in output
    assert 'run_shell: {"exit_code": 0, "stdout": "apple\\npear\\n"}' in output
    for operation in ("status", "add", "diff", "commit", "log", "show"):
        assert f"approved git (process.execute, git.{'write' if operation in ('add', 'commit') else 'read'})" in output
        assert f" {operation} " in output
    assert 'log: "Add fruit list"' in output and 'show: ["+apple", "+pear"]' in output
    assert "user asked: Which day works for the deck review?" in output
    assert "model: Booked 'Deck review' on 2025-03-06T15:00:00+01:00" in output
    assert '"status": "drafted"' in output and '"status": "accepted", "outbox": 1' in output
