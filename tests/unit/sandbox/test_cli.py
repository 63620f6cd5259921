"""``protolink-sandbox``: what ``status`` says about time, the ``exec`` path, which reaches a
running appliance through ``up``'s record, without the Docker Engine or its SDK, and ``egress``
without a daemon: its log read back and followed, and the error when there is none."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

from protolink.sandbox import records
from protolink.sandbox.cli import main, when
from tests.sandbox_server import sandbox_server

#: Runs the command line, then says which of these modules it loaded.
WITH_MODULES = ("import sys\nfrom protolink.sandbox import cli\ncode = cli.main(sys.argv[1:])\n"
                "print(sorted(m for m in ('docker', 'protolink.sandbox.docker', 'protolink.sandbox.provision') "
                "if m in sys.modules), file=sys.stderr)\nsys.exit(code)")


def test_times_are_iso_8601_with_how_long_ago_or_ahead():
    created = 1796130583  # 2026-12-01T13:09:43Z
    assert when(created, created + 12.4) == "2026-12-01T13:09:43Z (12 s ago)"
    assert when(created, created + 5 * 60 + 59) == "2026-12-01T13:09:43Z (5 min ago)"
    assert when(created, created + 3 * 3600) == "2026-12-01T13:09:43Z (3 h ago)"
    assert when(created, created + 2 * 86400 + 7) == "2026-12-01T13:09:43Z (2 d ago)"
    assert when(created, created - 90) == "2026-12-01T13:09:43Z (in 1 min)"


async def test_exec_reaches_the_recorded_appliance_without_the_engine(tmp_path, monkeypatch):
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("PROTOLINK_RUNTIME_DIR", str(runtime))
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")  # any question to it would fail
    async with sandbox_server([]) as server:
        records.save(records.Record("unit-appliance", "0123456789ab", server.address), None)
        done = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-c", WITH_MODULES, "exec", "--name", "unit-appliance", "--",
                             "/bin/sh", "-c", "echo from the appliance; exit 3"],
            capture_output=True, text=True, env=os.environ.copy(), timeout=120)
    assert (done.returncode, done.stdout) == (3, "from the appliance\n"), done.stderr
    assert done.stderr.splitlines()[-1] == "[]"  # neither the docker SDK nor the image tooling


def test_egress_log_prints_recent_decisions_then_follows_new_ones(tmp_path, monkeypatch):
    from protolink.sandbox.egress.control import EgressFiles

    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("PROTOLINK_RUNTIME_DIR", str(runtime))
    events = EgressFiles.of("unit-appliance").events
    line = ('{"time":"2026-12-01T18:06:4%d.000Z","kind":"denied","host":"example.com","port":443,"address":null,'
            '"bytes_up":0,"bytes_down":0,"duration_seconds":0.0,"reason":"example.com is not on the allow-list"}\n')
    events.write_text(line % 1)
    shown = subprocess.run([sys.executable, "-m", "protolink.sandbox.cli", "egress", "--name", "unit-appliance", "--log"],
                           capture_output=True, text=True, timeout=120)
    assert shown.stdout == ("2026-12-01T18:06:41.000Z  denied   example.com:443  -  up 0 B down 0 B  0.000 s  "
                            "example.com is not on the allow-list\n"), shown.stderr

    follower = subprocess.Popen([sys.executable, "-m", "protolink.sandbox.cli", "egress", "--name", "unit-appliance",
                                 "--log", "--follow"], stdout=subprocess.PIPE, text=True)
    try:
        assert follower.stdout.readline().startswith("2026-12-01T18:06:41.000Z  denied")
        with events.open("a") as out:
            out.write(line % 2)
        assert follower.stdout.readline().startswith("2026-12-01T18:06:42.000Z  denied")  # within 0.2 s
    finally:
        follower.kill()
        follower.wait()


def test_egress_of_an_appliance_without_a_daemon_is_a_clear_error(tmp_path, monkeypatch):
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("PROTOLINK_RUNTIME_DIR", str(runtime))
    for args in (["--deny-all"], ["--log"]):
        done = subprocess.run([sys.executable, "-m", "protolink.sandbox.cli", "egress", "--name", "nothing", *args],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 1 and "nothing has no egress" in done.stderr, done.stderr


def test_each_verbs_help_opens_with_what_it_does(capsys):
    for argv, opening in ((["up"], "build when needed, start the appliance"),
                          (["down"], "remove the appliance, its sandbox service"),
                          (["serve"], "run the sandbox service in the foreground"),
                          (["audit", "verify"], "check every record's hash and link"),
                          (["egress"], "Without options: show the allow-list.")):
        with pytest.raises(SystemExit) as exited:
            main([*argv, "--help"])
        assert exited.value.code == 0
        assert opening in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--help"])
    top = capsys.readouterr().out
    assert "A long-running sandbox appliance and its sandbox service, and a CI runner." in top
    assert "``" not in top
