"""Real projects nobody here wrote give the same test results through the CI runner as on the host.

Each project of :mod:`tests.ci_projects` is unpacked twice from its source distribution: once it is
set up and tested directly on this host, once through ``protolink-sandbox ci`` with the CI image,
its package index allowed during setup only, and this host's certificate authorities passed in
(the index's TLS may be intercepted here). Both runs must give the totals measured when the
project was chosen.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from protolink.sandbox.ci.collect import junit_counts
from tests.ci_projects import JAVASCRIPT_PROJECTS, JUNIT, PYTHON_PROJECTS, Project, Totals, unpack

pytestmark = pytest.mark.docker

#: Where the projects' packages come from (the setup phase's allow-list).
INDEX_HOSTS = {"python": ("pypi.org:443", "files.pythonhosted.org:443"), "javascript": ("registry.npmjs.org:443",)}
CA_FILE = "/etc/ssl/certs/ca-certificates.crt"
CLI = os.path.join(os.path.dirname(sys.executable), "protolink-sandbox")
#: Past this a project's run is stuck, not slow (pip and npm download on a shared machine).
RUN_TIMEOUT_SECONDS = 900


def _totals(counts: dict[str, int]) -> Totals:
    return Totals(passed=counts["passed"], failed=counts["failures"], errors=counts["errors"],
                  skipped=counts["skipped"])


def run_on_host(project: Project, repository: Path) -> Totals:
    """The project's setup and test commands run directly here; its JUnit totals."""
    env = {**os.environ, "CI": "true"}
    for command in project.setup:
        subprocess.run(["/bin/sh", "-c", command], cwd=repository, env=env, check=True, timeout=RUN_TIMEOUT_SECONDS,
                       stdin=subprocess.DEVNULL, capture_output=True)
    subprocess.run(shlex.split(project.test), cwd=repository, env=env, timeout=RUN_TIMEOUT_SECONDS,
                   stdin=subprocess.DEVNULL, capture_output=True)
    return _totals(junit_counts((repository / JUNIT).read_bytes()))


def run_through_the_runner(project: Project, repository: Path, kind: str, out: Path) -> dict:
    """The same commands through ``protolink-sandbox ci``; its report."""
    argv = [CLI, "ci", str(repository), "--image", "ci", "--ca-file", CA_FILE, "--junit", JUNIT,
            "--report", str(out / "report.json"), "--artifacts-dir", str(out / "artifacts"),
            "--timeout", str(RUN_TIMEOUT_SECONDS)]
    for command in project.setup:
        argv += ["--setup", command]
    for host in INDEX_HOSTS[kind]:
        argv += ["--allow", host]
    done = subprocess.run([*argv, "--", *shlex.split(project.test)], capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_SECONDS + 120, stdin=subprocess.DEVNULL)
    report = json.loads((out / "report.json").read_text())
    assert report["exit_code"] == done.returncode, done.stderr[-4000:]
    return report


@pytest.mark.parametrize("project, kind", [*((project, "python") for project in PYTHON_PROJECTS),
                                           *((project, "javascript") for project in JAVASCRIPT_PROJECTS)],
                         ids=lambda value: value.name if isinstance(value, Project) else value)
def test_a_real_projects_tests_give_the_same_totals_through_the_runner(project, kind, tmp_path, ci_image,
                                                                        monkeypatch):
    monkeypatch.setenv("PROTOLINK_CI_DIR", str(tmp_path / "jobs"))
    on_host = run_on_host(project, unpack(project, tmp_path / "host"))
    report = run_through_the_runner(project, unpack(project, tmp_path / "sandboxed"), kind, tmp_path / "out")
    assert report["outcome"] in ("passed", "failed"), report["error"]
    through_runner = _totals(report["junit"]["totals"])
    assert on_host == through_runner == project.expected
    setup, test = report["phases"]
    assert setup["network"] == "allow-list" and test["network"] == "none"
    hosts = {decision["host"] for decision in report["egress"]["decisions"] if decision["kind"] == "allowed"}
    assert hosts and hosts <= {rule.rsplit(":", 1)[0] for rule in INDEX_HOSTS[kind]}
    assert not [decision for decision in report["egress"]["decisions"] if decision["phase"] == "test"]
    assert list((tmp_path / "jobs").iterdir()) == []
