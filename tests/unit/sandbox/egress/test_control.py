"""The egress daemon's control channel and decision log, on real Unix sockets and files: a daemon
that is missing, silent or dead is a typed error, never a hang; messages are bounded; the log
stays bounded across rotations and reads back as one line per decision."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest

from protolink.errors import SandboxProtocolError
from protolink.sandbox.egress.control import (
    MAX_MESSAGE,
    EgressDaemonUnresponsiveError,
    EgressFiles,
    EgressRequestError,
    NoEgressDaemonError,
    ask,
    encode,
    read_message,
    refusal,
    stop_daemon,
)
from protolink.sandbox.egress.eventlog import EventLog, Tail, describe, previous, recent
from protolink.sandbox.leftovers import process_owner


@pytest.fixture
def runtime(tmp_path, monkeypatch):
    path = tmp_path / "run"
    path.mkdir(mode=0o700)
    monkeypatch.setenv("PROTOLINK_RUNTIME_DIR", str(path))
    return path


async def serve(path, answer):
    """A control socket at ``path`` that handles each connection with ``answer(reader, writer)``."""
    return await asyncio.start_unix_server(answer, path)


async def test_an_answer_comes_back_and_a_refusal_is_a_typed_error(runtime):
    async def answer(reader, writer):
        request = await read_message(reader)
        if request["op"] == "set":
            writer.write(encode(refusal("bad-rule", "bad rule 'x y': spaces")))
        else:
            writer.write(encode({"ok": True, "allow": ["pypi.org"], "echo": request}))
        writer.close()

    server = await serve(EgressFiles.of("box").socket, answer)
    async with server:
        answered = await ask("box", "status")
        assert answered["allow"] == ["pypi.org"] and answered["echo"] == {"op": "status"}
        with pytest.raises(EgressRequestError, match="bad rule 'x y'") as refused:
            await ask("box", "set", allow=["x y"])
        assert isinstance(refused.value, ValueError)


async def test_no_daemon_says_how_to_start_one(runtime):
    with pytest.raises(NoEgressDaemonError, match=r"box has no egress daemon: start it with `protolink-sandbox up "
                                                  r"--allow HOST\[:PORT\]`"):
        await ask("box", "status")


async def test_a_socket_left_by_a_dead_daemon_is_no_daemon_at_once(runtime):
    import socket

    path = EgressFiles.of("box").socket
    left = socket.socket(socket.AF_UNIX)
    left.bind(str(path))
    left.close()  # bound, never listening: refused, as after a SIGKILL
    started = time.monotonic()
    with pytest.raises(NoEgressDaemonError):
        await ask("box", "status")
    assert time.monotonic() - started < 2


async def test_a_daemon_that_never_answers_is_a_timeout_not_a_hang(runtime):
    async def silent(reader, writer):
        await asyncio.sleep(3600)

    async with await serve(EgressFiles.of("box").socket, silent):
        with pytest.raises(EgressDaemonUnresponsiveError, match="did not answer within 0.3 s") as error:
            await ask("box", "status", timeout=0.3)
    assert isinstance(error.value, TimeoutError)


async def test_messages_are_bounded_and_must_be_json_objects():
    with pytest.raises(SandboxProtocolError, match="at most"):
        encode({"allow": ["x" * MAX_MESSAGE]})
    for data, why in ((b"x" * (MAX_MESSAGE + 10) + b"\n", "longer than"), (b"{nope\n", "not JSON"),
                      (b"[1]\n", "not a JSON object"), (b'{"op"', "closed mid-message")):
        reader = asyncio.StreamReader(limit=MAX_MESSAGE)
        reader.feed_data(data)
        reader.feed_eof()
        with pytest.raises(SandboxProtocolError, match=why):
            await read_message(reader)


def test_the_files_live_in_the_private_runtime_directory(runtime):
    files = EgressFiles.of("my.box")
    assert {path.parent for path in (files.socket, files.pid, files.events, files.log)} == {runtime}
    assert files.socket.name == "my.box.egress.sock" and files.events.name == "my.box.egress.jsonl"
    with pytest.raises(ValueError):
        EgressFiles.of("../escape")


async def test_stop_ends_the_recorded_process_when_it_does_not_answer(runtime):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        files = EgressFiles.of("box")
        files.pid.write_text(json.dumps({"pid": sleeper.pid, "owner": process_owner(sleeper.pid)}))
        files.events.write_text("{}\n")
        assert await stop_daemon("box", timeout=0.5) is True
        assert sleeper.wait(timeout=10) == -15  # SIGTERM, after the grace
        assert [path for path in files.all() if path.exists()] == []
    finally:
        sleeper.kill()


async def test_stop_never_signals_a_process_that_merely_reuses_the_pid(runtime):
    files = EgressFiles.of("box")
    files.pid.write_text(json.dumps({"pid": os.getpid(), "owner": process_owner(os.getpid()) + "0"}))
    assert await stop_daemon("box", timeout=0.1) is False  # and this test is still alive
    assert not files.pid.exists()


@dataclass(frozen=True)
class Event:
    """An event of the shape EgressEvent has."""

    sandbox: str = "box"
    kind: str = "denied"
    host: str = "pypi.org"
    port: int = 443
    address: str | None = None
    bytes_up: int = 0
    bytes_down: int = 0
    duration_seconds: float = 0.0
    reason: str = "deny-all"
    method: str = "CONNECT"
    timestamp: float = 1796148081.9667


def written(path, count, max_bytes):
    """``path`` after a log rotating past ``max_bytes`` recorded ``count`` events (ports 0, 1, ...)."""
    log = EventLog(path, max_bytes=max_bytes)
    for number in range(count):
        log.write(Event(port=number))
    log.close()
    return path


def test_the_log_is_private_bounded_and_reads_back_across_a_rotation(tmp_path):
    path = written(tmp_path / "box.egress.jsonl", 200, 8192)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.stat().st_size <= 8192 + 512 and previous(path).stat().st_size <= 8192 + 512
    last = recent(path, 30)
    assert [record["port"] for record in last] == list(range(170, 200))  # across both parts, in order
    assert last[-1]["time"] == "2026-12-01T18:01:21.966Z" and last[-1]["kind"] == "denied"


def test_tail_sees_what_is_appended_after_it_starts_even_across_rotations(tmp_path):
    path = tmp_path / "box.egress.jsonl"
    log = EventLog(path, max_bytes=2048)
    log.write(Event(port=1))
    tail = Tail(path)
    assert tail.read() == []  # what was there before is recent()'s
    seen = []
    for number in range(2, 60):
        log.write(Event(port=number))
        if number % 7 == 0:
            seen += tail.read()
    seen += tail.read()
    log.close()
    tail.close()
    assert [record["port"] for record in seen] == list(range(2, 60))


def test_foreign_lines_are_skipped(tmp_path):
    path = tmp_path / "box.egress.jsonl"
    path.write_bytes(b'not json\n[1]\n' + b'{"x":"' + b"y" * 10000 + b'"}\n{"kind":"closed","port":80}\n')
    assert recent(path, 10) == [{"kind": "closed", "port": 80}]


def test_a_decision_is_one_line_with_everything_a_reader_needs():
    line = describe({"time": "2026-12-01T18:03:22.123Z", "kind": "closed", "host": "pypi.org", "port": 443,
                     "address": "203.0.113.80", "bytes_up": 1200, "bytes_down": 5_300_000, "duration_seconds": 1.25,
                     "reason": "eof"})
    assert line == "2026-12-01T18:03:22.123Z  closed   pypi.org:443  203.0.113.80  up 1.2 kB down 5.3 MB  1.250 s  eof"
    assert describe({"kind": "denied", "host": "::1", "port": 80, "reason": "an IP literal"}).startswith(
        "?  denied   [::1]:80  -  up ? down ?  ? s  an IP literal")


def test_a_new_log_forgets_the_previous_appliance_of_that_name(tmp_path):
    path = written(tmp_path / "box.egress.jsonl", 10, 512)
    assert previous(path).exists()
    EventLog(path).close()
    assert recent(path, 10) == [] and not previous(path).exists()
