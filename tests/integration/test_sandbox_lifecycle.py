"""A sandbox's container exists exactly as long as its ``async with``, whatever ends it; a dead
container is a typed error at once; the reaper removes what dead owners and expiry leave behind.

(That no container outlives the whole suite is checked at the end of every session that reached
an engine, by tests/conftest.py.)
"""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import sys
import tarfile
import time
import uuid
import zlib

import docker.errors
import pytest

from protolink.errors import SandboxEngineError, SandboxUnavailableError
from protolink.sandbox import docker as sandbox_docker
from protolink.sandbox import leftovers
from protolink.sandbox.docker import DockerSandbox
from protolink.sandbox.hostdirs import private_subdir
from tests.conftest import TEST_NAME_PREFIX

pytestmark = pytest.mark.docker

HANG_GUARD = 60  # seconds: only keeps a broken build from hanging; never a timing assertion
BASE_IMAGE = "protolink/base:bookworm"


def _containers(client, session: str) -> list:
    return client.containers.list(all=True, filters={"label": f"{leftovers.SESSION_LABEL}={session}"})


def _dead_process_owner() -> str:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    owner = leftovers.process_owner(child.pid)
    child.wait()
    return owner


@pytest.fixture
def broken_image(docker_client, sandbox_image):
    """An image whose 'server' writes a line to stderr and exits at once."""
    dockerfile = f'FROM {BASE_IMAGE}\nENTRYPOINT ["/bin/sh", "-c", "echo server refuses to start >&2; exit 3"]\n'
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile)
        tar.addfile(info, io.BytesIO(dockerfile.encode()))
    context.seek(0)
    tag = f"protolink-test/broken:{uuid.uuid4().hex[:12]}"
    image, _ = docker_client.images.build(fileobj=context, custom_context=True, tag=tag, rm=True, forcerm=True,
                                          network_mode="none")
    yield tag
    docker_client.images.remove(image.id, force=True)


async def test_container_lives_exactly_as_long_as_the_context(docker_client, sandbox_image, run, tmp_path):
    sandbox = DockerSandbox([tmp_path], image=sandbox_image)
    async with sandbox as backend:
        container = docker_client.containers.get(sandbox.container_id)
        assert container.status == "running"
        result = await run(backend, ["/bin/echo", "alive"])
        assert result.stdout == "alive\n"
    assert _containers(docker_client, sandbox.session) == []
    with pytest.raises(RuntimeError):
        await sandbox.start()  # a sandbox is not restarted


def test_the_engine_cpus_are_asked_once_per_engine(docker_client, monkeypatch):
    """What the CI runner and every DockerSandbox take as the engine's CPUs."""
    monkeypatch.setattr(sandbox_docker, "_engine_cpus", {})
    assert sandbox_docker.engine_cpus() == docker_client.info()["NCPU"]
    monkeypatch.setitem(sandbox_docker._engine_cpus, os.environ.get("DOCKER_HOST", ""), 64)
    assert sandbox_docker.engine_cpus() == sandbox_docker.engine_cpus(docker_client) == 64


async def test_cpus_the_engine_refuses_fall_back_to_a_quota(docker_client, sandbox_image, run, tmp_path,
                                                             monkeypatch):
    """An engine confined to some of its CPUs refuses a cpuset of others; the sandbox still starts,
    limited by a CPU quota instead (here: the engine is told to have 64 CPUs, and the name picks
    one it does not have)."""
    monkeypatch.setitem(sandbox_docker._engine_cpus, os.environ.get("DOCKER_HOST", ""), 64)
    name = next(f"protolink-sandbox-cpus-{n}" for n in range(1000)
                if zlib.crc32(f"protolink-sandbox-cpus-{n}".encode()) % 64 >= (os.cpu_count() or 1))
    sandbox = DockerSandbox([tmp_path], image=sandbox_image, name=name)
    async with sandbox as backend:
        config = docker_client.containers.get(sandbox.container_id).attrs["HostConfig"]
        assert (config["CpusetCpus"], config["NanoCpus"]) == ("", 1_000_000_000)
        assert (await run(backend, ["/bin/echo", "served"])).stdout == "served\n"
    assert _containers(docker_client, sandbox.session) == []


async def test_an_error_in_the_body_still_removes_the_container(docker_client, sandbox_image, tmp_path):
    sandbox = DockerSandbox([tmp_path], image=sandbox_image)
    with pytest.raises(ZeroDivisionError):
        async with sandbox:
            1 / 0
    assert _containers(docker_client, sandbox.session) == []


@pytest.mark.parametrize("after", [0.0, 0.05, 0.3, 1.0])
async def test_cancellation_at_any_point_of_start_leaves_nothing(docker_client, sandbox_image, tmp_path, after):
    sandbox = DockerSandbox([tmp_path], image=sandbox_image)

    async def use() -> None:
        async with sandbox:
            await asyncio.sleep(60)

    task = asyncio.create_task(use())
    await asyncio.sleep(after)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, HANG_GUARD)
    assert _containers(docker_client, sandbox.session) == []
    assert all(not path.exists() for path in sandbox._host_dirs)


async def test_a_server_that_dies_while_starting_is_reported_with_its_output(docker_client, broken_image, tmp_path):
    sandbox = DockerSandbox([tmp_path], image=broken_image, start_timeout=HANG_GUARD)
    with pytest.raises(SandboxUnavailableError, match="server refuses to start"):
        await asyncio.wait_for(sandbox.start(), HANG_GUARD)
    assert _containers(docker_client, sandbox.session) == []


async def test_a_missing_image_is_a_typed_error_that_names_it(docker_client, tmp_path):
    image = f"protolink-test/missing:{uuid.uuid4().hex[:8]}"
    sandbox = DockerSandbox([tmp_path], image=image)
    with pytest.raises(SandboxEngineError, match=f"could not start sandbox container {sandbox.name}: the image "
                                                 f"{image} is not on this engine") as refused:
        await sandbox.start()
    assert f"(the engine said: No such image: {image})" in str(refused.value)
    assert _containers(docker_client, sandbox.session) == []


async def test_a_container_killed_mid_call_gives_a_typed_error_promptly(docker_client, sandbox_image, run, tmp_path):
    sandbox = DockerSandbox([tmp_path], image=sandbox_image)
    async with sandbox as backend:
        call = asyncio.create_task(run(backend, ["/bin/sleep", "60"], timeout=120))
        await asyncio.sleep(0.5)  # the command is running
        killed_at = time.monotonic()
        await asyncio.to_thread(docker_client.containers.get(sandbox.container_id).kill)
        with pytest.raises(SandboxUnavailableError):
            await asyncio.wait_for(call, HANG_GUARD)
        seconds = time.monotonic() - killed_at
        with pytest.raises(SandboxUnavailableError):
            await asyncio.wait_for(run(backend, ["/bin/true"]), HANG_GUARD)
    print(f"typed error {seconds:.3f} s after the kill")
    assert _containers(docker_client, sandbox.session) == []


def test_reaper_removes_orphaned_and_expired_containers_and_reports_them(docker_client, sandbox_image):
    now = time.time()
    host_dir = private_subdir("reaper-test")
    cases = {
        "orphan": leftovers.labels(_dead_process_owner(), uuid.uuid4().hex, 3600, [host_dir]),
        "expired": leftovers.labels(leftovers.process_owner(), uuid.uuid4().hex, 60, [], now=now - 120),
        "live": leftovers.labels(leftovers.process_owner(), uuid.uuid4().hex, 3600, []),
        "appliance": leftovers.labels("appliance:elsewhere", uuid.uuid4().hex, None, []),
    }
    made = {}
    try:
        for case, labels in cases.items():
            name = f"{TEST_NAME_PREFIX}reaper-{case}-{uuid.uuid4().hex[:6]}"
            made[case] = docker_client.containers.create(BASE_IMAGE, ["/bin/true"], labels=labels,
                                                        network_mode="none", name=name)
        reaped = {gone.name: gone for gone in leftovers.reap(docker_client)}

        assert reaped[made["orphan"].name].reason == "owner gone"
        assert reaped[made["expired"].name].reason == "expired"
        assert made["live"].name not in reaped and made["appliance"].name not in reaped
        for case in ("orphan", "expired"):
            with pytest.raises(docker.errors.NotFound):
                docker_client.containers.get(made[case].id)
        docker_client.containers.get(made["live"].id)
        assert not host_dir.exists()
    finally:
        for container in made.values():
            try:
                container.remove(force=True)
            except docker.errors.NotFound:
                pass


async def test_starting_a_sandbox_reaps_and_reports_orphans(docker_client, sandbox_image, tmp_path):
    orphan = docker_client.containers.create(
        BASE_IMAGE, ["/bin/true"], network_mode="none",
        labels=leftovers.labels(_dead_process_owner(), uuid.uuid4().hex, 3600, []))
    sandbox = DockerSandbox([tmp_path], image=sandbox_image)
    async with sandbox:
        assert orphan.short_id in [gone.container_id for gone in sandbox.reaped]
    with pytest.raises(docker.errors.NotFound):
        docker_client.containers.get(orphan.id)


async def test_tcp_mode_speaks_tls_needs_the_token_and_commands_cannot_read_either(docker_client, sandbox_image,
                                                                                       run, tmp_path):
    import grpc

    from protolink.errors import CertificateMismatchError, SandboxAuthenticationError, SandboxNotReachedError
    from protolink.sandbox import connect
    from protolink.sandbox.client import attach

    tmp_path.chmod(0o755)
    sandbox = DockerSandbox([tmp_path], image=sandbox_image, tcp="127.0.0.1:0")
    async with sandbox as backend:
        secrets = "/run/protolink-secret"
        seen = await run(backend, ["/bin/sh", "-c", f"env; cat {secrets}/token {secrets}/tls-key.pem; ls {secrets}"])
        assert sandbox.token and sandbox.token not in seen.stdout + seen.stderr
        assert "PRIVATE KEY" not in seen.stdout and seen.stderr.count("Permission denied") == 3
        assert sandbox.fingerprint and sandbox.fingerprint.startswith("sha256:")
        for token in (None, "wrong"):
            with pytest.raises(SandboxAuthenticationError):
                await asyncio.wait_for(connect(sandbox.address, token=token, timeout=30,
                                               fingerprint=sandbox.fingerprint), HANG_GUARD)
        with pytest.raises(CertificateMismatchError):  # another server's certificate
            await connect(sandbox.address, token=sandbox.token, timeout=30, fingerprint="sha256:" + "0" * 64)
        with pytest.raises(ValueError, match="fingerprint"):  # no plaintext client
            await connect(sandbox.address, token=sandbox.token, timeout=5)
        plaintext = grpc.aio.insecure_channel(sandbox.address)  # the token would go in clear: never answered
        with pytest.raises(SandboxNotReachedError):
            await attach(plaintext, (("authorization", f"Bearer {sandbox.token}"),), timeout=3)
        await plaintext.close()
        other = await connect(sandbox.address, token=sandbox.token, timeout=30, fingerprint=sandbox.fingerprint)
        assert await other.health()
        await other.aclose()
    assert _containers(docker_client, sandbox.session) == []
