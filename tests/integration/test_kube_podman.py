"""The generated Pod, run by Debian's podman (``podman kube play``): its securityContext holds.

No Kubernetes cluster can run here; podman runs the Pod manifest itself, as a kubelet would, and
this checks from the host what the server's processes got. podman 4.3 reads the seccomp profile
from the Pod's annotation only (not ``securityContext.seccompProfile``), makes a Memory
``emptyDir`` a plain directory rather than a tmpfs, and enforces no NetworkPolicy
(``--network none`` stands for it). Its default ulimits exceed what this machine allows, so the
node's setting (``containers.conf``) gives the configuration's. Everything the test creates in
podman (pod, containers, volumes, images) is removed afterwards.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from protolink.sandbox.config import Lease, SandboxConfig
from protolink.sandbox.docker import seccomp_profile
from protolink.sandbox.exec_client import Command, execute
from protolink.sandbox.placements.kubernetes import (
    SECCOMP_PROFILE,
    ClusterFacts,
    NodeFacts,
    pod_manifest,
    scratch_volume,
)
from protolink.wire.roots import Root
from tests.conftest import TEST_NAME_PREFIX, _require

pytestmark = [pytest.mark.docker, pytest.mark.root]

HANG_GUARD = 120
#: The server's capabilities (SETUID, SETGID, KILL) as /proc/PID/status shows them.
SERVER_CAPS = f"{(1 << 5) | (1 << 6) | (1 << 7):016x}"


def podman(*args: str, conf: Path | None = None) -> str:
    environment = {**os.environ, "CONTAINERS_CONF": str(conf)} if conf else None
    done = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=HANG_GUARD, env=environment)
    assert done.returncode == 0, f"podman {' '.join(args)}: {done.stderr}"
    return done.stdout


def inventory() -> dict[str, set[str]]:
    """What podman holds: every pod, container, volume and image."""
    return {kind: set(podman(*listing).split()) for kind, listing in (
        ("pod", ("pod", "ps", "-q", "--no-trunc")), ("container", ("ps", "-aq", "--no-trunc")),
        ("volume", ("volume", "ls", "-q")), ("image", ("images", "-aq", "--no-trunc")))}


@dataclass
class PlayedPod:
    config: SandboxConfig
    channel: Path
    root: Path
    init_pid: int
    server_pid: int
    container: str
    volumes: set[str]  # those podman made for the Pod


@pytest.fixture(scope="session")  # set up before the (session) image: fails at once without podman
def podman_installed() -> None:
    """Skip without podman, or fail under PROTOLINK_REQUIRE_DOCKER=1 (CI), as the engine's tests do."""
    _require(None if shutil.which("podman") else "podman is not installed (make podman)")


@pytest.fixture(scope="module")
def played(podman_installed: None, sandbox_image: str) -> Iterator[PlayedPod]:
    before = inventory()
    work = Path(tempfile.mkdtemp(prefix="protolink-kube-"))
    try:
        podman("pull", "-q", f"docker-daemon:{sandbox_image}")
        (work / "seccomp" / SECCOMP_PROFILE).parent.mkdir(parents=True)
        (work / "seccomp" / SECCOMP_PROFILE).write_text(seccomp_profile())
        (work / "ro").mkdir()
        (work / "ro" / "file.txt").write_text("from the host\n")
        channel = work / "channel"
        channel.mkdir(mode=0o700)
        config = SandboxConfig(roots=(Root(str(work / "ro")),), image=sandbox_image,
                               lease=Lease(owner="kube-test", session="kube"), name=f"{TEST_NAME_PREFIX}kube")
        conf = work / "containers.conf"
        conf.write_text(f'[containers]\ndefault_ulimits = ["nofile={config.limits.nofile}:{config.limits.nofile}", '
                        '"nproc=4096:4096"]\n')
        (work / "pod.yaml").write_text(yaml.safe_dump(pod_manifest(config, ClusterFacts(), NodeFacts(channel, 0))))
        podman("kube", "play", "--network", "none", "--seccomp-profile-root", str(work / "seccomp"),
               str(work / "pod.yaml"), conf=conf)
        container = f"{config.name}-sandbox"
        tini = int(podman("inspect", container, "--format", "{{.State.Pid}}"))
        execute(f"unix://{channel}/sandbox.sock", None, Command(["/bin/true"], "/", {}, 30, 1024),
                connect_seconds=HANG_GUARD)  # the server answers
        (server,) = Path(f"/proc/{tini}/task/{tini}/children").read_text().split()
        volumes = inventory()["volume"] - before["volume"]
        yield PlayedPod(config, channel, work / "ro", tini, int(server), container, volumes)
    finally:
        after = inventory()
        for kind, remove in (("pod", ("pod", "rm", "-f")), ("container", ("rm", "-f")),
                             ("volume", ("volume", "rm", "-f")), ("image", ("rmi", "-f"))):
            if made := sorted(after[kind] - before[kind]):
                podman(*remove, *made)
        shutil.rmtree(work)
    assert inventory() == before


def status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {key: value.strip() for key, _, value in (line.partition(":") for line in lines)}


def run(pod: PlayedPod, *argv: str) -> tuple[int | None, str]:
    with tempfile.TemporaryFile() as out:
        outcome = execute(f"unix://{pod.channel}/sandbox.sock", None, Command(argv, "/", {}, 60, 1 << 16),
                          outputs={1: out.fileno(), 2: out.fileno()})
        out.seek(0)
        return outcome.exit_code, out.read().decode()


def test_the_server_keeps_only_its_capabilities_under_no_new_privileges_and_seccomp(played):
    for pid in (played.init_pid, played.server_pid):  # tini, and the server it started
        seen = status(pid)
        assert seen["Uid"].split() == ["0"] * 4
        assert (seen["NoNewPrivs"], seen["Seccomp"]) == ("1", "2")
        assert seen["CapEff"] == seen["CapPrm"] == seen["CapBnd"] == SERVER_CAPS
        assert seen["CapInh"] == seen["CapAmb"] == "0" * 16


def test_the_seccomp_profile_is_the_products_not_the_runtimes_default(played):
    # ptrace(PTRACE_TRACEME): podman's default profile allows it; the product's returns EPERM.
    probe = ("import ctypes; libc = ctypes.CDLL(None, use_errno=True); "
             "print(libc.ptrace(0, 0, 0, 0), ctypes.get_errno())")
    assert podman("exec", played.container, "/opt/protolink/bin/python", "-I", "-c", probe).split() == ["-1", "1"]


def test_commands_run_as_nobody_without_privileges(played):
    code, out = run(played, "/bin/cat", "/proc/self/status")
    seen = {key: value.strip() for key, _, value in (line.partition(":") for line in out.splitlines())}
    assert code == 0 and seen["Uid"].split() == ["65534"] * 4
    assert (seen["NoNewPrivs"], seen["CapEff"], seen["CapBnd"]) == ("1", "0" * 16, SERVER_CAPS)


def test_the_root_file_system_and_read_only_roots_cannot_be_written(played):
    mounts = {fields[4]: fields[5] for fields in (line.split() for line in
                                                 Path(f"/proc/{played.server_pid}/mountinfo").read_text().splitlines())}
    assert mounts["/"].startswith("ro") and mounts[str(played.root)].startswith("ro")
    assert run(played, "/bin/cat", f"{played.root}/file.txt") == (0, "from the host\n")
    for target in ("/etc/x", f"{played.root}/x"):
        code, out = run(played, "/bin/sh", "-c", f"echo x > {target}")
        assert code != 0 and "Read-only file system" in out
    code, _ = run(played, "/bin/sh", "-c", "echo x > /tmp/x && cat /tmp/x")
    assert code == 0  # /tmp is writable (a directory here, a tmpfs on Kubernetes)


def test_the_scratch_volumes_are_the_pods_own(played):
    """podman makes a volume of each emptyDir's name: named after the sandbox, two Pods played at
    once do not share their /tmp."""
    assert played.volumes == {scratch_volume(played.config.name, "tmp"), scratch_volume(played.config.name, "shm")}
