"""A host user who is not root: the server creates its socket in that user's owner-only
directory, owned by that user, and that user (and no other) can connect to it.

Tests run as root, so the host user is simulated: the sandbox's host directory is handed to
an unused uid, and connections are tried from processes running as that uid and as another.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from protolink.sandbox import docker as docker_module
from protolink.sandbox.docker import DockerSandbox
from tests.sandbox_server import HOST_PYTHON, unused_uid

pytestmark = pytest.mark.docker

CONNECT = "import socket, sys; socket.socket(socket.AF_UNIX).connect(sys.argv[1])"


def connects_as(uid: int, path: str) -> subprocess.CompletedProcess[str]:
    # setpriv changes the user after the exec: subprocess's own user= forks while this process's
    # sandbox call is open, and gRPC's fork handlers crash such a child (see the README).
    return subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--",
                           HOST_PYTHON, "-I", "-c", CONNECT, path], cwd="/", capture_output=True, text=True, timeout=60)


async def test_a_host_user_who_is_not_root_gets_a_socket_only_they_can_open(monkeypatch, sandbox_image, run):
    host_user, stranger = unused_uid(), unused_uid() + 1
    made: list[Path] = []

    def owned_by_the_host_user(name: str) -> Path:
        path = Path(tempfile.mkdtemp(prefix="protolink-host-user-"))  # 0700; /tmp lets every user reach it
        os.chown(path, host_user, host_user)
        made.append(path)
        return path

    monkeypatch.setattr(docker_module, "private_subdir", owned_by_the_host_user)
    root = Path(tempfile.mkdtemp(prefix="protolink-host-user-root-"))
    root.chmod(0o755)
    try:
        async with DockerSandbox([root], image=sandbox_image) as backend:
            assert (await run(backend, ["/usr/bin/id", "-u"])).stdout == "65534\n"
            socket_path = backend_socket(made)
            info = os.stat(socket_path)
            assert stat.S_ISSOCK(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o600
            assert (info.st_uid, info.st_gid) == (host_user, host_user)
            assert connects_as(host_user, socket_path).returncode == 0
            refused = connects_as(stranger, socket_path)
            assert refused.returncode != 0 and "PermissionError" in refused.stderr
            assert await backend.health()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert not any(path.exists() for path in made)


def backend_socket(made: list[Path]) -> str:
    (directory,) = made
    return str(directory / "sandbox.sock")
