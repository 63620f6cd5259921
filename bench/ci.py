"""The CI runner against the same commands run directly on the host.

Needs a Docker Engine, the CI image (built when missing: ``make ci-image``) and the package
indexes (PyPI, npm)::

    python bench/ci.py [--projects six,toolz] [--overhead-runs N]

One run prints, side by side:
  1. for each validation project of tests/ci_projects.py (the host and the runner take turns):
     the setup phase's wall time through the runner against the host's (target <= 1.3x) and the
     test phase's (target <= 1.15x), and whether both gave the same totals; beside them, the
     same commands with the image's own tools (its Python, Node.js and npm) in a plain
     ``docker run`` on the host's network: no sandbox, no proxy, nice 0. The runner against that
     is what the runner costs; that against the host is what the image's tools cost;
  2. the runner's own overhead: ``protolink-sandbox ci`` of a repository whose test is ``true``,
     wall time, median of N (target <= 1.5 s), with where its time goes (the report's
     ``timings``: the image check, the workspace copy, the sandbox's start and removal, the
     collection, the clean-up; the rest is the interpreter starting and importing), beside
     ``docker run --rm`` of the same image, the engine's own container start.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from protolink.wire.trust import CA_VARIABLES  # noqa: E402
from protolink.sandbox.provision import ensure_image  # noqa: E402
from tests.ci_projects import ALL_PROJECTS, JAVASCRIPT_PROJECTS, PYTHON_PROJECTS, Project, unpack  # noqa: E402
from tests.ci_runs import (  # noqa: E402
    CA_FILE, CLI, RUN_TIMEOUT_SECONDS, run_on_host, run_through_the_runner, totals_of)

SETUP_TARGET = 1.3
TEST_TARGET = 1.15
OVERHEAD_TARGET = 1.5
STEPS = ("image", "workspace", "sandbox_start", "sandbox_stop", "collect", "cleanup")


def load() -> str:
    return " ".join(f"{value:.1f}" for value in os.getloadavg())


#: Runs in the image: each setup command and then the test command (without the variables named
#: third, as the runner's), timed; prints the two phases' seconds.
_TIMED_PHASES = """
import json, os, shlex, subprocess, sys, time
setup, test, setup_only = json.loads(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
started = time.perf_counter()
for command in setup:
    subprocess.run(["/bin/sh", "-c", command], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
middle = time.perf_counter()
env = {name: value for name, value in os.environ.items() if name not in setup_only}
subprocess.run(shlex.split(test), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(json.dumps([middle - started, time.perf_counter() - middle]))
"""


def in_plain_container(project: Project, repository: Path, image: str) -> tuple[float, float]:
    """The project's setup and test seconds with the image's tools in a plain ``docker run`` on
    the host's network (no sandbox, no proxy, nice 0; caches empty, the host's CA trusted during
    setup as the runner's jobs are told to), timed inside the container, its start left out."""
    env = ["-e", "CI=true", "-e", "HOME=/tmp/home", *(f"--env={name}={CA_FILE}" for name in CA_VARIABLES)]
    done = subprocess.run(
        ["docker", "run", "--rm", "--network", "host", "--user", f"{os.getuid()}:{os.getgid()}", *env,
         "--volume", f"{repository}:{repository}", "--volume", f"{CA_FILE}:{CA_FILE}:ro", "--workdir", str(repository),
         "--entrypoint", "python3", image, "-c", _TIMED_PHASES, json.dumps(project.setup), project.test,
         json.dumps(CA_VARIABLES)],
        check=True, capture_output=True, text=True, timeout=RUN_TIMEOUT_SECONDS, stdin=subprocess.DEVNULL)
    setup, test = json.loads(done.stdout)
    return setup, test


def projects(args: argparse.Namespace) -> None:
    chosen = [project for project in ALL_PROJECTS if not args.projects or project.name in args.projects]
    image = ensure_image("ci", progress=lambda line: None)
    print(f"1. validation projects (image {image}; load {load()})")
    print("| project | setup: runner, host (ratio) | test: runner, host (ratio) | same totals "
          "| setup, test: image's tools without the runner (runner against it) |")
    print("| --- | --- | --- | --- | --- |")
    for project in chosen:
        with tempfile.TemporaryDirectory(prefix="bench-ci-") as scratch:
            work = Path(scratch)
            host = run_on_host(project, unpack(project, work / "host"))
            report = run_through_the_runner(project, unpack(project, work / "sandboxed"), work / "out", image=image)
            plain_setup, plain_test = in_plain_container(project, unpack(project, work / "plain"), image)
            setup, test = (phase["duration_seconds"] for phase in report["phases"])
            same = host.totals == totals_of(report["junit"]["totals"]) if report["junit"] else False
            print(f"| {project.name} {project.version} | {setup:.1f}, {host.setup_seconds:.1f} s "
                  f"({setup / host.setup_seconds:.2f}x) | {test:.2f}, {host.test_seconds:.2f} s "
                  f"({test / host.test_seconds:.2f}x) | {'yes' if same else 'NO: ' + report['outcome']} "
                  f"| {plain_setup:.1f}, {plain_test:.2f} s ({setup / plain_setup:.2f}x, {test / plain_test:.2f}x) |",
                  flush=True)
    print(f"targets: setup <= {SETUP_TARGET}x, test <= {TEST_TARGET}x; load at the end {load()}")


def overhead(runs: int) -> None:
    image = ensure_image("ci", progress=lambda line: None)
    walls, floors, steps = [], [], {step: [] for step in STEPS}
    with tempfile.TemporaryDirectory(prefix="bench-ci-true-") as scratch:
        repo = Path(scratch) / "repo"
        repo.mkdir()
        (repo / "README").write_text("a repository whose test is `true`\n")
        for _ in range(runs):
            started = time.perf_counter()
            subprocess.run([CLI, "ci", str(repo), "--image", image, "--report", f"{scratch}/report.json",
                            "--", "true"], check=True, capture_output=True, stdin=subprocess.DEVNULL)
            walls.append(time.perf_counter() - started)
            timings = json.loads(Path(f"{scratch}/report.json").read_text())["timings"]
            for step in STEPS:
                steps[step].append(timings.get(step, 0.0))
            started = time.perf_counter()
            subprocess.run(["docker", "run", "--rm", "--network", "none", "--entrypoint", "/bin/true", image],
                           check=True, capture_output=True, stdin=subprocess.DEVNULL)
            floors.append(time.perf_counter() - started)
    wall = statistics.median(walls)
    accounted = {step: statistics.median(values) for step, values in steps.items()}
    print(f"\n2. runner overhead, a repository whose test is `true`, median of {runs} (load {load()})")
    print(f"protolink-sandbox ci: {wall:.2f} s (target <= {OVERHEAD_TARGET} s: "
          f"{'met' if wall <= OVERHEAD_TARGET else 'not met'}); docker run --rm of the image: "
          f"{statistics.median(floors):.2f} s")
    print("where it goes: " + ", ".join(f"{step} {seconds:.3f} s" for step, seconds in accounted.items())
          + f", interpreter, imports and the command {wall - sum(accounted.values()):.3f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--projects", type=lambda text: set(text.split(",")), default=None,
                        help=f"comma-separated names (default: all of {', '.join(p.name for p in ALL_PROJECTS)})")
    parser.add_argument("--overhead-runs", type=int, default=7)
    parser.add_argument("--only", choices=("projects", "overhead"), default=None)
    args = parser.parse_args()
    if args.projects is None:
        args.projects = {project.name for project in (*PYTHON_PROJECTS, *JAVASCRIPT_PROJECTS)}
    if args.only in (None, "projects"):
        projects(args)
    if args.only in (None, "overhead"):
        overhead(args.overhead_runs)


if __name__ == "__main__":
    main()
