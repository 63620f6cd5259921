"""``protolink-sandbox audit verify``, run as the installed command: exit 0 with the count and
head hash of an intact log, 1 with a line per problem, and the runtime directory's log by default."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from protolink.sandbox.service.audit import AuditLog

COMMAND = str(Path(sys.executable).parent / "protolink-sandbox")


def _verify(*args: str, runtime: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PROTOLINK_RUNTIME_DIR": str(runtime)}
    return subprocess.run([COMMAND, "audit", "verify", *args], capture_output=True, text=True, env=env, timeout=120)


def _write(path: Path, count: int) -> str:
    with AuditLog(path) as log:
        for number in range(count):
            log.record("egress", {"host": "example.com", "port": 443, "allowed": number % 2 == 0})
        return log.head


def test_an_intact_log_in_the_runtime_directory_is_verified_by_default(tmp_path):
    runtime = tmp_path / "run"
    path = runtime / "protolink-appliance.service.audit.jsonl"  # the log of the service `up` starts
    head = _write(path, 3)
    done = _verify(runtime=runtime)
    assert (done.returncode, done.stdout) == (0, f"{path}: intact, 3 records, "
                                                 f"head sha256:{head}\n"), done.stderr


def test_the_log_is_verified_in_a_runtime_directory_too_long_for_a_socket(tmp_path):
    runtime = tmp_path / ("r" * 80)  # reading the log makes no socket
    head = _write(runtime / "protolink-appliance.service.audit.jsonl", 2)
    done = _verify(runtime=runtime)
    assert (done.returncode, done.stdout.endswith(f": intact, 2 records, head sha256:{head}\n")) == (0, True), done.stderr


def test_a_tampered_log_exits_1_with_a_line_per_problem(tmp_path):
    path = tmp_path / "logs" / "audit.jsonl"
    _write(path, 5)
    lines = path.read_bytes().splitlines(keepends=True)
    lines[1] = lines[1].replace(b'"port":443', b'"port":22')
    del lines[3]
    path.write_bytes(b"".join(lines) + b"{cut")
    done = _verify(str(path), runtime=tmp_path / "run")
    assert done.returncode == 1, done.stderr
    assert [line.split(": ")[1:3] for line in done.stdout.splitlines()] == [
        ["line 2", "changed"], ["line 4", "removed"], ["line 5", "truncated"]]


def test_a_kept_head_that_is_gone_exits_1(tmp_path):
    path = tmp_path / "audit.jsonl"
    kept = _write(path, 3)
    assert _verify(str(path), "--head", f"sha256:{kept}", runtime=tmp_path / "run").returncode == 0
    path.write_bytes(b"".join(path.read_bytes().splitlines(keepends=True)[:-1]))
    done = _verify(str(path), "--head", f"sha256:{kept}", runtime=tmp_path / "run")
    assert (done.returncode, done.stdout) == (1, f"{path}: line 2: missing head: no line has the kept head "
                                                 f"sha256:{kept}: the records after it were removed, or the "
                                                 f"file rewritten\n"), done.stderr


def test_a_missing_log_exits_1_saying_so(tmp_path):
    done = _verify(str(tmp_path / "none.jsonl"), runtime=tmp_path / "run")
    assert (done.returncode, done.stdout) == (1, "")
    assert "cannot read the audit log" in done.stderr and "none.jsonl" in done.stderr
