"""The CI runner: an untrusted repository's build and tests in a sandbox, with a report.

``protolink-sandbox ci REPO --setup CMD --allow HOST -- TEST_CMD`` on the command line
(:mod:`.command`); :func:`run_job` (async) and :func:`run_job_sync` in Python, on a
:class:`CiJob`. How it runs: :mod:`.runner`; the report and exit codes: :mod:`.report`.
"""

from __future__ import annotations

from .job import CiJob, OutputLimits
from .report import CiReport
from .runner import run_job, run_job_sync

__all__ = ["CiJob", "CiReport", "OutputLimits", "run_job", "run_job_sync"]
