"""``protolink-sandbox up | status | exec | down`` as a user types them."""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest

pytestmark = pytest.mark.docker


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "protolink.sandbox.cli", *args], capture_output=True, text=True,
                          timeout=300)


def test_up_status_exec_down(docker_client, sandbox_image, tmp_path):
    name = f"protolink-cli-test-{uuid.uuid4().hex[:8]}"
    (tmp_path / "hello.txt").write_text("hello from the host\n")
    tmp_path.chmod(0o755)  # readable by the sandbox's command uid
    up = cli("up", "--name", name, "--root", f"{tmp_path}:ro")
    try:
        assert up.returncode == 0, up.stderr
        address = docker_client.containers.get(name).labels["io.protolink.address"]
        assert address.startswith("unix:///")
        assert f"{name} is up at {address}" in up.stdout
        assert f'from protolink.sandbox import connect; backend = await connect("{address}")' in up.stdout

        status = cli("status", "--name", name)
        assert status.returncode == 0, status.stdout + status.stderr
        assert "health: serving" in status.stdout and f"root: {tmp_path} (read-only)" in status.stdout

        shown = cli("exec", "--name", name, "--", "cat", str(tmp_path / "hello.txt"))
        assert (shown.returncode, shown.stdout) == (0, "hello from the host\n")
        failed = cli("exec", "--name", name, "--cwd", str(tmp_path), "--", "/bin/sh", "-c", "exit 7")
        assert failed.returncode == 7

        again = cli("up", "--name", name, "--root", str(tmp_path))
        assert "already up" in again.stderr
    finally:
        down = cli("down", "--name", name)
    assert down.returncode == 0 and f"{name} removed" in down.stdout
    assert cli("status", "--name", name).returncode == 3
    assert docker_client.containers.list(all=True, filters={"name": name}) == []
