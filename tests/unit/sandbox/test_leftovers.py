"""Owner labels tell a live process from a dead one, and expiry is an absolute time."""

from __future__ import annotations

import subprocess
import sys

from protolink.sandbox import leftovers


def test_this_process_is_a_live_owner():
    assert not leftovers.owner_gone(leftovers.process_owner())


def test_a_finished_process_is_a_gone_owner():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    owner = leftovers.process_owner(child.pid)
    child.wait()
    assert leftovers.owner_gone(owner)


def test_owners_that_are_not_processes_of_this_host_are_never_gone():
    assert not leftovers.owner_gone("appliance:somewhere")
    assert not leftovers.owner_gone("process:another-host:1:1")
    assert not leftovers.owner_gone("process:garbage")


def test_an_owner_in_another_pid_namespace_is_never_gone():
    # A session in a container that shares the engine and the host name: its pids are not ours
    # to look up, so its sandboxes are left to their expiry instead of being reaped while in use.
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    owner = leftovers.process_owner(child.pid)
    child.wait()
    kind, host, pid, ticks = owner.split(":")
    name, namespace = host.split("/")
    assert not leftovers.owner_gone(f"{kind}:{name}/{int(namespace) + 1}:{pid}:{ticks}")


def test_labels_carry_expiry_as_an_absolute_time(tmp_path):
    labels = leftovers.labels("appliance:x", "s1", 60, [tmp_path], now=1000)
    assert labels[leftovers.CREATED_LABEL] == "1000" and labels[leftovers.EXPIRY_LABEL] == "1060"
    assert leftovers.labels("appliance:x", "s1", None, [], now=1000)[leftovers.EXPIRY_LABEL] == "0"
    assert labels[leftovers.HOSTDIRS_LABEL] == str(tmp_path)


def test_host_dirs_outside_the_runtime_dir_are_never_removed(tmp_path):
    keep = tmp_path / "keep"
    keep.mkdir()
    leftovers.remove_host_dirs({leftovers.HOSTDIRS_LABEL: str(keep)})
    assert keep.exists()


class _Engine:
    """A docker SDK client whose engine lists two abandoned containers, the first already being removed."""

    def __init__(self) -> None:
        import docker.errors

        self.removed: list[str] = []
        self._busy = docker.errors.APIError("409 Conflict", response=_Response(409),
                                            explanation="removal of container busy is already in progress")
        self.api = self

    def containers(self, all: bool, filters: dict) -> list[dict]:
        owner = {leftovers.OWNER_LABEL: "x", leftovers.EXPIRY_LABEL: "1"}
        return [{"Id": "busy" * 16, "Names": ["/busy"], "Labels": owner},
                {"Id": "idle" * 16, "Names": ["/idle"], "Labels": owner}]

    def remove_container(self, container_id: str, force: bool) -> None:
        if container_id.startswith("busy"):
            raise self._busy
        self.removed.append(container_id)


class _Response:
    def __init__(self, status_code: int) -> None:
        self.status_code = status_code
        self.reason = "Conflict"


def test_a_container_already_being_removed_is_skipped_and_the_rest_are_reaped():
    engine = _Engine()
    reaped = leftovers.reap(engine, now=2)
    assert [(gone.name, gone.reason) for gone in reaped] == [("idle", "expired")]
    assert engine.removed == ["idle" * 16]


class _Manager:
    """A docker SDK client of a Swarm manager listing a service whose lease expired, one whose
    lease runs, one without an expiry, and an expired one that is removed meanwhile."""

    def __init__(self) -> None:
        self.removed: list[str] = []
        self.api = self

    def services(self, filters: dict) -> list[dict]:
        def service(name: str, expiry: str) -> dict:
            return {"ID": name * 8, "Spec": {"Name": name, "Labels": {leftovers.OWNER_LABEL: "service:svc",
                                                                      leftovers.EXPIRY_LABEL: expiry}}}

        return [service("gone", "100"), service("kept", "300"), service("none", "0"), service("raced", "100")]

    def remove_service(self, service_id: str) -> None:
        import docker.errors

        if service_id.startswith("raced"):
            raise docker.errors.NotFound("no such service")
        self.removed.append(service_id)


def test_a_swarm_service_is_reaped_once_its_lease_expired_and_never_without_one():
    manager = _Manager()
    reaped = leftovers.reap(manager, leftovers.swarm_services, now=200)
    assert [(gone.name, gone.owner, gone.reason) for gone in reaped] == [("gone", "service:svc", "expired")]
    assert manager.removed == ["gone" * 8]
