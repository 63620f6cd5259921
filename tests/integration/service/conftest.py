"""A real sandbox service process per test, in a runtime directory of its own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from protolink.sandbox.service.client import ServiceClient, connect
from protolink.sandbox.service.files import ServiceFiles
from protolink.sandbox.service.process import remove_everything
from protolink.sandbox.service.tokens import Quota, Tokens
from tests.conftest import TEST_NAME_PREFIX

#: A hang guard, never a measure: how long a service may take to start.
START_SECONDS = 120.0


@dataclass
class ServiceProcess:
    """One service process; :meth:`start` it again after :meth:`kill` (same name, same runtime directory)."""

    name: str
    image: str
    runtime: Path
    arguments: Sequence[str] = ()
    process: subprocess.Popen[bytes] | None = None
    clients: list[ServiceClient] = field(default_factory=list)

    @property
    def files(self) -> ServiceFiles:
        return ServiceFiles(self.name, self.runtime)

    def command(self, *extra: str) -> list[str]:
        return [sys.executable, "-m", "protolink.sandbox.service", "--name", self.name, "--image", self.image,
                *self.arguments, *extra]

    def start(self) -> None:
        self.files.pid.unlink(missing_ok=True)
        log = open(self.files.log, "ab")
        self.process = subprocess.Popen(self.command(), stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                        env={**os.environ, "PROTOLINK_RUNTIME_DIR": str(self.runtime)})
        log.close()
        deadline = time.monotonic() + START_SECONDS
        while not self.files.pid.exists():
            assert self.process.poll() is None, self.files.log.read_text()
            assert time.monotonic() < deadline, "the service did not start: " + self.files.log.read_text()
            time.sleep(0.05)

    @property
    def record(self) -> dict[str, Any]:
        return json.loads(self.files.pid.read_text())

    def kill(self) -> None:
        """SIGKILL: the service has no chance to clean up."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def token(self, name: str, **quota: Any) -> str:
        return Tokens(self.files.tokens).add(name, Quota(**quota))

    async def client(self, token: str | None = None) -> ServiceClient:
        token = token if token is not None else self.files.default_token.read_text()
        client = await connect(self.files.address, token, timeout=30.0)
        self.clients.append(client)
        return client


@pytest.fixture
def runtime(monkeypatch) -> Iterator[Path]:
    """A short runtime directory (socket paths are bounded), this test's own."""
    path = Path(tempfile.mkdtemp(prefix="pl-svc-"))
    monkeypatch.setenv("PROTOLINK_RUNTIME_DIR", str(path))
    yield path
    import shutil

    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def make_service(docker_client, sandbox_image, runtime) -> AsyncIterator[Any]:
    """``make_service(*arguments)``: a started service; stopped, and all it made removed, after the test."""
    made: list[ServiceProcess] = []

    def make(*arguments: str, start: bool = True) -> ServiceProcess:
        service = ServiceProcess(f"{TEST_NAME_PREFIX}svc-{uuid.uuid4().hex[:8]}", sandbox_image, runtime, arguments)
        made.append(service)
        if start:
            service.start()
        return service

    yield make
    for service in made:
        for client in service.clients:
            await client.aclose()
        service.stop()
        remove_everything(service.name, docker_client)


@pytest.fixture
def service(make_service) -> ServiceProcess:
    """A started service without a pool."""
    return make_service()
