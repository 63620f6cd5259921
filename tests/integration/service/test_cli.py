"""``protolink-sandbox up`` starts the service, a script reaches it with no setup, ``down`` removes it all."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid

import pytest

from protolink.errors import ToolExecutionError
from protolink.sandbox.service.sync import SyncServiceClient
from tests.conftest import TEST_NAME_PREFIX

pytestmark = pytest.mark.docker


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "protolink.sandbox.cli", *args], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ))


@pytest.fixture
def name(runtime, docker_client):
    name = f"{TEST_NAME_PREFIX}cli-{uuid.uuid4().hex[:8]}"
    yield name
    cli("down", "--name", name)


def test_up_serves_sandboxes_a_script_uses_and_down_removes_them(name, runtime, tmp_path, sandbox_image,
                                                                 docker_client):
    tmp_path.chmod(0o755)
    up = cli("up", "--name", name, "--root", f"{tmp_path}:ro", "--image", sandbox_image,
             "--service-tcp", "127.0.0.1:0")
    assert up.returncode == 0, up.stderr
    assert f"from protolink.sandbox.service import connect; service = await connect(name={name!r})" in up.stdout
    tcp, fingerprint = re.search(r"connect\('(127\.0\.0\.1:\d+)', token=\.\.\., fingerprint='(sha256:[0-9a-f]{64})'\)",
                                 up.stdout).groups()
    default_token = (runtime / f"{name}.service.token").read_text()
    with SyncServiceClient(tcp, default_token, fingerprint=fingerprint, timeout=30.0) as remote:
        assert remote.list() == []
    with SyncServiceClient(name=name, timeout=30.0) as service:
        with service.create(labels={"from": "script"}) as sandbox:
            result = sandbox.run(["echo", "hello"])
            assert (result.exit_code, result.stdout) == (0, "hello\n")
            with pytest.raises(ToolExecutionError, match=r"^could not start 'echo' in '/no/such/directory'"):
                sandbox.run(["echo", "hello"], cwd="/no/such/directory")  # named as typed
            shown = cli("service", "--name", name)
            assert shown.returncode == 0, shown.stderr
            assert f"{sandbox.id}: running, template default" in shown.stdout
        kept = service.create()
        assert [status.id for status in service.list() if status.state == "running"] == [kept.id]
    token = cli("token", "add", "ci", "--name", name, "--sandboxes", "1")
    assert token.returncode == 0 and len(token.stdout.strip()) >= 40
    audit = cli("audit", "verify", "--name", name)
    assert audit.returncode == 0 and ": intact, " in audit.stdout, audit.stdout + audit.stderr
    down = cli("down", "--name", name)
    assert down.returncode == 0, down.stderr
    assert "removed 1 sandbox(es)" in down.stderr
    assert docker_client.containers.list(all=True, filters={"name": name}) == []
    assert cli("service", "--name", name).returncode == 3
