"""The server will not listen on TCP without TLS credentials."""

from __future__ import annotations

import pytest

from protolink.sandbox.service.config import ServiceConfig
from protolink.sandbox.service.events import Events
from protolink.sandbox.service.files import ServiceFiles
from protolink.sandbox.service.manager import Manager
from protolink.sandbox.service.server import ServiceServer
from protolink.sandbox.service.tokens import Tokens


def test_a_tcp_listener_needs_credentials(tmp_path):
    files = ServiceFiles("svc", tmp_path)
    manager = Manager("svc", ServiceConfig.load(None, image="base:1"), files, Events())
    with pytest.raises(ValueError, match="needs TLS credentials"):
        ServiceServer(manager, Tokens(files.tokens), Events(), unix_path=str(files.socket), tcp="127.0.0.1:0")
