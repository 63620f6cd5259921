"""A second service of the same name refuses to start instead of taking the first one's socket;
one that cannot start says why."""

from __future__ import annotations

import json
import os

import pytest

from protolink.errors import SandboxError, SandboxUnavailableError
from protolink.sandbox.leftovers import process_owner
from protolink.sandbox.service.config import ServiceConfig
from protolink.sandbox.service.daemon import serve
from protolink.sandbox.service.files import ServiceFiles
from protolink.sandbox.service.process import remove_everything, running, start_service


async def test_a_second_service_of_a_name_refuses_to_start(tmp_path, monkeypatch):
    monkeypatch.setenv("PROTOLINK_RUNTIME_DIR", str(tmp_path / "runtime"))
    files = ServiceFiles.of("svc")
    files.pid.write_text(json.dumps({"pid": os.getpid(), "owner": process_owner(), "addresses": []}))
    files.socket.write_text("")  # the first one's socket
    with pytest.raises(ValueError, match="runs already"):
        await serve("svc", ServiceConfig.load(None, image="base:1"))
    assert files.socket.exists()


async def test_a_service_that_cannot_start_says_why_and_leaves_no_record(tmp_path, monkeypatch):
    monkeypatch.setenv("PROTOLINK_RUNTIME_DIR", str(tmp_path / "runtime"))
    with pytest.raises(SandboxError, match=r"^the sandbox service svc ended as it started \(exit 2\):\n(.|\n)*"
                                           r"unrecognized arguments: --bogus"):
        await start_service("svc", ["--bogus"])
    assert running("svc") is None


@pytest.mark.docker
def test_down_keeps_the_record_of_a_swarm_manager_that_does_not_answer(tmp_path, monkeypatch, docker_client):
    monkeypatch.setenv("PROTOLINK_RUNTIME_DIR", str(tmp_path / "runtime"))
    files = ServiceFiles.of("swarm-down")
    files.swarm.write_text(json.dumps({"manager": f"unix://{tmp_path / 'no-manager.sock'}"}))
    files.log.write_text("")
    with pytest.raises(SandboxUnavailableError, match="Swarm manager of service swarm-down did not "
                                                      "answer"):
        remove_everything(files.name, docker_client)
    assert files.swarm.exists() and not files.log.exists()
    files.swarm.unlink()
    assert remove_everything(files.name, docker_client) == 0
