"""Where a cold sandbox's start goes: ``DockerSandbox`` started -> first command's result,
step by step, against ``docker run --rm IMAGE /bin/true`` (the engine's own floor) and
against a baseline's code and image, in turns, in one run.

    python bench/cold_start.py --image IMAGE [--baseline main --baseline-image IMAGE] [--runs 10]

Each side runs in a process of its own whose ``protolink`` is that side's code (the baseline's
is a ``git archive`` of the ref), started once and asked for one cold start at a time; the
floor is a ``docker run`` from here. A turn asks each side once, in order; medians over the
turns. The steps: the container's create and start (``_run_container``, from the engine's
create call to its start call's return), until the server answers (the rest of
``DockerSandbox.start``), the first ``/bin/true``; and the CPU the container's cgroup spent by
then (the server's start and the first command: what the sandbox's own code costs, which moves
less with the load than wall time does).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from service import TRUE, _Silent, cpu_seconds  # bench/service.py, beside this file

HERE = Path(__file__).resolve().parent
STEPS = ("total", "container", "ready", "first", "cpu")
TARGET = 1.3


async def one_start(image: str) -> dict[str, float]:
    """One cold start of this process's ``DockerSandbox``: seconds of each step."""
    from protolink.sandbox.docker import DockerSandbox

    sandbox = DockerSandbox(image=image)
    container_steps: list[float] = []
    run_container = sandbox._run_container

    def timed_run_container(*args: Any) -> None:
        began = time.perf_counter()
        try:
            run_container(*args)
        finally:
            container_steps.append(time.perf_counter() - began)

    sandbox._run_container = timed_run_container  # type: ignore[method-assign]
    started = time.perf_counter()
    try:
        backend = await sandbox.start()
        ready = time.perf_counter()
        result = await backend.execute(TRUE, _Silent())
        ran = time.perf_counter()
        assert result.exit_code == 0, result
        cpu = cpu_seconds(await asyncio.to_thread(sandbox.host_pid))
    finally:
        await sandbox.aclose()
    return {"total": ran - started, "container": container_steps[0], "ready": ready - started - container_steps[0],
            "first": ran - ready, "cpu": cpu}


def serve(image: str) -> None:
    """Answer each line on stdin with one cold start's steps, as a JSON line."""
    for _ in sys.stdin:
        print(json.dumps(asyncio.run(one_start(image))), flush=True)


def docker_run(image: str) -> float:
    started = time.perf_counter()
    subprocess.run(["docker", "run", "--rm", "--network", "none", "--entrypoint", "/bin/true", image], check=True,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


class Side:
    """A process of ``code``'s that starts sandboxes of ``image`` when asked."""

    def __init__(self, code: Path, image: str) -> None:
        self.image = image
        self._process = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--serve", "--image", image], cwd=code,
            env={**os.environ, "PYTHONPATH": f"{code}{os.pathsep}{HERE}"}, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True)

    def start_one(self) -> dict[str, float]:
        assert self._process.stdin is not None and self._process.stdout is not None
        self._process.stdin.write("\n")
        self._process.stdin.flush()
        line = self._process.stdout.readline()
        if not line:
            raise RuntimeError(f"the side of {self.image} ended (exit {self._process.wait()})")
        return json.loads(line)

    def close(self) -> None:
        if self._process.stdin is not None:
            self._process.stdin.close()
        self._process.wait(timeout=60)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f}"


def main(args: argparse.Namespace) -> None:
    if args.serve:
        serve(args.image)
        return
    archive = None
    sides = {"this": (HERE.parent, args.image)}
    if args.baseline:
        archive = Path(tempfile.mkdtemp(prefix="pl-cold-base-"))
        tar = subprocess.run(["git", "-C", str(HERE.parent), "archive", args.baseline], check=True,
                             capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(archive)], input=tar, check=True)
        sides = {args.baseline: (archive, args.baseline_image or args.image), **sides}
    running = {name: Side(code, image) for name, (code, image) in sides.items()}
    found: dict[str, list[dict[str, float]]] = {name: [] for name in running}
    floor: list[float] = []
    print(f"{os.cpu_count()} CPUs; {args.runs} turns; load at start {os.getloadavg()[0]:.1f}", flush=True)
    try:
        for _ in range(args.runs):
            for name, side in running.items():
                found[name].append(side.start_one())
            floor.append(docker_run(args.image))
    finally:
        for side in running.values():
            side.close()
        if archive is not None:
            shutil.rmtree(archive, ignore_errors=True)
    docker = statistics.median(floor)
    print(f"load at end {os.getloadavg()[0]:.1f}; medians in ms\n")
    header = f"{'':<28}" + "".join(f"{name:>12}" for name in running) + f"{'docker run':>12}"
    print(header)
    medians = {name: {step: statistics.median(run[step] for run in runs) for step in STEPS}
               for name, runs in found.items()}
    labels = {"total": "start -> first result", "container": "  create + start (engine)",
              "ready": "  until the server answers", "first": "  first /bin/true", "cpu": "  sandbox's CPU by then"}
    for step in STEPS:
        cells = "".join(f"{ms(medians[name][step]):>12}" for name in running)
        print(f"{labels[step]:<28}{cells}{ms(docker) if step == 'total' else '':>12}")
    ratios = "".join(f"{medians[name]['total'] / docker:>11.2f}x" for name in running)
    print(f"{'ratio to docker run --rm':<28}{ratios}{'(target <= ' + str(TARGET) + 'x)':>24}")
    if args.baseline:
        each = [found["this"][turn]["total"] / found[args.baseline][turn]["total"] for turn in range(args.runs)]
        print(f"\nthis / {args.baseline}, turn by turn: median {statistics.median(each):.2f}x "
              f"(range {min(each):.2f}-{max(each):.2f}x)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--image", required=True, help="this side's sandbox image (and the floor's)")
    parser.add_argument("--baseline", default=None, help="a git ref whose code runs on the other side")
    parser.add_argument("--baseline-image", default=None, help="the baseline's sandbox image (default: --image)")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    main(parser.parse_args())
