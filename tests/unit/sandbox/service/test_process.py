"""A second service of the same name refuses to start instead of taking the first one's socket."""

from __future__ import annotations

import json
import os

import pytest

from protolink.sandbox.leftovers import process_owner
from protolink.sandbox.service.config import ServiceConfig
from protolink.sandbox.service.daemon import serve
from protolink.sandbox.service.files import ServiceFiles


async def test_a_second_service_of_a_name_refuses_to_start(tmp_path, monkeypatch):
    monkeypatch.setenv("PROTOLINK_RUNTIME_DIR", str(tmp_path / "runtime"))
    files = ServiceFiles.of("svc")
    files.pid.write_text(json.dumps({"pid": os.getpid(), "owner": process_owner(), "addresses": []}))
    files.socket.write_text("")  # the first one's socket
    with pytest.raises(ValueError, match="runs already"):
        await serve("svc", ServiceConfig.load(None, image="base:1"))
    assert files.socket.exists()
