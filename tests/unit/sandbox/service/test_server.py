"""The service's server: no TCP listener without TLS credentials; every refusal reaches the client
as the same typed error, through the wire's one mapping of errors to statuses."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from protolink.errors import (
    QuotaExceededError,
    SandboxAuthenticationError,
    SandboxEngineError,
    SandboxNotFoundError,
    SandboxPermissionError,
    SandboxProtectionError,
    SandboxUnavailableError,
)
from protolink.sandbox.service.client import ServiceClient, connect
from protolink.sandbox.service.config import ServiceConfig
from protolink.sandbox.service.events import Events
from protolink.sandbox.service.files import ServiceFiles
from protolink.sandbox.service.manager import Manager
from protolink.sandbox.service.server import ServiceServer
from protolink.sandbox.service.tokens import Quota, Tokens


def test_a_tcp_listener_needs_credentials(tmp_path):
    files = ServiceFiles("svc", tmp_path)
    manager = Manager("svc", ServiceConfig.load(None, image="base:1"), files, Events())
    with pytest.raises(ValueError, match="needs TLS credentials"):
        ServiceServer(manager, Tokens(files.tokens), Events(), unix_path=str(files.socket), tcp="127.0.0.1:0")


class RefusingPlacement(Manager):
    """A manager whose every sandbox fails to start with ``error``, as a placement may."""

    def __init__(self, *args, error: Exception) -> None:
        super().__init__(*args)
        self.error = error

    async def create(self, tenant, template_name, overrides):
        raise self.error


@asynccontextmanager
async def serving(tmp_path, refusal: Exception | None = None, quota: Quota = Quota()) -> AsyncIterator[ServiceClient]:
    """A client of a served manager, as a token with ``quota``; every create fails with
    ``refusal`` when one is given."""
    files = ServiceFiles("svc", tmp_path)
    tokens = Tokens(files.tokens)
    token = tokens.add("alice", quota)
    args = ("svc", ServiceConfig.load(None, image="base:1"), files, Events())
    manager = Manager(*args) if refusal is None else RefusingPlacement(*args, error=refusal)
    server = ServiceServer(manager, tokens, Events(), unix_path=str(tmp_path / "svc.sock"))
    await server.start()
    try:
        async with await connect(f"unix://{tmp_path / 'svc.sock'}", token, timeout=30.0) as client:
            yield client
    finally:
        await server.stop(0)


async def test_a_refused_sandbox_reaches_the_client_with_what_is_missing(tmp_path):
    refusal = SandboxProtectionError("sandbox s1 refused to serve, protections missing: seccomp (mode 0)",
                                     missing={"seccomp": "mode 0", "no_new_privs": "0"})
    async with serving(tmp_path, refusal) as client:
        with pytest.raises(SandboxProtectionError) as refused:
            await client.create()
    assert refused.value.missing == {"seccomp": "mode 0", "no_new_privs": "0"}
    assert "protections missing: seccomp (mode 0)" in str(refused.value)


async def test_a_sandbox_the_engine_cannot_start_is_unavailable_with_why(tmp_path):
    async with serving(tmp_path, SandboxEngineError("the engine refused: no such image base:1")) as client:
        with pytest.raises(SandboxUnavailableError, match="^the engine refused: no such image base:1$"):
            await client.create()


@pytest.mark.parametrize("method", ["get", "renew", "delete", "open"])
async def test_an_unknown_sandbox_is_not_found(tmp_path, method):
    async with serving(tmp_path) as client:
        with pytest.raises(SandboxNotFoundError, match="^no sandbox 'nope'$"):
            await getattr(client, method)("nope")


async def test_a_create_over_the_quota_is_refused(tmp_path):
    async with serving(tmp_path, quota=Quota(sandboxes=0)) as client:
        with pytest.raises(QuotaExceededError, match="at most 0 sandboxes at once"):
            await client.create()


async def test_a_root_the_service_does_not_allow_is_refused(tmp_path):
    async with serving(tmp_path) as client:
        with pytest.raises(SandboxPermissionError, match="is not beneath a root this service allows"):
            await client.create(roots=[str(tmp_path)])


async def test_an_unknown_template_is_an_invalid_argument(tmp_path):
    async with serving(tmp_path) as client:
        with pytest.raises(ValueError, match="no template 'nope'"):
            await client.create("nope")


async def test_a_wrong_token_is_refused(tmp_path):
    async with serving(tmp_path):
        with pytest.raises(SandboxAuthenticationError, match="a valid token is required"):
            await connect(f"unix://{tmp_path / 'svc.sock'}", "wrong", timeout=30.0)
