"""examples/sandboxed_agent.py runs its agent's tools in a real sandbox and shows what they saw."""

from __future__ import annotations

import pytest

from .example_runner import run_example

pytestmark = pytest.mark.docker


def test_sandboxed_agent_example_shows_the_isolation_and_works(docker_client, sandbox_image):
    output = run_example("sandboxed_agent.py")
    for line in ("uid: 65534", "capabilities: 0000000000000000", "network interfaces: lo \n",
                 "system: read-only", "docker socket: absent", "this example's directory: absent",
                 "search_files: ['notes.md:3']", "read_document: [['quarter', 'revenue'], ['Q1', '120'], ['Q2', '135']]",
                 "sandbox removed"):
        assert line in output
    assert "Notes written in a sandbox" in output and "git log: commit " in output
