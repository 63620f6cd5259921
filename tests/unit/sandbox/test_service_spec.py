"""The Swarm service a sandbox configuration becomes, field by field, without a cluster."""

from __future__ import annotations

from pathlib import Path

import pytest
from docker.types import DriverConfig, Mount, Ulimit

from protolink.sandbox import leftovers
from protolink.sandbox.config import Identity, Lease, Limits, MiB, PublishedPort, SandboxConfig
from protolink.sandbox.egress.policy import EgressPolicy
from protolink.sandbox.placements.docker import EngineFacts, HostFacts, container_spec
from protolink.sandbox.placements.swarm import PlacementFacts, SwarmFacts, service_spec
from protolink.sandbox.images import DEFAULT_IMAGE
from protolink.wire.roots import Root

CREATED = 1_700_000_000
SWARM = SwarmFacts(node_cpus=4)
PLACED = PlacementFacts(created=CREATED)
LEASE = Lease(owner="process:host:1:2", session="0123456789abcdef")
NAME = "protolink-sandbox-0123456789abcdef"


def config(*roots: Root, **parts: object) -> SandboxConfig:
    return SandboxConfig(roots=roots, lease=parts.pop("lease", LEASE), **parts)  # type: ignore[arg-type]


def test_one_task_never_restarted_and_no_network_attached():
    spec = service_spec(config(), SWARM, PLACED)
    assert spec.name == NAME
    assert spec.mode == {"replicated": {"Replicas": 1}}
    assert spec.restart_policy == {"Condition": "none", "Delay": 0, "MaxAttempts": 0, "Window": 0}
    kwargs = spec.create_kwargs()
    assert "networks" not in kwargs and "endpoint_spec" not in kwargs
    assert "Networks" not in kwargs["task_template"]


def test_the_server_runs_as_root_with_the_docker_placements_capabilities_on_a_read_only_root():
    container = service_spec(config(), SWARM, PLACED).container
    assert (container["Image"], container["Hostname"], container["User"]) == (DEFAULT_IMAGE, "sandbox", "0:0")
    assert container["CapabilityDrop"] == ["ALL"] and container["CapabilityAdd"] == ["SETUID", "SETGID", "KILL"]
    assert container["ReadOnly"] is True
    assert container["Init"] is False  # the image's tini is the init
    assert "Env" not in container and container["Command"] is None  # the image's entrypoint runs the server


def test_the_server_gets_the_docker_placements_arguments():
    cfg = config()
    docker = container_spec(cfg, EngineFacts(cpus=4), HostFacts(Path("/x"), CREATED, "{}"))
    assert tuple(service_spec(cfg, SWARM, PLACED).container["Args"]) == docker.command
    assert docker.command[-2:] == ("--listen", "unix:///run/protolink/sandbox.sock")


def test_the_socket_directory_and_scratch_space_are_tmpfs_of_the_task_own():
    mounts = service_spec(config(limits=Limits(tmpfs_bytes=8 * MiB, shm_bytes=2 * MiB)), SWARM, PLACED).container["Mounts"]
    assert mounts == [
        Mount("/run/protolink", None, type="tmpfs", tmpfs_size=1 * MiB, tmpfs_mode=0o700),
        Mount("/tmp", None, type="tmpfs", tmpfs_size=8 * MiB, tmpfs_mode=0o1777),
        Mount("/dev/shm", None, type="tmpfs", tmpfs_size=2 * MiB, tmpfs_mode=0o1777),
    ]


def test_roots_are_bind_mounted_at_their_own_paths_read_only_unless_writable(ro, rw):
    spec = service_spec(config(Root(str(ro)), Root(str(rw), writable=True)), SWARM, PLACED)
    assert spec.container["Mounts"][:2] == [Mount(str(ro), str(ro), type="bind", read_only=True),
                                            Mount(str(rw), str(rw), type="bind", read_only=False)]
    assert spec.container["Args"][6:10] == ["--root", f"{ro}:ro", "--root", f"{rw}:rw"]


def test_the_workspace_is_a_tmpfs_volume_of_the_sandbox_own_owned_by_the_command_user(ro):
    cfg = config(Root(str(ro)), limits=Limits(disk_bytes=64 * MiB), identity=Identity.of(1234))
    spec = service_spec(cfg, SWARM, PlacementFacts(created=CREATED, workspace="/srv/workspaces/box"))
    (workspace,) = [mount for mount in spec.container["Mounts"] if mount["Target"] == "/srv/workspaces/box"]
    assert workspace == Mount("/srv/workspaces/box", f"{NAME}-workspace", type="volume",
                              labels={leftovers.WORKSPACE_LABEL: NAME}, driver_config=DriverConfig("local", {
                                  "type": "tmpfs", "device": "tmpfs",
                                  "o": f"size={64 * MiB},uid=1234,gid=1234,mode=0700,nosuid,nodev"}))
    assert spec.container["Mounts"][0] == Mount(str(ro), str(ro), type="bind", read_only=True)
    assert spec.container["Args"][6:8] == ["--root", f"{ro}:ro"]
    assert spec.container["Args"][-2:] == ["--root", "/srv/workspaces/box:rw"]  # writable to the server
    assert spec.container["Ulimits"][-1] == Ulimit(name="fsize", soft=64 * MiB, hard=64 * MiB)  # bounded as a root


@pytest.mark.parametrize("workspace", ["relative/box", "ROOT"])
def test_a_workspace_that_is_relative_or_one_of_the_roots_is_refused(ro, workspace):
    with pytest.raises(ValueError, match="must be an absolute path that is not one of the roots"):
        service_spec(config(Root(str(ro))), SWARM,
                     PlacementFacts(created=CREATED, workspace=str(ro) if workspace == "ROOT" else workspace))


def test_ulimits_are_the_docker_placements(rw):
    default = service_spec(config(), SWARM, PLACED).container["Ulimits"]
    assert default == [Ulimit(name="nofile", soft=8192, hard=8192), Ulimit(name="core", soft=0, hard=0),
                       Ulimit(name="nice", soft=0, hard=0)]
    writable = service_spec(config(Root(str(rw), writable=True), limits=Limits(disk_bytes=5 * MiB)), SWARM, PLACED)
    assert writable.container["Ulimits"][-1] == Ulimit(name="fsize", soft=5 * MiB, hard=5 * MiB)


def test_memory_is_limited_and_reserved_pids_limited_and_one_slot_reserved():
    resources = service_spec(config(limits=Limits(memory=512 * MiB, pids=64)), SWARM, PLACED).resources
    assert resources["Limits"] == {"NanoCPUs": 1_000_000_000, "MemoryBytes": 512 * MiB, "Pids": 64}
    assert resources["Reservations"] == {
        "MemoryBytes": 512 * MiB,
        "GenericResources": [{"DiscreteResourceSpec": {"Kind": "protolink-slot", "Value": 1}}],
    }


def test_cpus_are_a_quota_never_a_cpuset_and_none_at_a_nodes_count():
    whole = service_spec(config(limits=Limits(cpus=2)), SWARM, PLACED).resources["Limits"]
    assert whole["NanoCPUs"] == 2_000_000_000
    half = service_spec(config(limits=Limits(cpus=0.5)), SWARM, PLACED).resources["Limits"]
    assert half["NanoCPUs"] == 500_000_000
    everything = service_spec(config(limits=Limits(cpus=4)), SWARM, PLACED).resources["Limits"]
    assert "NanoCPUs" not in everything


def test_gvisor_nodes_get_the_docker_placements_tuning():
    spec = service_spec(config(limits=Limits(memory=768 * MiB, pids=256), runtime="runsc"),
                        SwarmFacts(node_cpus=4, gvisor=True), PLACED)
    assert spec.resources["Limits"]["Pids"] == 256 * 8
    assert spec.container["Ulimits"][-1] == Ulimit(name="nproc", soft=96, hard=96)
    assert "--command-memory-bytes" in spec.container["Args"]


def test_templates_and_runtimes_become_node_label_constraints():
    placed = PlacementFacts(created=CREATED, node_labels={"pool": "gpu", "zone": "a"})
    spec = service_spec(config(runtime="runsc"), SWARM, placed)
    assert spec.placement == {"Constraints": ["node.labels.io.protolink.runtime==runsc", "node.labels.pool==gpu",
                                              "node.labels.zone==a"]}
    other = service_spec(config(runtime="kata"), SWARM, PLACED)
    assert other.placement == {"Constraints": ["node.labels.io.protolink.runtime==kata"]}


def test_a_sandbox_without_a_runtime_is_kept_off_gvisor_nodes():
    assert service_spec(config(), SWARM, PLACED).placement == {"Constraints": [
        "node.labels.io.protolink.runtime!=runsc"]}  # a node without the label satisfies it
    zoned = service_spec(config(), SWARM, PlacementFacts(created=CREATED, node_labels={"zone": "a"}))
    assert zoned.placement == {"Constraints": ["node.labels.zone==a", "node.labels.io.protolink.runtime!=runsc"]}


def test_on_gvisor_nodes_the_socket_directory_is_a_volume_of_the_task_own():
    spec = service_spec(config(runtime="runsc"), SwarmFacts(node_cpus=4, gvisor=True), PLACED)
    (channel,) = [mount for mount in spec.container["Mounts"] if mount["Target"] == "/run/protolink"]
    assert channel == Mount("/run/protolink", f"{NAME}-channel", type="volume",
                            labels={leftovers.WORKSPACE_LABEL: NAME}, driver_config=DriverConfig("local", {
                                "type": "tmpfs", "device": "tmpfs",
                                "o": f"size={1 * MiB},mode=0700,nosuid,nodev,noexec"}))
    assert [mount["Target"] for mount in spec.container["Mounts"]] == ["/run/protolink", "/tmp", "/dev/shm"]
    assert spec.container["Args"][-2:] == ["--listen", "unix:///run/protolink/sandbox.sock"]


def test_service_and_container_carry_the_reapers_labels():
    spec = service_spec(config(lease=Lease(owner="o", session="s", expiry_seconds=60)), SWARM, PLACED)
    assert spec.labels == {"io.protolink.owner": "o", "io.protolink.session": "s",
                           "io.protolink.created": str(CREATED), "io.protolink.expiry": str(CREATED + 60),
                           "io.protolink.hostdirs": ""}  # nothing is made on a node
    assert spec.container["Labels"] == spec.labels


def test_the_placements_own_labels_join_them_and_never_replace_the_reapers():
    placed = PlacementFacts(created=CREATED, labels={"io.protolink.service": "svc", "io.protolink.owner": "forged"})
    spec = service_spec(config(lease=Lease(owner="o", session="s")), SWARM, placed)
    assert spec.labels["io.protolink.service"] == "svc" and spec.labels["io.protolink.owner"] == "o"
    assert spec.container["Labels"] == spec.labels


def test_logs_are_bounded_as_on_docker():
    spec = service_spec(config(), SWARM, PLACED)
    assert spec.log_driver == {"Name": "json-file", "Options": {"max-size": "1m", "max-file": "1"}}


def test_commands_run_as_the_configured_user():
    args = service_spec(config(identity=Identity(1000, 2000)), SWARM, PLACED).container["Args"]
    assert args[2:6] == ["--command-uid", "1000", "--command-gid", "2000"]


def test_egress_adds_only_the_relays_port():
    plain = service_spec(config(), SWARM, PLACED)
    spec = service_spec(config(egress=EgressPolicy.parse(["pypi.org"])), SWARM, PLACED)
    assert spec.container["Args"] == [*plain.container["Args"], "--egress-port", "3128"]
    assert spec.container["Mounts"] == plain.container["Mounts"]


def test_a_ca_file_is_refused_by_name(tmp_path):
    bundle = tmp_path / "ca.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    with pytest.raises(ValueError, match="swarm placement: ca_file is not placed"):
        service_spec(config(ca_file=str(bundle)), SWARM, PLACED)


def test_tcp_mode_is_refused_by_name():
    with pytest.raises(ValueError, match="swarm placement: network must be NoNetwork"):
        service_spec(config(network=PublishedPort()), SWARM, PLACED)


def test_the_task_template_holds_every_part(ro):
    spec = service_spec(config(Root(str(ro))), SWARM, PLACED)
    kwargs = spec.create_kwargs()
    assert set(kwargs) == {"task_template", "name", "labels", "mode"}
    assert (kwargs["name"], kwargs["labels"], kwargs["mode"]) == (NAME, spec.labels, spec.mode)
    assert kwargs["task_template"] == {"ContainerSpec": spec.container, "Resources": spec.resources,
                                       "RestartPolicy": spec.restart_policy, "Placement": spec.placement,
                                       "LogDriver": spec.log_driver}
