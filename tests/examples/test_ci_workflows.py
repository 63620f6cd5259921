"""The CI workflows in examples/ci call the runner with options it accepts."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml

from protolink.sandbox.ci.command import job_of, split_test
from protolink.sandbox.cli import _parser

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "ci"


def _runner_lines(document: object) -> list[str]:
    """Every shell line of a workflow that calls ``protolink-sandbox ci``."""
    if isinstance(document, dict):
        return [line for value in document.values() for line in _runner_lines(value)]
    if isinstance(document, list):
        return [line for value in document for line in _runner_lines(value)]
    if isinstance(document, str) and "protolink-sandbox" in document and " ci " in document:
        return [" ".join(document.replace("\\\n", " ").split())]
    return []


@pytest.mark.parametrize("name", ["github-actions.yml", "gitlab-ci.yml"])
def test_each_workflow_runs_the_tests_through_the_runner_without_network(name):
    lines = _runner_lines(yaml.safe_load((EXAMPLES / name).read_text()))
    assert len(lines) == 1
    argv = shlex.split(lines[0].replace("$RUNNER_TEMP", "/tmp").replace("$CI_PROJECT_DIR", "/builds/p"))
    arguments, test = split_test(argv[argv.index("ci"):])
    args = _parser().parse_args(arguments)
    args.test = test
    job = job_of(args)
    assert job.test[-1] == "--junitxml=junit.xml" and job.junit == ("junit.xml",)
    assert set(job.allow) == {"pypi.org", "files.pythonhosted.org"} and job.env == ()
    assert args.report == Path("ci-report.json")
