"""``protolink-sandbox up | status | exec | down`` as a user types them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest

from protolink.sandbox.hostdirs import runtime_dir
from tests.conftest import TEST_NAME_PREFIX

pytestmark = pytest.mark.docker

NOBODY = 65534
ISO_AGO = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ \(\d+ s ago\)"


def cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {key: value for key, value in os.environ.items() if key != "PROTOLINK_SANDBOX_ROOTS"}
    return subprocess.run([sys.executable, "-m", "protolink.sandbox.cli", *args], capture_output=True, text=True,
                          timeout=300, env={**environment, **env})


@pytest.fixture
def name(docker_client) -> Iterator[str]:
    """A name of the test's own; whatever ``up`` left under it is removed after the test."""
    name = f"{TEST_NAME_PREFIX}cli-{uuid.uuid4().hex[:8]}"
    yield name
    cli("down", "--name", name)


def test_up_status_exec_down(docker_client, sandbox_image, tmp_path, name):
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
        assert re.search(f"created {ISO_AGO}$", status.stdout, re.MULTILINE), status.stdout

        shown = cli("exec", "--name", name, "--", "cat", str(tmp_path / "hello.txt"))
        assert (shown.returncode, shown.stdout) == (0, "hello from the host\n")
        # exec finds the appliance where `up` recorded it, without asking the engine
        without_engine = cli("exec", "--name", name, "--", "true", DOCKER_HOST=f"unix://{tmp_path}/none.sock")
        assert without_engine.returncode == 0, without_engine.stderr
        failed = cli("exec", "--name", name, "--cwd", str(tmp_path), "--", "/bin/sh", "-c", "exit 7")
        assert failed.returncode == 7

        again = cli("up", "--name", name, "--root", str(tmp_path))
        assert "already up" in again.stderr
    finally:
        down = cli("down", "--name", name)
    assert down.returncode == 0 and f"{name} removed" in down.stdout
    assert cli("status", "--name", name).returncode == 3
    assert docker_client.containers.list(all=True, filters={"name": name}) == []
    assert not (runtime_dir() / f"{name}.json").exists()


def test_up_without_roots_mounts_a_default_workspace_commands_can_write(docker_client, sandbox_image, tmp_path, name):
    up = cli("up", "--name", name, XDG_DATA_HOME=str(tmp_path / "data"))
    assert up.returncode == 0, up.stderr
    workspace = tmp_path / "data" / "protolink" / "workspace"
    assert f"workspace: {workspace} (read-write; commands run as uid {NOBODY})" in up.stdout
    made = cli("exec", "--name", name, "--cwd", str(workspace), "--", "/bin/sh", "-c", "echo made > made.txt")
    assert made.returncode == 0, made.stderr
    assert (workspace / "made.txt").read_text() == "made\n" and (workspace / "made.txt").stat().st_uid == NOBODY


def test_a_writable_root_commands_cannot_write_is_refused_unless_handed_over(docker_client, sandbox_image, tmp_path,
                                                                             name):
    root = tmp_path / "ws"
    root.mkdir(mode=0o755)  # root's, as /srv/ws would be
    refused = cli("up", "--name", name, "--root", f"{root}:rw")
    assert refused.returncode == 1
    assert f"writable root {root} cannot be written by uid {NOBODY}" in refused.stderr
    assert f"fix it with: chown {NOBODY}:{NOBODY} {root}" in refused.stderr and "--chown-writable" in refused.stderr
    assert docker_client.containers.list(all=True, filters={"name": name}) == []
    assert root.stat().st_uid == 0

    up = cli("up", "--name", name, "--root", f"{root}:rw", "--chown-writable")
    assert up.returncode == 0, up.stderr
    assert f"handed writable root {root} to {NOBODY}:{NOBODY} (it was 0:0)" in up.stderr
    made = cli("exec", "--name", name, "--cwd", str(root), "--", "/bin/sh", "-c", "echo made > made.txt")
    assert made.returncode == 0 and (root / "made.txt").read_text() == "made\n", made.stderr
