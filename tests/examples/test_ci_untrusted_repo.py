"""examples/ci_untrusted_repo.py runs a hostile repository's tests offline and reports them."""

from __future__ import annotations

import pytest

from .example_runner import run_example

pytestmark = pytest.mark.docker


def test_ci_example_reports_the_tests_and_contains_the_hostile_ones(docker_client, sandbox_image):
    output = run_example("ci_untrusted_repo.py")
    for line in ("outcome: failed (exit 1)", "tests: 6 run, 4 passed, 0 failed, 1 errors, 1 skipped",
                 "setup (network: none): /bin/sh -c python3 -c 'import calc' -> exit 0",
                 "artifacts: ['coverage.txt']", "planted file in the checkout: absent", "secret in the report: no"):
        assert line in output
    for test in ("test_outside_the_workspace_is_read_only", "test_secrets_are_not_here", "test_there_is_no_network"):
        assert f"{test} (test_hostile.Hostile.{test}) ... ok" in output
