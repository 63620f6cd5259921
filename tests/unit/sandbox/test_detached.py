"""Detached host processes (the service, an egress daemon), with real processes: one that ends
or never answers is a typed error with the end of its log, and killed; ending one signals only
the process its pid record names, SIGKILL when SIGTERM is not enough."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys

import pytest

from protolink.errors import SandboxError, SandboxUnavailableError
from protolink.sandbox import detached
from protolink.sandbox.leftovers import process_owner

HANG_GUARD = 60.0


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


async def never() -> None:
    return None


async def test_one_that_ends_as_it_starts_says_so_with_its_log(tmp_path):
    log = tmp_path / "d.log"
    process = detached.spawn(python("import sys; print('bad flag --x'); sys.exit(3)"), log)
    with pytest.raises(SandboxError, match=r"^the daemon ended as it started \(exit 3\):\nbad flag --x$"):
        await detached.wait_ready(process, never, what="the daemon", log=log, timeout=HANG_GUARD)
    assert stat.S_IMODE(log.stat().st_mode) == 0o600


async def test_one_that_never_answers_is_killed_at_the_timeout(tmp_path):
    log = tmp_path / "d.log"
    process = detached.spawn(python("print('waiting', flush=True); import time; time.sleep(600)"), log)
    # Its log says so before the timeout starts: a Python start-up beside CPU hogs can outlast 0.5 s.
    for _ in range(int(HANG_GUARD / 0.01)):
        if log.read_text() == "waiting\n" or process.poll() is not None:
            break
        await asyncio.sleep(0.01)
    with pytest.raises(SandboxUnavailableError, match=r"^the daemon did not answer within 0.5 s:\nwaiting$"):
        await detached.wait_ready(process, never, what="the daemon", log=log, timeout=0.5)
    assert process.returncode == -9


async def test_the_first_answer_is_returned_and_the_process_runs_on_in_its_own_session(tmp_path):
    log = tmp_path / "d.log"
    ready = tmp_path / "ready"
    process = detached.spawn(python(f"open({str(ready)!r}, 'w').close(); import time; time.sleep(600)"), log)
    try:
        async def answer() -> str | None:
            return "up" if ready.exists() else None

        assert await detached.wait_ready(process, answer, what="the daemon", log=log, timeout=HANG_GUARD) == "up"
        assert process.poll() is None and os.getsid(process.pid) == process.pid
    finally:
        process.kill()
        process.wait()


def test_a_link_in_place_of_the_log_is_refused(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    (tmp_path / "d.log").symlink_to(target)
    with pytest.raises(OSError):
        detached.spawn(python("pass"), tmp_path / "d.log")
    assert target.read_text() == "keep"


def test_a_record_counts_only_while_its_writer_runs(tmp_path):
    pid_file = tmp_path / "d.pid"
    record = {"pid": os.getpid(), "owner": process_owner()}
    pid_file.write_text(json.dumps(record))
    assert detached.running(pid_file) == record
    ended = subprocess.Popen(python("pass"))
    owner = process_owner(ended.pid)
    ended.wait()
    for text in (json.dumps({"pid": ended.pid, "owner": owner}), "{nope", "[]", json.dumps({"owner": owner})):
        pid_file.write_text(text)
        assert detached.running(pid_file) is None
    assert detached.running(tmp_path / "absent") is None


async def test_end_kills_one_that_ignores_sigterm():
    stubborn = subprocess.Popen(python("import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                                       "print('ready', flush=True); time.sleep(600)"), stdout=subprocess.PIPE)
    try:
        assert stubborn.stdout is not None and stubborn.stdout.readline() == b"ready\n"
        await detached.end({"pid": stubborn.pid, "owner": process_owner(stubborn.pid)}, timeout=0.5)
        assert stubborn.wait(timeout=HANG_GUARD) == -9
    finally:
        stubborn.kill()
        stubborn.wait()


async def test_end_never_signals_a_process_that_merely_reuses_the_pid():
    await detached.end({"pid": os.getpid(), "owner": process_owner() + "0"}, timeout=0.1)  # this test still runs
