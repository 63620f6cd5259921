"""An engine that lacks what a sandbox needs is named in the error, not quoted as an HTTP failure:
here a private Docker Engine started without its bridge (``dockerd --bridge=none``), asked for a
sandbox in TCP mode, which publishes its port through that bridge."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from protolink.errors import SandboxEngineError
from protolink.sandbox.docker import DockerSandbox

pytestmark = pytest.mark.docker

HANG_GUARD = 30  # seconds: only keeps a broken engine from hanging the test; never a timing assertion


def _has_docker0() -> bool:
    return os.path.exists("/sys/class/net/docker0")


@pytest.fixture
def bridgeless_engine(docker_client) -> Iterator[str]:
    """DOCKER_HOST of a private dockerd without a bridge, its own state in a temporary directory.

    It runs in a network namespace of its own: a dockerd started with ``--bridge=none`` deletes
    the interface docker0 where it runs, and this host's engine needs its own.
    """
    home = Path(tempfile.mkdtemp(prefix="pl-dockerd-"))  # short: containerd's socket path goes beneath it
    host = f"unix://{home}/docker.sock"
    had_docker0 = _has_docker0()
    with open(home / "dockerd.log", "wb") as log:
        engine = subprocess.Popen(
            ["unshare", "--net", "dockerd", "--bridge=none", "--iptables=false", "--ip-masq=false", "--storage-driver=vfs",
             f"--data-root={home}/data", f"--exec-root={home}/exec", f"--pidfile={home}/dockerd.pid", f"--host={host}"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + HANG_GUARD
        while subprocess.run(["docker", "--host", host, "version"], capture_output=True).returncode != 0:
            assert engine.poll() is None and time.monotonic() < deadline, (home / "dockerd.log").read_text()
            time.sleep(0.2)
        yield host
    finally:
        engine.send_signal(signal.SIGTERM)
        try:
            engine.wait(HANG_GUARD)
        except subprocess.TimeoutExpired:
            engine.kill()
            engine.wait()
        with contextlib.suppress(OSError):
            shutil.rmtree(home)
    assert _has_docker0() or not had_docker0, "the private engine removed this host's docker0"


async def test_tcp_mode_on_an_engine_without_its_bridge_says_the_bridge_is_missing(bridgeless_engine, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", bridgeless_engine)
    root = tempfile.mkdtemp(prefix="protolink-bridgeless-")
    try:
        sandbox = DockerSandbox([root], tcp="127.0.0.1:0", image="protolink/sandbox:latest")
        with pytest.raises(SandboxEngineError) as refused:
            await sandbox.start()
    finally:
        os.rmdir(root)
    message = str(refused.value)
    assert "no default bridge network, docker0" in message and "TCP mode" in message
    assert "(the engine said: network bridge not found)" in message
    assert "http+docker" not in message
