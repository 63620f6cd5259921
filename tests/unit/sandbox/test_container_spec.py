"""The container a sandbox configuration becomes on a Docker Engine, field by field, without an engine."""

from __future__ import annotations

import zlib
from dataclasses import replace
from pathlib import Path

import pytest
from docker.models.containers import _create_container_args
from docker.types import LogConfig, Mount, Ulimit

from protolink.sandbox.appliance import (
    ADDRESS_LABEL,
    APPLIANCE_LABEL,
    Appliance,
    appliance_config,
)
from protolink.sandbox.config import (
    GiB,
    Identity,
    Lease,
    Limits,
    MiB,
    PublishedPort,
    SandboxConfig,
)
from protolink.sandbox.placements.docker import (
    EngineFacts,
    HostFacts,
    container_spec,
    cpu_limit,
)
from protolink.sandbox.egress.policy import DENY_ALL, EgressPolicy
from protolink.sandbox.images import DEFAULT_IMAGE
from protolink.wire.roots import Root

CREATED = 1_700_000_000
PROFILE = '{"defaultAction": "SCMP_ACT_ERRNO", "syscalls": []}'
ENGINE = EngineFacts(cpus=4)
LEASE = Lease(owner="process:host:1:2", session="0123456789abcdef")
NAME = "protolink-sandbox-0123456789abcdef"


@pytest.fixture
def host(tmp_path: Path) -> HostFacts:
    return HostFacts(channel_dir=tmp_path / "channel", created=CREATED, seccomp_profile=PROFILE)


def config(*roots: Root, **parts: object) -> SandboxConfig:
    return SandboxConfig(roots=roots, lease=parts.pop("lease", LEASE), **parts)  # type: ignore[arg-type]


def test_by_default_the_server_runs_locked_down(ro, host):
    spec = container_spec(config(Root(str(ro))), ENGINE, host)
    assert (spec.image, spec.name, spec.hostname, spec.user) == (DEFAULT_IMAGE, NAME, "sandbox", "0:0")
    assert spec.privileged is False and spec.read_only is True
    assert spec.cap_drop == ("ALL",) and spec.cap_add == ("SETUID", "SETGID", "KILL")
    assert spec.security_opt == ("no-new-privileges", f"seccomp={PROFILE}")
    assert (spec.ipc_mode, spec.environment, spec.runtime) == ("private", {}, None)
    assert (spec.network_mode, spec.ports) == ("none", None)
    assert spec.log_config == LogConfig(type="json-file", config={"max-size": "1m", "max-file": "1"})


def test_default_limits(ro, host):
    spec = container_spec(config(Root(str(ro))), ENGINE, host)
    assert spec.mem_limit == spec.memswap_limit == 1 * GiB  # no swap beyond the memory limit
    assert spec.pids_limit == 512
    assert (spec.cpuset_cpus, spec.nano_cpus) == (str(zlib.crc32(NAME.encode()) % 4), None)  # one CPU of its own
    assert spec.ulimits == (Ulimit(name="nofile", soft=8192, hard=8192), Ulimit(name="core", soft=0, hard=0),
                            Ulimit(name="nice", soft=0, hard=0))  # no RLIMIT_FSIZE: nothing is writable
    assert spec.tmpfs == {"/tmp": "size=268435456,nr_inodes=65536,mode=1777,noexec,nosuid,nodev",
                          "/dev/shm": "size=67108864,nr_inodes=16384,mode=1777,noexec,nosuid,nodev"}


def test_the_server_is_told_its_name_command_user_roots_and_socket(ro, host):
    spec = container_spec(config(Root(str(ro))), ENGINE, host)
    assert spec.command == ("--boundary", NAME, "--command-uid", "65534", "--command-gid", "65534",
                            "--root", f"{ro}:ro", "--listen", "unix:///run/protolink/sandbox.sock")


def test_roots_are_mounted_at_their_own_paths_and_the_host_directory_holds_the_socket(ro, rw, host):
    spec = container_spec(config(Root(str(ro)), Root(str(rw), writable=True)), ENGINE, host)
    assert spec.mounts == (Mount(str(ro), str(ro), type="bind", read_only=True),
                           Mount(str(rw), str(rw), type="bind", read_only=False),
                           Mount("/run/protolink", str(host.channel_dir), type="bind"))
    assert spec.command[6:10] == ("--root", f"{ro}:ro", "--root", f"{rw}:rw")


def test_a_writable_root_bounds_every_file_to_the_disk_budget(rw, host):
    spec = container_spec(config(Root(str(rw), writable=True), limits=Limits(disk_bytes=5 * MiB)), ENGINE, host)
    assert Ulimit(name="fsize", soft=5 * MiB, hard=5 * MiB) in spec.ulimits


def test_labels_name_owner_session_times_and_host_directory(host):
    spec = container_spec(config(), ENGINE, host)
    assert spec.labels == {"io.protolink.owner": LEASE.owner, "io.protolink.session": LEASE.session,
                           "io.protolink.created": str(CREATED), "io.protolink.expiry": str(CREATED + 24 * 3600),
                           "io.protolink.hostdirs": str(host.channel_dir)}
    never = container_spec(config(lease=Lease(owner="o", session="s", expiry_seconds=None)), ENGINE, host)
    assert never.labels["io.protolink.expiry"] == "0"
    soon = container_spec(config(lease=Lease(owner="o", session="s", expiry_seconds=0.2)), ENGINE, host)
    assert soon.labels["io.protolink.expiry"] == str(CREATED + 1)


def test_tcp_mode_publishes_the_port_and_mounts_the_token_and_tls_directory_instead(host):
    spec = container_spec(config(network=PublishedPort.parse("0.0.0.0:5000")), ENGINE, host)
    assert (spec.network_mode, spec.ports) == (None, {"7000/tcp": ("0.0.0.0", 5000)})
    assert spec.mounts == (Mount("/run/protolink-secret", str(host.channel_dir), type="bind"),)
    assert spec.command[-8:] == ("--listen", "tcp://0.0.0.0:7000", "--token-file", "/run/protolink-secret/token",
                                 "--tls-cert-file", "/run/protolink-secret/tls-cert.pem",
                                 "--tls-key-file", "/run/protolink-secret/tls-key.pem")
    assert "network_mode" not in spec.create_kwargs()  # the engine's default network, which publishes ports


def test_egress_adds_the_relays_port_and_nothing_else(ro, host):
    plain = container_spec(config(Root(str(ro))), ENGINE, host)
    spec = container_spec(config(Root(str(ro)), egress=EgressPolicy.parse(["pypi.org"])), ENGINE, host)
    assert spec.command == (*plain.command, "--egress-port", "3128")
    assert replace(spec, command=plain.command) == plain  # still no network, no environment, the same mounts
    assert (spec.network_mode, spec.ports, spec.environment) == ("none", None, {})
    deny_all = container_spec(config(egress=DENY_ALL), ENGINE, host)
    assert deny_all.command[-2:] == ("--egress-port", "3128")  # the relay runs: the policy may open later


def test_a_ca_file_is_the_hosts_copy_mounted_read_only_and_named_to_the_server(ro, host, tmp_path):
    bundle = tmp_path / "ca.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    plain = container_spec(config(Root(str(ro))), ENGINE, host)
    spec = container_spec(config(Root(str(ro)), ca_file=str(bundle)), ENGINE, host)
    assert spec.command == (*plain.command, "--ca-file", "/run/protolink-ca/ca-certificates.pem")
    copy = Mount("/run/protolink-ca/ca-certificates.pem", str(host.channel_dir / "ca-certificates.pem"),
                 type="bind", read_only=True)  # never the host's file itself
    assert spec.mounts == (*plain.mounts, copy)
    assert replace(spec, command=plain.command, mounts=plain.mounts) == plain  # no environment: the server adds it


def test_tcp_addresses_default_to_loopback_and_a_port_the_engine_picks():
    assert PublishedPort.parse(":7100") == PublishedPort("127.0.0.1", 7100)
    assert PublishedPort.parse("127.0.0.1:") == PublishedPort("127.0.0.1", 0)
    assert PublishedPort.parse("7100") == PublishedPort("127.0.0.1", 7100)


def test_under_gvisor_tasks_and_memory_per_process_are_bounded_inside(ro, host):
    limits = Limits(memory=768 * MiB, pids=256)
    spec = container_spec(config(Root(str(ro)), limits=limits, runtime="runsc"), EngineFacts(cpus=4, gvisor=True), host)
    assert spec.runtime == "runsc"
    assert spec.pids_limit == 256 * 8  # the cgroup counts runsc's host threads
    assert spec.ulimits[-1] == Ulimit(name="nproc", soft=96, hard=96)  # 768 MiB / 8 MiB a task, below 256
    share = str(384 * MiB)
    assert spec.command[-6:-2] == ("--command-memory-bytes", share, "--worker-memory-bytes", share)
    tasks = container_spec(config(limits=Limits(memory=4 * GiB, pids=100)), EngineFacts(cpus=4, gvisor=True), host)
    assert tasks.ulimits[-1] == Ulimit(name="nproc", soft=100, hard=100)


def test_the_engine_not_the_runtime_name_says_whether_it_is_gvisor(host):
    named = container_spec(config(runtime="runsc"), ENGINE, host)
    assert named.pids_limit == 512 and "--command-memory-bytes" not in named.command
    assert all(limit["Name"] != "nproc" for limit in named.ulimits)
    other = container_spec(config(runtime="gvisor-kvm"), EngineFacts(cpus=4, gvisor=True), host)
    assert other.runtime == "gvisor-kvm" and other.pids_limit == 512 * 8


def test_memory_and_pids_limits_bound_the_whole_container(host):
    spec = container_spec(config(limits=Limits(memory=512 * MiB, pids=64, tmpfs_bytes=1 * MiB, shm_bytes=2 * MiB)),
                          ENGINE, host)
    assert (spec.mem_limit, spec.memswap_limit, spec.pids_limit) == (512 * MiB, 512 * MiB, 64)
    assert spec.tmpfs["/tmp"].startswith("size=1048576,nr_inodes=1024,")  # never fewer than 1024 entries
    assert spec.tmpfs["/dev/shm"].startswith("size=2097152,nr_inodes=1024,")


def test_commands_run_as_the_configured_user_while_the_server_stays_root(host):
    spec = container_spec(config(identity=Identity(1000, 2000)), ENGINE, host)
    assert spec.command[2:6] == ("--command-uid", "1000", "--command-gid", "2000")
    assert spec.user == "0:0"


def test_fractional_cpus_take_a_quota_and_whole_ones_a_cpuset(host):
    half = container_spec(config(limits=Limits(cpus=0.5)), ENGINE, host)
    assert (half.cpuset_cpus, half.nano_cpus) == (None, 500_000_000)
    refused = container_spec(config(), EngineFacts(cpus=4, cpuset_allowed=False), host)
    assert (refused.cpuset_cpus, refused.nano_cpus) == (None, 1_000_000_000)
    everything = container_spec(config(limits=Limits(cpus=4)), ENGINE, host)
    assert (everything.cpuset_cpus, everything.nano_cpus) == (None, None)


def test_whole_cpus_are_a_cpuset_spread_by_name():
    (one,) = cpu_limit(1.0, 8, "a")["cpuset_cpus"].split(",")
    assert 0 <= int(one) < 8 and cpu_limit(1, 8, "a") == cpu_limit(1.0, 8, "a")  # the same CPU for a name
    chosen = {cpu_limit(2.0, 8, f"sandbox-{n}")["cpuset_cpus"] for n in range(50)}
    assert len(chosen) > 4  # sandboxes spread over the engine's CPUs
    for cpus in chosen:
        first, second = map(int, cpus.split(","))
        assert 0 <= first < second < 8 and (second - first) in (1, 7)  # two neighbours, wrapping around
    assert cpu_limit(2.5, 2, "a") == {} and cpu_limit(2.0, 2, "a") == {}
    assert cpu_limit(2.0, 8, "a", cpuset=False) == {"nano_cpus": 2_000_000_000}


def test_the_docker_sdk_takes_the_keywords_as_they_are(ro, rw, host):
    spec = container_spec(config(Root(str(ro)), Root(str(rw), writable=True), network=PublishedPort()), ENGINE, host)
    kwargs = spec.create_kwargs()
    assert "runtime" not in kwargs and "nano_cpus" not in kwargs  # None: the SDK's default
    request = _create_container_args({**kwargs, "version": "1.41"})
    assert request["command"] == list(spec.command) and request["labels"] == spec.labels
    host_config = request["host_config"]
    assert host_config["SecurityOpt"] == list(spec.security_opt)
    assert host_config["PortBindings"] == {"7000/tcp": [{"HostIp": "127.0.0.1", "HostPort": "0"}]}
    assert [limit["Name"] for limit in host_config["Ulimits"]] == ["nofile", "core", "nice", "fsize"]
    assert (host_config["Memory"], host_config["MemorySwap"], host_config["ReadonlyRootfs"]) == (GiB, GiB, True)


def test_the_same_configuration_and_facts_make_the_same_container(ro, host):
    same = config(Root(str(ro)))
    assert container_spec(same, ENGINE, host) == container_spec(same, ENGINE, host)


def test_an_appliance_never_expires_and_carries_its_name_and_address(ro, host):
    appliance = Appliance(config=appliance_config("appl", roots=[ro]))
    assert appliance.config.lease.owner.startswith("appliance:") and appliance.config.lease.expiry_seconds is None
    labels = appliance._spec(ENGINE, host).labels
    assert (labels[APPLIANCE_LABEL], labels[ADDRESS_LABEL]) == ("appl", f"unix://{host.channel_dir}/sandbox.sock")
    assert labels["io.protolink.expiry"] == "0"
    over_tcp = Appliance(config=appliance_config("appl", roots=[ro], tcp="127.0.0.1:0"))
    assert ADDRESS_LABEL not in over_tcp._spec(ENGINE, host).labels  # the engine's port binding says it
