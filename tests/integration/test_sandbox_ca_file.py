"""A sandbox given a CA file (``ca_file``) has every command trust it without a variable of its
own: pip installs from the package index whose TLS this host's network intercepts (its
authority is in the host's bundle only), where without the file pip fails on the certificate.
The sandbox trusts a copy taken when it starts, read-only; a command that names a trust
variable keeps its own value. ``up --ca-file`` does the same for the appliance."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from protolink.sandbox.docker import DockerSandbox
from protolink.sandbox.placements.server import CA_PATH
from protolink.wire.trust import CA_VARIABLES
from tests.integration.conftest import COMMAND_ENV
from tests.integration.test_sandbox_cli import cli, name  # noqa: F401 (a fixture)
from tests.security.conftest import box_root  # noqa: F401 (a fixture)
from tests.security.test_egress import PACKAGE, Index, pip_index

pytestmark = pytest.mark.docker

#: The bundle this host trusts, its network's own authority among them.
HOST_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
#: The trust variables a command sees, as JSON.
SHOW_TRUST = f"import json, os; print(json.dumps({{name: os.environ.get(name) for name in {list(CA_VARIABLES)!r}}}))"


@pytest.fixture(scope="module")
def index() -> Index:
    return pip_index()


def sandbox(image: str, index: Index, work: Path, **options: object) -> DockerSandbox:
    """A sandbox allowed only the package index's hosts (port 443), writing ``work``."""
    return DockerSandbox(writable=[work], image=image, egress=[f"{index.host}:443", f"{index.files_host}:443"],
                         **options)


def pip_install(index: Index, venv: Path) -> list[str]:
    """pip of ``venv`` installing :data:`PACKAGE` from the index once (no retry), with no variable naming a CA."""
    return [f"{venv}/bin/pip", "install", "--no-cache-dir", "--disable-pip-version-check", "--retries", "0",
            "--index-url", index.url, PACKAGE]


async def test_pip_installs_through_the_index_trusting_the_ca_file(sandbox_image, index, box_root, run):
    venv = box_root / "venv"
    async with sandbox(sandbox_image, index, box_root, ca_file=HOST_BUNDLE) as backend:
        made = await run(backend, ["/usr/bin/python3", "-m", "venv", str(venv)], timeout=300)
        assert made.exit_code == 0, made
        installed = await run(backend, pip_install(index, venv), cwd=str(box_root), timeout=300)
        assert installed.exit_code == 0, f"pip install {PACKAGE} failed:\n{installed.stdout}{installed.stderr}"
        imported = await run(backend, [f"{venv}/bin/python", "-c", f"import {PACKAGE}; print({PACKAGE}.__name__)"])
        assert imported.stdout == f"{PACKAGE}\n", imported


async def test_without_the_ca_file_pip_fails_on_the_certificate(sandbox_image, index, box_root, run):
    venv = box_root / "venv"
    async with sandbox(sandbox_image, index, box_root) as backend:
        trust = await run(backend, ["/usr/bin/python3", "-c", SHOW_TRUST])
        assert json.loads(trust.stdout) == dict.fromkeys(CA_VARIABLES), trust  # none is set
        made = await run(backend, ["/usr/bin/python3", "-m", "venv", str(venv)], timeout=300)
        assert made.exit_code == 0, made
        refused = await run(backend, pip_install(index, venv), cwd=str(box_root), timeout=300)
    assert refused.exit_code != 0 and "CERTIFICATE_VERIFY_FAILED" in refused.stdout + refused.stderr, refused


async def test_commands_trust_a_read_only_copy_and_keep_a_variable_they_set(sandbox_image, index, box_root, tmp_path,
                                                                           run):
    bundle = tmp_path / "bundle.pem"
    shutil.copyfile(HOST_BUNDLE, bundle)
    async with sandbox(sandbox_image, index, box_root, ca_file=bundle) as backend:
        bundle.write_text("changed on the host after the sandbox started\n")
        trust = await run(backend, ["/usr/bin/python3", "-c", SHOW_TRUST])
        assert json.loads(trust.stdout) == dict.fromkeys(CA_VARIABLES, CA_PATH), trust
        own = await run(backend, ["/usr/bin/python3", "-c", SHOW_TRUST],
                        env={**COMMAND_ENV, "PIP_CERT": "/tmp/own.pem"})
        assert json.loads(own.stdout) == {**dict.fromkeys(CA_VARIABLES, CA_PATH), "PIP_CERT": "/tmp/own.pem"}, own
        read = await run(backend, ["/bin/cat", CA_PATH])
        assert read.stdout == Path(HOST_BUNDLE).read_text(), read.stderr  # the bundle as it was at the start
        written = await run(backend, ["/bin/sh", "-c", f"echo > {CA_PATH}"])
        assert written.exit_code != 0 and "Read-only file system" in written.stderr, written


def test_up_with_a_ca_file_gives_the_appliance_s_commands_the_bundle(docker_client, sandbox_image, index, box_root,
                                                                      name):
    refused = cli("up", "--name", name, "--root", f"{box_root}:rw", "--ca-file", str(box_root / "missing.pem"))
    assert refused.returncode == 1 and f"ca_file {box_root}/missing.pem: No such file or directory" in refused.stderr
    assert docker_client.containers.list(all=True, filters={"name": name}) == []  # refused before anything started
    up = cli("up", "--name", name, "--root", f"{box_root}:rw", "--ca-file", HOST_BUNDLE,
             "--allow", f"{index.host}:443", "--allow", f"{index.files_host}:443")
    assert up.returncode == 0, up.stderr
    venv = box_root / "venv"
    made = cli("exec", "--name", name, "--cwd", str(box_root), "--", "python3", "-m", "venv", str(venv))
    assert made.returncode == 0, made.stderr
    installed = cli("exec", "--name", name, "--cwd", str(box_root), "--", *pip_install(index, venv))
    assert installed.returncode == 0, installed.stdout + installed.stderr
