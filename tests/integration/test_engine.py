"""The proof that the Docker Engine works here: a FROM-scratch image with Debian's static busybox,
built through the docker SDK and run with no network."""

from __future__ import annotations

import io
import tarfile
import uuid
from pathlib import Path

import pytest

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
