"""A project of :mod:`tests.ci_projects` run two ways, timed: directly on this host, and through
``protolink-sandbox ci`` (the CI image, the package index allowed during setup only, this host's
certificate authorities passed in, since the index's TLS may be intercepted here)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from protolink.sandbox.ci.collect import junit_counts
from tests.ci_projects import JUNIT, Project, Totals

#: Where each kind of project's packages come from (the setup phase's allow-list).
INDEX_HOSTS = {"python": ("pypi.org:443", "files.pythonhosted.org:443"), "javascript": ("registry.npmjs.org:443",)}
CA_FILE = "/etc/ssl/certs/ca-certificates.crt"
CLI = os.path.join(os.path.dirname(sys.executable), "protolink-sandbox")
#: Past this a project's run is stuck, not slow (pip and npm download on a shared machine).
RUN_TIMEOUT_SECONDS = 900


@dataclass(frozen=True)
class HostRun:
    """The totals of a run on the host, and the seconds its setup and its tests took."""

    totals: Totals
    setup_seconds: float
    test_seconds: float


def kind_of(project: Project) -> str:
    return "javascript" if project.lockfile is not None else "python"


def totals_of(counts: dict[str, int]) -> Totals:
    return Totals(passed=counts["passed"], failed=counts["failures"], errors=counts["errors"],
                  skipped=counts["skipped"])


def run_on_host(project: Project, repository: Path) -> HostRun:
    """The project's setup and test commands run directly here, timed; its JUnit totals. Like
    the runner's, pip's and npm's caches start empty (a directory beside the repository)."""
    caches = repository.parent / f"{repository.name}-caches"
    env = {**os.environ, "CI": "true", "PIP_CACHE_DIR": str(caches / "pip"), "npm_config_cache": str(caches / "npm")}
    started = time.perf_counter()
    for command in project.setup:
        subprocess.run(["/bin/sh", "-c", command], cwd=repository, env=env, check=True, timeout=RUN_TIMEOUT_SECONDS,
                       stdin=subprocess.DEVNULL, capture_output=True)
    setup = time.perf_counter() - started
    subprocess.run(shlex.split(project.test), cwd=repository, env=env, timeout=RUN_TIMEOUT_SECONDS,
                   stdin=subprocess.DEVNULL, capture_output=True)
    test = time.perf_counter() - started - setup
    return HostRun(totals_of(junit_counts((repository / JUNIT).read_bytes())), setup, test)


def run_through_the_runner(project: Project, repository: Path, out: Path, *, image: str = "ci") -> dict[str, Any]:
    """The same commands through ``protolink-sandbox ci``; its report (its exit status checked
    against the report's)."""
    argv = [CLI, "ci", str(repository), "--image", image, "--ca-file", CA_FILE, "--junit", JUNIT,
            "--report", str(out / "report.json"), "--artifacts-dir", str(out / "artifacts"),
            "--timeout", str(RUN_TIMEOUT_SECONDS)]
    for command in project.setup:
        argv += ["--setup", command]
    for host in INDEX_HOSTS[kind_of(project)]:
        argv += ["--allow", host]
    done = subprocess.run([*argv, "--", *shlex.split(project.test)], capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_SECONDS + 120, stdin=subprocess.DEVNULL)
    report = json.loads((out / "report.json").read_text())
    assert report["exit_code"] == done.returncode, done.stderr[-4000:]
    return report
