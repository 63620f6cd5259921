"""examples/builtin_assistants.py runs offline and shows every promised part working."""

from __future__ import annotations

from .example_runner import run_example


def test_builtin_assistants_example_runs_offline():
    output = run_example("builtin_assistants.py")
    assert '"result": 8.0' in output
    assert 'run_shell: {"exit_code": 0, "stdout": "apple\\npear\\n"}' in output
    for operation in ("status", "add", "diff", "commit", "log", "show"):
        assert f"approved git (process.execute, git.{'write' if operation in ('add', 'commit') else 'read'})" in output
        assert f" {operation} " in output
    assert 'log: "Add fruit list"' in output and 'show: ["+apple", "+pear"]' in output
    assert "user asked: Which day works for the deck review?" in output
    assert "model: Booked 'Deck review' on 2025-03-06T15:00:00+01:00" in output
    assert '"status": "drafted"' in output and '"status": "accepted", "outbox": 1' in output
