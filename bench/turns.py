"""Turns of one benchmark with two codes in one run: a baseline git ref's and this checkout's.

A benchmark script runs each turn as ``SCRIPT --one ARGS`` in a process of its own, whose
``protolink`` (on ``PYTHONPATH``, and the working directory) is the side's code, and prints that
turn's figures as a JSON object on its last line.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

CHECKOUT = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def sides(baseline: str | None) -> Iterator[dict[str, Path]]:
    """Each side's name and code: ``baseline``'s (a ``git archive`` of it, removed at the end)
    first when given, then this checkout's as ``this``."""
    if baseline is None:
        yield {"this": CHECKOUT}
        return
    archive = Path(tempfile.mkdtemp(prefix="pl-bench-base-"))
    try:
        tar = subprocess.run(["git", "-C", str(CHECKOUT), "archive", baseline], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(archive)], input=tar, check=True)
        yield {baseline: archive, "this": CHECKOUT}
    finally:
        shutil.rmtree(archive, ignore_errors=True)


def run_turn(script: str, code: Path, *args: str) -> dict[str, Any]:
    """The figures of one turn of ``script`` with ``args``, run on ``code``."""
    answer = subprocess.run([sys.executable, str(Path(script).resolve()), "--one", *args], cwd=code,
                            env={**os.environ, "PYTHONPATH": str(code)}, check=True, capture_output=True, text=True)
    return json.loads(answer.stdout.strip().splitlines()[-1])


def print_turns(script: str, baseline: str | None, turns: int, args: Sequence[str], columns: Sequence[str], *,
                width: int, scale: float = 1.0) -> None:
    """Run ``turns`` turns of each side in turn, printing a row each: its ``columns`` (each
    figure times ``scale``, ``width`` wide) and the load average after it."""
    print(f"{'turn':<6}{'code':<10}" + "".join(f"{column:>{width}}" for column in columns) + "   load")
    with sides(baseline) as codes:
        for turn in range(1, turns + 1):
            for side, code in codes.items():
                found = run_turn(script, code, *args)
                print(f"{turn:<6}{side:<10}" + "".join(f"{found[column] * scale:>{width}.1f}" for column in columns)
                      + f"   {os.getloadavg()[0]:.1f}", flush=True)
