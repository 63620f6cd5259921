"""The service's audit log: a chain that verifies, reopens where it ended, survives concurrent
writers in threads, and names each kind of tampering."""

from __future__ import annotations

import hashlib
import json
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from protolink.errors import AuditLogError, SandboxError, SerializationError
from protolink.sandbox.service.audit import GENESIS, AuditLog, canonical, verify


def _log(path: Path, count: int = 5) -> list[bytes]:
    with AuditLog(path) as log:
        for number in range(count):
            log.record("command.ended", {"argv": ["make", f"step-{number}"], "cwd": "/work", "exit": number % 2,
                                         "duration_seconds": 0.5, "bytes": 1024 * number})
    return path.read_bytes().splitlines(keepends=True)


def test_a_fresh_chain_verifies_with_its_count_and_head(tmp_path):
    path = tmp_path / "audit.jsonl"
    with AuditLog(path) as log:
        assert (log.count, log.head) == (0, GENESIS)
        log.record("request", {"token": "alice", "method": "Create"})
        log.record("sandbox.created", {"token": "alice", "sandbox": "sb-1"})
        head = log.head
    report = verify(path)
    assert (report.intact, report.count, report.head) == (True, 2, head)
    first, second = (json.loads(line) for line in path.read_bytes().splitlines())
    assert (first["seq"], first["prev"], first["kind"], first["fields"]) == (1, GENESIS, "request",
                                                                               {"token": "alice", "method": "Create"})
    assert second["seq"] == 2 and first["time"].endswith("Z")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_reopening_continues_the_chain(tmp_path):
    path = tmp_path / "audit.jsonl"
    _log(path, 3)
    with AuditLog(path) as log:
        assert log.count == 3
        log.record("sandbox.removed", {"sandbox": "sb-1"})
    report = verify(path)
    assert (report.intact, report.count) == (True, 4)
    assert json.loads(path.read_bytes().splitlines()[-1])["seq"] == 4


def _rehashed(line: bytes, **changes: object) -> bytes:
    """``line`` with its record (and its fields' ``exit``) changed, and its hash recomputed."""
    record = json.loads(line)
    record["fields"]["exit"] = changes.pop("exit", record["fields"]["exit"])
    record.update(changes)
    del record["hash"]
    return canonical({**record, "hash": hashlib.sha256(canonical(record)).hexdigest()}) + b"\n"


#: How a log of five records is tampered with, and what verify says: (line, kind, words) a problem.
TAMPERING = {
    "a field changed": (lambda lines: [*lines[:2], lines[2].replace(b'"exit":0', b'"exit":7'), *lines[3:]],
                        [(3, "changed", "hash does not match")]),
    "a field changed, hash recomputed": (lambda lines: [*lines[:2], _rehashed(lines[2], exit=7), *lines[3:]],
                                         [(3, "changed", "record 3 was changed and its hash recomputed")]),
    "a line reformatted": (lambda lines: [lines[0], json.dumps(json.loads(lines[1])).encode() + b"\n", *lines[2:]],
                           [(2, "changed", "not in canonical form")]),
    "a middle record removed": (lambda lines: [*lines[:2], *lines[3:]], [(3, "removed", "record 3 is missing")]),
    "the first records removed": (lambda lines: lines[2:], [(1, "removed", "records 1 to 2 are missing")]),
    "a record renumbered far ahead": (lambda lines: [*lines[:4], _rehashed(lines[4], seq=10**15)],
                                      [(5, "removed", "records 5 to 999999999999999 are missing")]),
    "two records removed, one put back later": (lambda lines: [lines[0], lines[3], lines[1], lines[4]],
                                                [(2, "removed", "records 2 to 3: 1 missing"),
                                                 (3, "reordered", "record 2 comes after record 4")]),
    "two records swapped": (lambda lines: [lines[0], lines[2], lines[1], *lines[3:]],
                            [(3, "reordered", "record 2 comes after record 3")]),
    "a record repeated": (lambda lines: [*lines, lines[1]], [(6, "duplicated", "record 2 appears a second time")]),
    "garbage appended": (lambda lines: [*lines, b"not a record\n"], [(6, "malformed", "is not JSON")]),
    "a foreign object appended": (lambda lines: [*lines, b'{"seq": 6}\n'], [(6, "malformed", "is not a record")]),
    "the tail cut mid-line": (lambda lines: [*lines[:4], lines[4][:-40]], [(5, "truncated", "cut short")]),
}


@pytest.mark.parametrize("tampering", TAMPERING)
def test_each_kind_of_tampering_is_found_and_named(tmp_path, tampering):
    path = tmp_path / "audit.jsonl"
    change, expected = TAMPERING[tampering]
    path.write_bytes(b"".join(change(_log(path))))
    problems = verify(path).problems
    assert [(problem.line, problem.kind) for problem in problems] == [(line, kind) for line, kind, _ in expected]
    for problem, (_, _, words) in zip(problems, expected):
        assert words in str(problem)


@pytest.mark.parametrize("tampering", ["the tail cut mid-line", "garbage appended", "a foreign object appended"])
def test_a_log_whose_tail_is_not_a_record_is_not_continued(tmp_path, tampering):
    path = tmp_path / "audit.jsonl"
    change, [(_, _, words)] = TAMPERING[tampering]
    path.write_bytes(data := b"".join(change(_log(path))))
    with pytest.raises(AuditLogError, match=f"cannot be continued: its last line .*{words}.*audit verify"):
        AuditLog(path)
    assert path.read_bytes() == data  # refused, untouched


def test_the_last_records_removed_are_found_only_with_a_kept_head(tmp_path):
    path = tmp_path / "audit.jsonl"
    _log(path, 3)
    with AuditLog(path) as log:
        kept = log.head
    assert verify(path, kept_head=f"sha256:{kept}").intact
    lines = _log(path, 2)  # two more records after the kept head
    path.write_bytes(b"".join(lines[:-3]))  # the kept head's record and the two after it
    assert verify(path).intact  # a shorter chain is still a chain
    problems = verify(path, kept_head=kept.upper()).problems
    assert [(p.line, p.kind) for p in problems] == [(2, "missing head")]
    assert f"sha256:{kept}" in str(problems[0])
    with pytest.raises(ValueError, match="64 hex digits"):
        verify(path, kept_head="sha256:1234")


def test_concurrent_appends_from_threads_keep_one_valid_chain(tmp_path):
    path = tmp_path / "audit.jsonl"
    threads, each = 8, 200
    start = threading.Barrier(threads)
    with AuditLog(path) as log:
        def append(worker: int) -> None:
            start.wait(timeout=60)
            for number in range(each):
                log.record("command.started", {"worker": worker, "number": number})

        workers = [threading.Thread(target=append, args=(worker,)) for worker in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(timeout=120)
    report = verify(path)
    assert (report.intact, report.count) == (True, threads * each), report.problems
    seen = {(r["fields"]["worker"], r["fields"]["number"]) for r in map(json.loads, path.read_bytes().splitlines())}
    assert len(seen) == threads * each


def test_a_second_writer_is_refused_until_the_first_closes(tmp_path):
    path = tmp_path / "audit.jsonl"
    with AuditLog(path) as log:
        log.record("request", {})
        with pytest.raises(AuditLogError, match="open for writing elsewhere"):
            AuditLog(path)
        other = subprocess.run([sys.executable, "-c", "import sys\nfrom protolink.sandbox.service.audit import "
                                "AuditLog\nAuditLog(sys.argv[1])", str(path)], capture_output=True, text=True,
                               timeout=120)
        assert other.returncode != 0 and "open for writing elsewhere" in other.stderr
    with AuditLog(path) as log:
        log.record("request", {})
    assert verify(path).count == 2


def test_fields_that_are_not_json_are_refused_and_leave_the_chain_as_it_was(tmp_path):
    path = tmp_path / "audit.jsonl"
    with AuditLog(path) as log:
        log.record("request", {"token": "alice"})
        with pytest.raises(SerializationError, match="not JSON"):
            log.record("request", {"when": object()})
        with pytest.raises(SerializationError, match="not JSON"):
            log.record("command.ended", {"duration_seconds": float("nan")})
        with pytest.raises(SerializationError, match="kind"):
            log.record("", {})
        log.record("request", {"token": "bob"})
    assert (verify(path).intact, verify(path).count) == (True, 2)


#: Appends a record that the file size limit cuts short, then one that fits, in a process of its own.
CUT_SHORT = """import os, resource, signal, sys
from protolink.errors import AuditLogError
from protolink.sandbox.service.audit import AuditLog
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
log = AuditLog(sys.argv[1])
resource.setrlimit(resource.RLIMIT_FSIZE, (os.path.getsize(sys.argv[1]) + 100, resource.RLIM_INFINITY))
try:
    log.record("file.written", {"path": "/work/big", "data": "x" * 1000})
except AuditLogError as error:
    print(error)
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
log.record("request", {"after": "the failed write"})
log.close()
"""


def test_a_record_the_disk_refuses_is_cut_back_and_the_chain_goes_on(tmp_path):
    path = tmp_path / "audit.jsonl"
    _log(path, 2)
    done = subprocess.run([sys.executable, "-c", CUT_SHORT, str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"cannot write to the audit log {path}: only 100 of ")
    report = verify(path)
    assert (report.intact, report.count) == (True, 3), report.problems
    assert json.loads(path.read_bytes().splitlines()[-1])["fields"] == {"after": "the failed write"}


def test_a_log_others_can_read_or_in_an_open_directory_is_refused(tmp_path):
    loose = tmp_path / "loose.jsonl"
    loose.write_bytes(b"")
    loose.chmod(0o644)
    with pytest.raises(AuditLogError, match="only its owner"):
        AuditLog(loose)
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    with pytest.raises(SandboxError, match="only its owner can open"):
        AuditLog(shared / "audit.jsonl")
    assert not (shared / "audit.jsonl").exists()


def test_a_missing_log_cannot_be_verified(tmp_path):
    with pytest.raises(AuditLogError, match="cannot read"):
        verify(tmp_path / "none.jsonl")



def test_each_line_is_its_records_canonical_json_whatever_the_fields_hold(tmp_path):
    path = tmp_path / "audit.jsonl"
    with AuditLog(path) as log:
        log.record("command.ended", {"argv": ("/bin/echo", "caf\u00e9 \u2028 \"quoted\""), "exit_code": None,
                                     "duration_seconds": 1e-7, "nested": {"b": [1, 2.5, -0.0], "a": {}}})
        log.record("kind with \"quotes\" and \u00e9", {})
        log.record("request", {"by_number": {3: "three", 1: "one"}, "list": [{2: True}]})  # JSON makes them strings
    report = verify(path)
    assert (report.intact, report.count) == (True, 3), report.problems
    lines = path.read_bytes().splitlines()
    assert all(canonical(json.loads(line)) == line for line in lines)
    third = json.loads(lines[2])
    assert third["fields"] == {"by_number": {"1": "one", "3": "three"}, "list": [{"2": True}]}
    assert json.loads(lines[0])["fields"]["argv"] == ["/bin/echo", "caf\u00e9 \u2028 \"quoted\""]
