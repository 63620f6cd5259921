"""``protolink-sandbox exec -- true`` against ``docker exec NAME true``, on one running appliance.

Needs a Docker Engine and the sandbox image (built when missing)::

    python bench/cli.py [--name NAME] [--runs N]

Without ``--name`` it starts an appliance of its own (``protolink-sandbox up`` over a temporary
read-only root, under a name of its own) and removes it at the end. The two commands take turns,
so each sees the machine as the other does; one run prints the median of each and their ratio
(target: ``protolink-sandbox exec`` <= 1.5x ``docker exec``), beside two floors: the interpreter
starting and ending (what any Python client pays), and with grpc imported (what a grpcio
client pays). The timed commands run with bytecode written and read, as an installed command
does, even when ``PYTHONDONTWRITEBYTECODE`` is set here (it would compile every module of an
editable checkout on every run).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

TARGET = 1.5
CLI = str(Path(sys.executable).with_name("protolink-sandbox"))
GRPC_FLOOR = [sys.executable, "-c", "import os, grpc; os._exit(0)"]
PYTHON_FLOOR = [sys.executable, "-c", "pass"]
ENV = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}


def quietly(argv: list[str]) -> None:
    """Run ``argv``; its output is shown only when it fails."""
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed (exit {done.returncode}):\n{done.stdout}{done.stderr}")


def once(argv: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=ENV)
    return time.perf_counter() - started


def medians(runs: int, *commands: list[str]) -> list[float]:
    """The median time of each command, the commands taking turns."""
    for argv in commands:
        once(argv)  # warm
    timings: list[list[float]] = [[] for _ in commands]
    for _ in range(runs):
        for argv, times in zip(commands, timings):
            times.append(once(argv))
    return [statistics.median(times) for times in timings]


def compare(name: str, runs: int) -> None:
    load = os.getloadavg()[0]
    cli, docker, python, grpc = medians(runs, [CLI, "exec", "--name", name, "--", "true"],
                                        ["docker", "exec", name, "true"], PYTHON_FLOOR, GRPC_FLOOR)
    print(f"appliance {name}; median of {runs} runs each, in turns; load average {load:.1f} -> "
          f"{os.getloadavg()[0]:.1f}")
    print(f"{'protolink-sandbox exec -- true':<34}{cli * 1e3:>9.1f} ms")
    print(f"{'docker exec NAME true':<34}{docker * 1e3:>9.1f} ms")
    verdict = "met" if cli / docker <= TARGET else "not met"
    print(f"{'ratio (target <= ' + format(TARGET, 'g') + ')':<34}{cli / docker:>9.2f}    {verdict}")
    print(f"{'floor: python starts and exits':<34}{python * 1e3:>9.1f} ms (ratio {python / docker:.2f})")
    print(f"{'floor: python, import grpc, exit':<34}{grpc * 1e3:>9.1f} ms (ratio {grpc / docker:.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", help="a running appliance (default: start one of its own)")
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    if args.name:
        compare(args.name, args.runs)
        return
    name = f"protolink-bench-cli-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory(prefix="protolink-bench-cli-") as root:
        Path(root).chmod(0o755)
        quietly([CLI, "up", "--name", name, "--root", root])
        try:
            compare(name, args.runs)
        finally:
            quietly([CLI, "down", "--name", name])


if __name__ == "__main__":
    main()
