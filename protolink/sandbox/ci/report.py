"""The JSON report of a CI job, and the runner's exit codes.

The report (``version`` 1) holds: ``outcome`` and ``exit_code``; ``repository`` (source without
credentials, commit, what was copied and left out); ``image``, ``container``, ``runtime``;
``started_at``, ``finished_at`` (ISO 8601, UTC) and ``duration_seconds``; ``phases`` (``setup``
and ``test``: network, commands with argv, exit code, timed out, duration, output bytes, whether
truncated and the output's tail); ``egress`` (the allow-list and every decision); ``resources``
(peak memory and tasks, disk used); ``junit`` (files with their counts, refusals, totals) and
``artifacts``, each empty when the job names none; ``env`` (the names passed in, never their
values); ``timings`` (seconds spent in each step of the runner: ``image``, ``workspace``,
``sandbox_start``, ``sandbox_stop``, ``collect``, ``cleanup``; the commands' own are in
``phases``); ``error`` (what stopped the runner itself, the timeout, or the disk budget when the
sandbox stopped the commands for it; else null).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

#: The runner's own exit codes; any other code is the test command's own.
EXIT_USAGE = 2
EXIT_SETUP_FAILED = 120
EXIT_REPOSITORY = 121
EXIT_TIMED_OUT = 124
EXIT_RUNNER_ERROR = 125
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143

Outcome = Literal["passed", "failed", "setup_failed", "repository_error", "timed_out", "error", "interrupted"]


def iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class CommandRecord:
    """One command of a phase and how it ended."""

    argv: list[str]
    exit_code: int | None = None
    timed_out: bool = False
    duration_seconds: float = 0.0
    output_bytes: int = 0
    truncated: bool = False
    output_tail: str = ""


@dataclass
class PhaseRecord:
    """One phase: ``setup`` (the allow-list's network) or ``test`` (none)."""

    name: str
    network: str
    started_at: str = ""
    duration_seconds: float = 0.0
    commands: list[CommandRecord] = field(default_factory=list)


@dataclass
class CiReport:
    """Everything the runner reports of one job (see the module)."""

    source: str
    outcome: Outcome = "error"
    exit_code: int = EXIT_RUNNER_ERROR
    repository: dict[str, Any] = field(default_factory=dict)
    image: str | None = None
    container: str | None = None
    runtime: str | None = None
    started: float = field(default_factory=time.time)
    finished: float | None = None
    phases: list[PhaseRecord] = field(default_factory=list)
    egress: dict[str, Any] = field(default_factory=lambda: {"allow": [], "decisions": []})
    resources: dict[str, int | None] = field(
        default_factory=lambda: {"memory_peak_bytes": None, "pids_peak": None, "disk_used_bytes": None})
    junit: dict[str, Any] = field(default_factory=dict)
    artifacts: dict[str, Any] = field(default_factory=dict)
    env: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    error: str | None = None

    def end(self, outcome: Outcome, exit_code: int, error: str | None = None) -> None:
        """Set how the job ended (the first end set stays, so an interruption during cleanup
        does not hide the failure that came before it)."""
        if self.finished is None:
            self.outcome, self.exit_code, self.error = outcome, exit_code, error
            self.finished = time.time()

    def to_dict(self) -> dict[str, Any]:
        finished = self.finished if self.finished is not None else time.time()
        return {
            "version": 1,
            "outcome": self.outcome,
            "exit_code": self.exit_code,
            "repository": {"source": self.source, **self.repository},
            "image": self.image,
            "container": self.container,
            "runtime": self.runtime,
            "started_at": iso(self.started),
            "finished_at": iso(finished),
            "duration_seconds": round(finished - self.started, 3),
            "phases": [asdict(phase) for phase in self.phases],
            "egress": self.egress,
            "resources": self.resources,
            "junit": self.junit,
            "artifacts": self.artifacts,
            "env": self.env,
            "timings": self.timings,
            "error": self.error,
        }

    def write(self, path: Path) -> None:
        """Write the report to ``path`` whole or not at all (a temporary file, then a rename)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
        partial.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        os.replace(partial, path)
