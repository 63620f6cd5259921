"""examples/generic_tools.py runs offline and shows each tool family doing its job."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "generic_tools.py"


def test_generic_tools_example_runs_offline():
    completed = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=120,
                               check=False)
    assert completed.returncode == 0, completed.stderr
    output = completed.stdout
    assert "restored: '# Notes\\n\\nShip the report on Friday.\\n'" in output
    assert 'stored null: {"key": "last_run", "found": true, "value": null}' in output
    assert 'missing: {"key": "last_run", "found": false, "value": null}' in output
    assert '{"location": {"row": 4, "column": 1}, "snippet": "North"}' in output
    assert '"rows": [[1, "anvil"], [2, "bolt"]]' in output
    assert "a write is refused: query rejected" in output
    assert 'GET items: {"status_code": 200, "headers": {"content-type": "application/json"}, "body": {"items": ' \
           '["anvil", "bolt"]}, "body_encoding": "json"}' in output
    assert '"path": "items", "query": {}, "body": {"name": "cog"}}' in output  # the approved POST preview
    assert "a path outside the root is refused" in output
