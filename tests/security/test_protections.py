"""A placement that loses a protection: the server closes the gap itself, or refuses to serve.

Each sandbox here is DockerSandbox's own container (``container_spec``) with some fields
changed, as another placement might leave them (a Docker Swarm service drops the seccomp
profile and no-new-privileges).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import docker.errors
import pytest

from protolink.errors import SandboxProtectionError
from protolink.sandbox.docker import DockerSandbox
from protolink.sandbox.placements.docker import ContainerSpec, EngineFacts, HostFacts
from protolink.wire.protections import seccomp_profile

from .conftest import GVISOR, LIMITS, RUNTIME, Attacker

pytestmark = pytest.mark.docker

Change = Callable[[ContainerSpec], ContainerSpec]

#: A command's view of its own protections, and a personality the profile denies (PER_LINUX32).
OWN_PROTECTIONS = r"""
import ctypes, json
libc = ctypes.CDLL(None, use_errno=True)
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
denied = libc.personality(ctypes.c_ulong(0x0008))
print(json.dumps({"NoNewPrivs": status.get("NoNewPrivs", "").strip(), "Seccomp": status.get("Seccomp", "").strip(),
                  "no_new_privs": libc.prctl(39, 0, 0, 0, 0), "seccomp_mode": libc.prctl(21, 0, 0, 0, 0),
                  "personality32": ctypes.get_errno() if denied < 0 else 0}))
"""
PR_SET_SECCOMP, PR_SET_NO_NEW_PRIVS = 22, 38


class ChangedSandbox(DockerSandbox):
    """A DockerSandbox whose container is ``container_spec``'s with ``change`` applied."""

    def __init__(self, change: Change, *roots: Path, **options: object) -> None:
        super().__init__(list(roots), **options)
        self._change = change

    def _spec(self, engine_facts: EngineFacts, host: HostFacts) -> ContainerSpec:
        return self._change(super()._spec(engine_facts, host))


def changed(spec: ContainerSpec, **fields: object) -> ContainerSpec:
    return replace(spec, **fields)


def without_nproc(spec: ContainerSpec) -> ContainerSpec:
    """No pids limit at all: neither the cgroup's nor RLIMIT_NPROC (gVisor's bound on tasks)."""
    return replace(spec, pids_limit=-1, ulimits=tuple(limit for limit in spec.ulimits if limit.name != "nproc"))


def container_profile(*, deny_prctl: int, deny_seccomp: bool) -> str:
    """The product's profile for the container, less ``prctl(deny_prctl, ...)`` and maybe ``seccomp``."""
    profile = json.loads(seccomp_profile())
    for rule in profile["syscalls"]:
        rule["names"] = [name for name in rule["names"]
                         if name != "prctl" and not (deny_seccomp and name == "seccomp")]
    profile["syscalls"].append({"names": ["prctl"], "action": "SCMP_ACT_ALLOW",
                                "args": [{"index": 0, "value": deny_prctl, "op": "SCMP_CMP_NE"}]})
    return json.dumps(profile)


async def refusal(sandbox_image: str, box_root: Path, change: Change, docker_client: Any) -> dict[str, str]:
    """What the server said is missing when it refused to serve; its container is gone."""
    sandbox = ChangedSandbox(change, box_root, image=sandbox_image, runtime=RUNTIME, **LIMITS)
    try:
        with pytest.raises(SandboxProtectionError) as refused:
            await sandbox.start()
    finally:
        await sandbox.aclose()  # when it served after all
    assert all(name in str(refused.value) for name in refused.value.missing), refused.value
    assert sandbox.container_id is not None
    with pytest.raises(docker.errors.NotFound):
        docker_client.containers.get(sandbox.container_id)
    return refused.value.missing


async def own_protections(sandbox_image: str, box_root: Path, change: Change) -> dict[str, object]:
    sandbox = ChangedSandbox(change, box_root, image=sandbox_image, runtime=RUNTIME, **LIMITS)
    await sandbox.start()
    try:
        return await Attacker(sandbox.backend, box_root).probe(OWN_PROTECTIONS)
    finally:
        await sandbox.aclose()


async def test_placement_drops_seccomp_and_no_new_privileges(sandbox_image, box_root):
    """A placement that drops the seccomp profile and no-new-privileges (a Swarm service does); a command calls personality(PER_LINUX32), which the profile denies.

    The command still has no_new_privs and a seccomp filter (the server's own, from the same profile): /proc/self/status says NoNewPrivs 1 and Seccomp 2 (gVisor shows only the mode, through prctl), and the call fails with EPERM.
    """
    unconfined = await own_protections(sandbox_image, box_root,
                                       lambda spec: changed(spec, security_opt=("seccomp=unconfined",)))
    assert unconfined["no_new_privs"] == 1 and unconfined["seccomp_mode"] == 2, unconfined
    if not GVISOR:
        assert (unconfined["NoNewPrivs"], unconfined["Seccomp"]) == ("1", "2"), unconfined
    assert unconfined["personality32"] == 1, unconfined


MISSING: dict[str, tuple[Change, str]] = {
    "capability": (lambda spec: changed(spec, cap_add=(*spec.cap_add, "DAC_OVERRIDE")), "capabilities"),
    "network": (lambda spec: changed(spec, network_mode="bridge"), "network"),
    "writable root": (lambda spec: changed(spec, read_only=False), "read_only_root"),
    "no pids limit": (without_nproc, "pids_limit"),
    "no memory limit": (lambda spec: changed(spec, mem_limit=0, memswap_limit=0), "memory_limit"),
}


@pytest.mark.parametrize("lost", list(MISSING))
async def test_placement_lacks_a_protection(lost, sandbox_image, box_root, docker_client):
    """A placement that starts the server with a capability added (DAC_OVERRIDE), on the engine's default bridge, with a writable root, with no pids limit, or with no memory limit.

    The server refuses to serve before it starts anything: the host's start fails with SandboxProtectionError naming exactly what is missing (capabilities, network, read_only_root, pids_limit, memory_limit), and no container is left. Under gVisor two are out of the server's sight, and it serves: this engine's runsc runs with --network=none (scripts/gvisor-up.sh), so on the bridge the sandbox still has only lo, and the memory cgroup is not visible inside.
    """
    change, name = MISSING[lost]
    if GVISOR and name in ("network", "memory_limit"):
        assert (await own_protections(sandbox_image, box_root, change))["seccomp_mode"] == 2
        return
    missing = await refusal(sandbox_image, box_root, change, docker_client)
    assert set(missing) == {name}, missing
    if name == "capabilities":
        assert "DAC_OVERRIDE" in missing[name]


async def test_placement_holds_the_pids_limit_out_of_sight(sandbox_image, box_root):
    """A placement that holds the pids limit where the server cannot see it (a Kubernetes Pod's, on the Pod's cgroup) and says so with --held-elsewhere pids_limit; here the container has none.

    The server does not look for that one and serves, with its other checks and its own filter in place: a command has Seccomp 2. The same container without the flag is refused (test_placement_lacks_a_protection).
    """
    probe = await own_protections(sandbox_image, box_root, lambda spec: changed(
        without_nproc(spec), command=(*spec.command, "--held-elsewhere", "pids_limit")))
    assert probe["seccomp_mode"] == 2 and probe["no_new_privs"] == 1, probe


async def test_placement_forbids_the_servers_own_filter(sandbox_image, box_root, docker_client):
    """A placement whose own seccomp profile denies what the server needs to filter itself (seccomp(2) and prctl(PR_SET_SECCOMP)).

    The server refuses to serve, and the host's SandboxProtectionError names seccomp. Under gVisor, which applies no container profile inside, nothing stops the server's filter: it serves, and commands are filtered.
    """
    profile = container_profile(deny_prctl=PR_SET_SECCOMP, deny_seccomp=True)
    change: Change = lambda spec: changed(spec, security_opt=("no-new-privileges", f"seccomp={profile}"))  # noqa: E731
    if GVISOR:
        assert (await own_protections(sandbox_image, box_root, change))["seccomp_mode"] == 2
        return
    missing = await refusal(sandbox_image, box_root, change, docker_client)
    assert set(missing) == {"seccomp"}, missing


async def test_placement_forbids_no_new_privileges(sandbox_image, box_root, docker_client):
    """A placement without no-new-privileges whose seccomp profile denies prctl(PR_SET_NO_NEW_PRIVS).

    The server refuses to serve, and the host's SandboxProtectionError names no_new_privs (and seccomp, which cannot be loaded without it or CAP_SYS_ADMIN). Under gVisor, which applies no container profile inside, the server sets both and serves.
    """
    profile = container_profile(deny_prctl=PR_SET_NO_NEW_PRIVS, deny_seccomp=False)
    change: Change = lambda spec: changed(spec, security_opt=(f"seccomp={profile}",))  # noqa: E731
    if GVISOR:
        assert (await own_protections(sandbox_image, box_root, change))["no_new_privs"] == 1
        return
    missing = await refusal(sandbox_image, box_root, change, docker_client)
    assert set(missing) == {"no_new_privs", "seccomp"}, missing
