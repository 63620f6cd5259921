"""The report says how a job ended, and is written whole or not at all."""

from __future__ import annotations

import json
import os

import pytest

from protolink.sandbox.ci.report import EXIT_INTERRUPTED, EXIT_SETUP_FAILED, CiReport


def test_the_first_end_stays():
    report = CiReport(source="/src")
    report.end("setup_failed", EXIT_SETUP_FAILED, "setup command 'x' exited 1")
    report.end("interrupted", EXIT_INTERRUPTED, "interrupted")
    data = report.to_dict()
    assert (data["outcome"], data["exit_code"], data["error"]) == ("setup_failed", 120, "setup command 'x' exited 1")
    assert data["version"] == 1 and data["repository"]["source"] == "/src"
    assert data["started_at"].endswith("Z") and data["duration_seconds"] >= 0


def test_a_report_that_cannot_be_serialized_leaves_the_old_one(tmp_path):
    path = tmp_path / "report.json"
    CiReport(source="/first").write(path)
    broken = CiReport(source="/second")
    broken.env = [object()]  # not JSON
    with pytest.raises(TypeError):
        broken.write(path)
    assert json.loads(path.read_text())["repository"]["source"] == "/first"
    assert os.listdir(tmp_path) == ["report.json"]
