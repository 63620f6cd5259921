"""The proof that the Docker Engine works here: a FROM-scratch image with Debian's static busybox,
built through the docker SDK and run with no network; and that the engine module's create makes
the container the SDK's would."""

from __future__ import annotations

import io
import tarfile
import uuid
from pathlib import Path

import docker.errors
import pytest
from docker.types import LogConfig, Mount, Ulimit

from protolink.sandbox.engine import create_container

pytestmark = pytest.mark.docker

BUSYBOX = Path("/bin/busybox")  # Debian's busybox-static
LABELS = {"io.protolink.owner": "test"}
DOCKERFILE = b'FROM scratch\nCOPY busybox /bin/busybox\nENTRYPOINT ["/bin/busybox"]\n'


def _build_context() -> io.BytesIO:
    if not BUSYBOX.is_file():
        pytest.fail(f"{BUSYBOX} is missing: apt-get install busybox-static", pytrace=False)
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        for name, data, mode in (("Dockerfile", DOCKERFILE, 0o644), ("busybox", BUSYBOX.read_bytes(), 0o755)):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    context.seek(0)
    return context


@pytest.fixture
def busybox_image(docker_client):
    tag = f"protolink-test/busybox:{uuid.uuid4().hex[:12]}"
    image, _ = docker_client.images.build(
        fileobj=_build_context(), custom_context=True, tag=tag, labels=LABELS, rm=True, forcerm=True
    )
    yield tag
    docker_client.images.remove(image.id, force=True)


def test_scratch_busybox_runs_without_network(docker_client, busybox_image):
    container = docker_client.containers.create(
        busybox_image,
        ["sh", "-c", "busybox echo hello && busybox cat /proc/net/dev"],
        network_mode="none",
        labels=LABELS,
    )
    try:
        container.start()
        status = container.wait(timeout=60)["StatusCode"]
        output = container.logs().decode()
        network_mode = container.attrs["HostConfig"]["NetworkMode"]
    finally:
        container.remove(force=True)

    assert status == 0, output
    assert network_mode == "none"
    lines = output.splitlines()
    assert lines[0] == "hello"
    # /proc/net/dev: two header lines, then one "name: counters" line per interface.
    interfaces = [line.split(":", 1)[0].strip() for line in lines[3:]]
    assert interfaces == ["lo"], output


def _labelled(docker_client, labels: dict[str, str]) -> list:
    """Every container, running or not, that carries ``labels``."""
    return docker_client.containers.list(all=True, filters={"label": [f"{k}={v}" for k, v in labels.items()]})


def _sandbox_like(image: str, labels: dict[str, str]) -> dict:
    """Keywords of the kinds a sandbox's container is created with (limits, mounts, hardening)."""
    return {"image": image, "command": ["sh", "-c", "exit 3"], "labels": labels, "network_mode": "none",
            "user": "65534:65534", "read_only": True, "tmpfs": {"/tmp": "size=1m,noexec"}, "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"], "mem_limit": 64 * 1024 * 1024,
            "memswap_limit": 64 * 1024 * 1024, "pids_limit": 32, "environment": {"PATH": "/bin"},
            "ulimits": [Ulimit(name="nofile", soft=64, hard=64)], "log_config": LogConfig(type="json-file"),
            "mounts": [Mount("/data", "/etc", type="bind", read_only=True)]}


def test_create_container_makes_what_the_sdks_create_makes(docker_client, busybox_image):
    labels = {**LABELS, "io.protolink.test": uuid.uuid4().hex}
    ours = create_container(docker_client, name=f"protolink-test-ours-{uuid.uuid4().hex[:8]}",
                            **_sandbox_like(busybox_image, labels))
    try:
        theirs = docker_client.containers.create(name=f"protolink-test-sdk-{uuid.uuid4().hex[:8]}",
                                                 **_sandbox_like(busybox_image, labels))
        try:
            assert ours.attrs == {"Id": ours.id}  # no inspection after the create
            ours.reload()
            assert ours.attrs["HostConfig"] == theirs.attrs["HostConfig"]
            assert {**ours.attrs["Config"], "Hostname": ""} == {**theirs.attrs["Config"], "Hostname": ""}
            assert ours.labels == labels and ours.attrs["HostConfig"]["PidsLimit"] == 32
            ours.start()
            assert ours.wait(timeout=60)["StatusCode"] == 3
        finally:
            theirs.remove(force=True)
    finally:
        ours.remove(force=True)
    assert _labelled(docker_client, labels) == []


def test_create_container_refused_raises_the_sdks_error_and_leaves_nothing(docker_client):
    labels = {**LABELS, "io.protolink.test": uuid.uuid4().hex}
    with pytest.raises(docker.errors.ImageNotFound):
        create_container(docker_client, image=f"protolink-test/missing:{uuid.uuid4().hex[:12]}", command=["true"],
                         labels=labels)
    assert _labelled(docker_client, labels) == []
