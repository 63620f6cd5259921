"""The service's server: no TCP listener without TLS credentials; a sandbox refused for a missing
protection reaches the client as the same typed error."""

from __future__ import annotations

import pytest

from protolink.errors import SandboxProtectionError
from protolink.sandbox.service.client import connect
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


class RefusingPlacement(Manager):
    """A manager whose every sandbox's server refuses to serve, as one placed without a protection does."""

    async def create(self, tenant, template_name, overrides):
        raise SandboxProtectionError("sandbox s1 refused to serve, protections missing: seccomp (mode 0)",
                                     missing={"seccomp": "mode 0", "no_new_privs": "0"})


async def test_a_refused_sandbox_reaches_the_client_with_what_is_missing(tmp_path):
    files = ServiceFiles("svc", tmp_path)
    tokens = Tokens(files.tokens)
    token = tokens.add("alice")
    manager = RefusingPlacement("svc", ServiceConfig.load(None, image="base:1"), files, Events())
    server = ServiceServer(manager, tokens, Events(), unix_path=str(tmp_path / "svc.sock"))
    await server.start()
    try:
        client = await connect(f"unix://{tmp_path / 'svc.sock'}", token, timeout=30.0)
        async with client:
            with pytest.raises(SandboxProtectionError) as refused:
                await client.create()
    finally:
        await server.stop(0)
    assert refused.value.missing == {"seccomp": "mode 0", "no_new_privs": "0"}
    assert "protections missing: seccomp (mode 0)" in str(refused.value)
