"""The CI image (``--image ci``): the sandbox image's server with compilers, pip, Node.js and npm,
under the sandbox image's hardening."""

from __future__ import annotations

import os
import re
import sys
import tempfile
from pathlib import Path

import pytest

from protolink.sandbox.docker import DockerSandbox
from protolink.sandbox.provision import ensure_image

pytestmark = pytest.mark.docker

#: The writable workspace: commands build there, since /tmp is noexec.
WORKSPACE_PREFIX = "protolink-ci-image-"
TOOL_TIMEOUT = 120


@pytest.fixture(scope="module")
def ci_image(docker_client) -> str:
    """The CI image of this checkout, built first when its inputs changed (with progress)."""
    return ensure_image("ci", progress=lambda line: print(line, file=sys.__stderr__, flush=True))


@pytest.fixture(scope="module")
def workspace():
    with tempfile.TemporaryDirectory(prefix=WORKSPACE_PREFIX) as path:
        os.chmod(path, 0o777)  # the command uid (nobody) builds here
        yield Path(path)


@pytest.fixture(scope="module")
async def sandbox(ci_image, workspace):
    sandbox = DockerSandbox(writable=[workspace], image=ci_image)
    async with sandbox:
        yield sandbox


async def sh(run, sandbox, script: str, cwd: str = "/tmp"):
    return await run(sandbox.backend, ["/bin/sh", "-c", script], cwd=cwd, timeout=TOOL_TIMEOUT)


def test_ci_names_the_tag_the_build_made(docker_client, ci_image):
    assert re.fullmatch(r"protolink/ci:[0-9a-f]{16}", ci_image)
    image = docker_client.images.get(ci_image)
    assert docker_client.images.get("protolink/ci:latest").id == image.id
    assert image.labels["io.protolink.image"] == "ci"


def test_the_ci_image_runs_the_server_as_the_sandbox_image_does(docker_client, ci_image, sandbox_image):
    ci, default = (docker_client.images.get(tag).attrs["Config"] for tag in (ci_image, sandbox_image))
    for key in ("Entrypoint", "User", "WorkingDir", "Env"):
        assert ci[key] == default[key], key


async def test_the_hardening_is_the_sandbox_images(run, sandbox, docker_client):
    host = docker_client.containers.get(sandbox.container_id).attrs["HostConfig"]
    assert host["ReadonlyRootfs"] and host["CapDrop"] == ["ALL"] and not host["Privileged"]
    assert host["NetworkMode"] == "none"
    status = (await run(sandbox.backend, ["/bin/cat", "/proc/self/status"])).stdout
    fields = dict(line.split(":", 1) for line in status.splitlines())
    assert [int(fields[name], 16) for name in ("CapEff", "CapPrm", "CapInh", "CapAmb")] == [0, 0, 0, 0]
    assert (fields["NoNewPrivs"].strip(), fields["Seccomp"].strip()) == ("1", "2")
    assert (await run(sandbox.backend, ["/usr/bin/id", "-u"])).stdout == "65534\n"
    refused = await sh(run, sandbox, "touch /usr/bin/x || touch /opt/protolink/x || echo refused")
    assert refused.stdout == "refused\n" and "Read-only file system" in refused.stderr


@pytest.mark.parametrize(("command", "expected"), [
    ("cc --version", r"\(Debian [^)]*\) 12\."),
    ("c++ --version", r"\(Debian [^)]*\) 12\."),
    ("make --version", r"GNU Make 4\."),
    ("pkg-config --version", r"^1\."),
    ("python3 --version", r"Python 3\.11\."),
    ("node --version", r"^v20\."),
    ("HOME=/tmp npm --version", r"^10\."),
    ("git --version", r"git version 2\."),
])
async def test_the_toolchain_is_on_the_command_path(run, sandbox, command, expected):
    result = await sh(run, sandbox, command)
    assert result.exit_code == 0, result.stderr
    assert re.search(expected, result.stdout, re.MULTILINE), result.stdout


async def test_a_c_extension_builds_against_the_python_headers_and_loads(run, sandbox, workspace):
    source = workspace / "hello.c"
    source.write_text('#include <Python.h>\n'
                      'static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "hello", "built here", -1};\n'
                      'PyMODINIT_FUNC PyInit_hello(void) { return PyModule_Create(&module); }\n')
    build = await sh(run, sandbox, "cc -shared -fPIC $(python3-config --includes) hello.c -o hello$(python3-config "
                     "--extension-suffix) && python3 -c 'import hello; print(hello.__doc__)'", cwd=str(workspace))
    assert (build.exit_code, build.stdout) == (0, "built here\n"), build.stderr


async def test_a_virtual_environment_gets_pip_offline(run, sandbox, workspace):
    result = await sh(run, sandbox, "python3 -m venv venv && venv/bin/pip --version && venv/bin/python -c "
                      "'import sys; print(sys.prefix)'", cwd=str(workspace))
    assert result.exit_code == 0, result.stderr
    pip, prefix = result.stdout.splitlines()
    assert re.match(rf"pip \d+\.\S+ from {workspace}/venv/lib/python3\.11/site-packages/pip ", pip)
    assert prefix == f"{workspace}/venv"
    assert (workspace / "venv" / "bin" / "pip").stat().st_uid == 65534


async def test_node_runs_a_script_and_npm_a_package_script(run, sandbox, workspace):
    (workspace / "package.json").write_text('{"name": "probe", "version": "1.0.0", "private": true, '
                                            '"scripts": {"test": "node -e \\"console.log(6 * 7)\\""}}')
    result = await sh(run, sandbox, "HOME=$PWD npm test --silent", cwd=str(workspace))
    assert (result.exit_code, result.stdout) == (0, "42\n"), result.stderr


async def test_node_starts_from_v8s_startup_snapshot(run, sandbox):
    """Debian's Node.js is built without it, which costs every start of ``node`` about 0.1 s of CPU."""
    result = await sh(run, sandbox, "node -p 'process.config.variables.node_use_node_snapshot'")
    assert (result.exit_code, result.stdout) == (0, "true\n"), result.stderr
