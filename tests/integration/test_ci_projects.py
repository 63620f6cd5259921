"""Real projects nobody here wrote give the same test results through the CI runner as on the host.

Each project of :mod:`tests.ci_projects` is unpacked twice from its source distribution: once it is
set up and tested directly on this host, once through ``protolink-sandbox ci`` with the CI image
(:mod:`tests.ci_runs`). Both runs must give the totals measured when the project was chosen, and
only the setup phase may reach the package index.
"""

from __future__ import annotations

import pytest

from tests.ci_projects import JAVASCRIPT_PROJECTS, PYTHON_PROJECTS, Project, unpack
from tests.ci_runs import INDEX_HOSTS, kind_of, run_on_host, run_through_the_runner, totals_of

pytestmark = pytest.mark.docker


@pytest.mark.parametrize("project", [*PYTHON_PROJECTS, *JAVASCRIPT_PROJECTS], ids=lambda project: project.name)
def test_a_real_projects_tests_give_the_same_totals_through_the_runner(project: Project, tmp_path, ci_image,
                                                                        monkeypatch):
    monkeypatch.setenv("PROTOLINK_CI_DIR", str(tmp_path / "jobs"))
    on_host = run_on_host(project, unpack(project, tmp_path / "host"))
    report = run_through_the_runner(project, unpack(project, tmp_path / "sandboxed"), tmp_path / "out", image=ci_image)
    assert report["outcome"] in ("passed", "failed"), report["error"]
    assert on_host.totals == totals_of(report["junit"]["totals"]) == project.expected
    setup, test = report["phases"]
    assert setup["network"] == "allow-list" and test["network"] == "none"
    allowed = {rule.rsplit(":", 1)[0] for rule in INDEX_HOSTS[kind_of(project)]}
    reached = {decision["host"] for decision in report["egress"]["decisions"] if decision["kind"] == "allowed"}
    assert reached and reached <= allowed
    assert [decision for decision in report["egress"]["decisions"] if decision["phase"] == "test"] == []
    assert list((tmp_path / "jobs").iterdir()) == []
