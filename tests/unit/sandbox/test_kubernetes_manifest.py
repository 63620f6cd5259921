"""The Pod and NetworkPolicy a sandbox configuration becomes on Kubernetes, field by field, without a cluster."""

from __future__ import annotations

import json
import re
import ssl
from pathlib import Path

import pytest
import yaml

from protolink.net.rules import AddressRules
from protolink.sandbox.cli import main
from protolink.sandbox.config import GiB, Lease, Limits, MiB, PublishedPort, SandboxConfig
from protolink.sandbox.egress.policy import EgressPolicy
from protolink.sandbox.placements.docker import EngineFacts, HostFacts, container_spec
from protolink.sandbox.placements.kubernetes import (
    ClusterFacts,
    NodeFacts,
    cpu_quantity,
    manifests,
    network_policy,
    pod_manifest,
    scratch_volume,
)
from protolink.sandbox.tls import fingerprint_of
from protolink.wire.roots import Root

CREATED = 1_700_000_000
LEASE = Lease(owner="process:host:1:2", session="0123456789abcdef")
NAME = "protolink-sandbox-0123456789abcdef"
CLUSTER = ClusterFacts()
#: What Kubernetes takes as a volume's name.
DNS_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")


@pytest.fixture
def node(tmp_path: Path) -> NodeFacts:
    return NodeFacts(channel_dir=tmp_path / "channel", created=CREATED)


def config(*roots: Root, **parts: object) -> SandboxConfig:
    return SandboxConfig(roots=roots, lease=parts.pop("lease", LEASE), **parts)  # type: ignore[arg-type]


def container(pod: dict) -> dict:
    (only,) = pod["spec"]["containers"]
    return only


def test_the_server_runs_locked_down_as_on_docker(node):
    pod = pod_manifest(config(), CLUSTER, node)
    assert container(pod)["securityContext"] == {
        "runAsUser": 0, "runAsGroup": 0, "runAsNonRoot": False, "privileged": False,
        "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"], "add": ["SETUID", "SETGID", "KILL"]},
        "seccompProfile": {"type": "Localhost", "localhostProfile": "protolink-seccomp.json"},
    }
    spec = pod["spec"]
    assert (spec["automountServiceAccountToken"], spec["enableServiceLinks"]) == (False, False)
    assert (spec["hostNetwork"], spec["hostPID"], spec["hostIPC"]) == (False, False, False)
    assert (spec["restartPolicy"], spec["hostname"]) == ("Never", "sandbox")
    assert "runtimeClassName" not in spec and "nodeName" not in spec and "env" not in container(pod)


def test_the_seccomp_annotation_names_the_same_profile(node):
    pod = pod_manifest(config(), ClusterFacts(seccomp_profile="site/p.json"), node)
    assert container(pod)["securityContext"]["seccompProfile"]["localhostProfile"] == "site/p.json"
    assert pod["metadata"]["annotations"]["container.seccomp.security.alpha.kubernetes.io/sandbox"] == \
        "localhost/site/p.json"


def test_the_server_gets_docker_s_arguments_and_what_the_cluster_holds(tmp_path, node):
    (tmp_path / "ro").mkdir()
    same = config(Root(str(tmp_path / "ro")), egress=EgressPolicy.parse(["pypi.org"]), limits=Limits(memory=GiB))
    host = HostFacts(channel_dir=node.channel_dir, created=CREATED, seccomp_profile="{}")
    for gvisor in (False, True):
        pod = pod_manifest(same, ClusterFacts(gvisor=gvisor), node)
        docker = container_spec(same, EngineFacts(cpus=4, gvisor=gvisor), host).command
        assert container(pod)["args"] == [*docker, "--held-elsewhere", "network", "--held-elsewhere", "pids_limit"]
    assert container(pod)["image"] == same.image


def test_requests_equal_limits_from_the_configuration(node):
    pod = pod_manifest(config(limits=Limits(memory=512 * MiB, cpus=2)), CLUSTER, node)
    wanted = {"memory": str(512 * MiB), "cpu": "2"}
    assert container(pod)["resources"] == {"requests": wanted, "limits": wanted}  # the Guaranteed class


def test_cpus_are_whole_numbers_or_millicpus():
    assert (cpu_quantity(1), cpu_quantity(2.0), cpu_quantity(0.5), cpu_quantity(1.25)) == ("1", "2", "500m", "1250m")
    assert cpu_quantity(0.0001) == "1m"  # the smallest quantity Kubernetes takes


def test_tmp_and_shm_are_memory_of_the_configured_sizes(node):
    pod = pod_manifest(config(limits=Limits(tmpfs_bytes=3 * MiB, shm_bytes=2 * MiB), name=NAME), CLUSTER, node)
    volumes = {volume["name"]: volume for volume in pod["spec"]["volumes"]}
    tmp, shm = f"{NAME}-875dfe6a-tmp", f"{NAME}-875dfe6a-shm"
    assert volumes[tmp]["emptyDir"] == {"medium": "Memory", "sizeLimit": str(3 * MiB)}
    assert volumes[shm]["emptyDir"] == {"medium": "Memory", "sizeLimit": str(2 * MiB)}
    mounts = {mount["mountPath"]: mount["name"] for mount in container(pod)["volumeMounts"]}
    assert (mounts["/tmp"], mounts["/dev/shm"]) == (tmp, shm)


def test_each_sandbox_has_scratch_volumes_of_its_own(node):
    """podman's kube play makes a volume of each emptyDir's name: two Pods must not share one."""
    long = "a" * 62
    names = [NAME, "protolink-sandbox-0123456789abcdeg", f"{long}b", f"{long}c", "x"]
    volumes = [scratch_volume(name, purpose) for name in names for purpose in ("tmp", "shm")]
    assert len(set(volumes)) == len(volumes)
    assert all(DNS_LABEL.fullmatch(volume) for volume in volumes)
    played = [pod_manifest(config(name=name), CLUSTER, node) for name in (f"{long}b", f"{long}c")]
    scratch = [{volume["name"] for volume in pod["spec"]["volumes"] if "emptyDir" in volume} for pod in played]
    assert len(scratch[0]) == len(scratch[1]) == 2 and not scratch[0] & scratch[1]


def test_roots_are_host_directories_read_only_unless_writable(tmp_path, node):
    (tmp_path / "ro").mkdir()
    (tmp_path / "rw").mkdir()
    ro, rw = str(tmp_path / "ro"), str(tmp_path / "rw")
    pod = pod_manifest(config(Root(ro), Root(rw, writable=True), name=NAME), CLUSTER, node)
    assert container(pod)["volumeMounts"] == [
        {"name": scratch_volume(NAME, "tmp"), "mountPath": "/tmp"},  # first: roots below /tmp
        {"name": scratch_volume(NAME, "shm"), "mountPath": "/dev/shm"},
        {"name": "root-0", "mountPath": ro, "readOnly": True}, {"name": "root-1", "mountPath": rw, "readOnly": False},
        {"name": "channel", "mountPath": "/run/protolink"}]
    volumes = {volume["name"]: volume for volume in pod["spec"]["volumes"]}
    assert volumes["root-0"]["hostPath"] == {"path": ro, "type": "Directory"}
    assert volumes["root-1"]["hostPath"] == {"path": rw, "type": "Directory"}
    assert volumes["channel"]["hostPath"] == {"path": str(node.channel_dir), "type": "Directory"}


def test_annotations_carry_the_lease_and_a_label_names_the_sandbox(node):
    pod = pod_manifest(config(), CLUSTER, node)
    assert pod["metadata"]["name"] == NAME and pod["metadata"]["labels"] == {"io.protolink.sandbox": NAME}
    annotations = pod["metadata"]["annotations"]
    assert {key: annotations[key] for key in annotations if key.startswith("io.protolink.")} == {
        "io.protolink.owner": LEASE.owner, "io.protolink.session": LEASE.session,
        "io.protolink.created": str(CREATED), "io.protolink.expiry": str(CREATED + 24 * 3600),
        "io.protolink.hostdirs": str(node.channel_dir)}


def test_gvisor_is_a_runtime_class(node):
    assert pod_manifest(config(runtime="runsc"), CLUSTER, node)["spec"]["runtimeClassName"] == "runsc"
    named = pod_manifest(config(runtime="runsc"), ClusterFacts(runtime_class="gvisor", gvisor=True), node)
    assert named["spec"]["runtimeClassName"] == "gvisor"
    assert "--command-memory-bytes" in container(named)["args"]


def test_the_pod_can_be_pinned_to_the_node_that_prepared_it(tmp_path):
    pod = pod_manifest(config(), CLUSTER, NodeFacts(tmp_path, CREATED, node="worker-2"))
    assert pod["spec"]["nodeName"] == "worker-2"


def test_tcp_mode_opens_the_servers_port_and_mounts_the_token_directory(node):
    pod = pod_manifest(config(network=PublishedPort.parse("0.0.0.0:5000")), CLUSTER, node)
    assert container(pod)["ports"] == [{"name": "server", "containerPort": 7000, "protocol": "TCP",
                                        "hostPort": 5000, "hostIP": "0.0.0.0"}]
    assert container(pod)["volumeMounts"][-1] == {"name": "channel", "mountPath": "/run/protolink-secret"}
    any_port = pod_manifest(config(network=PublishedPort()), CLUSTER, node)
    assert container(any_port)["ports"] == [{"name": "server", "containerPort": 7000, "protocol": "TCP"}]
    policy = network_policy(config(network=PublishedPort()), CLUSTER)
    assert policy["spec"]["ingress"] == [{"ports": [{"protocol": "TCP", "port": 7000}]}]
    assert policy["spec"]["egress"] == []


def test_by_default_the_network_policy_denies_everything_in_and_out():
    policy = network_policy(config(), CLUSTER)
    assert policy["spec"] == {"podSelector": {"matchLabels": {"io.protolink.sandbox": NAME}},
                              "policyTypes": ["Ingress", "Egress"], "ingress": [], "egress": []}
    names_only = network_policy(config(egress=EgressPolicy.parse(["pypi.org", "*.pythonhosted.org:443"])), CLUSTER)
    assert names_only["spec"]["egress"] == []  # names go through the relay and the host's proxy


def test_network_rules_become_ip_blocks_without_the_denied_networks():
    policy = network_policy(config(egress=EgressPolicy.parse(["8.8.8.0/24:53", "0.0.0.0/0:443", "10.1.0.0/16",
                                                              "[2001:db8::]/32:443"])),
                            ClusterFacts(cluster_networks=("8.8.8.128/25",)))
    first, everything, ipv6 = policy["spec"]["egress"]  # 10.1.0.0/16 is private: denied, so left out
    assert first == {"to": [{"ipBlock": {"cidr": "8.8.8.0/24", "except": ["8.8.8.128/25"]}}],
                     "ports": [{"protocol": "TCP", "port": 53}]}
    block = everything["to"][0]["ipBlock"]
    assert block["cidr"] == "0.0.0.0/0" and {"10.0.0.0/8", "127.0.0.0/8", "169.254.0.0/16",
                                            "8.8.8.128/25"} <= set(block["except"])
    assert all(":" not in network for network in block["except"])  # the same address family only
    assert everything["ports"] == [{"protocol": "TCP", "port": 443}]
    assert ipv6["to"] == [{"ipBlock": {"cidr": "2001:db8::/32"}}]


def test_a_name_kubernetes_refuses_is_a_clear_error(node):
    for name in ("Sandbox", "sand_box", "x" * 64, "sandbox."):
        with pytest.raises(ValueError, match="Kubernetes Pod"):
            pod_manifest(config(name=name), CLUSTER, node)
        with pytest.raises(ValueError, match="Kubernetes Pod"):
            network_policy(config(name=name), CLUSTER)


def test_a_ca_file_is_refused_by_name(node, tmp_path):
    bundle = tmp_path / "ca.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    with pytest.raises(ValueError, match="kubernetes placement: ca_file is not placed"):
        pod_manifest(config(ca_file=str(bundle)), CLUSTER, node)


def test_the_same_configuration_and_facts_make_the_same_manifests(node):
    same = config()
    assert manifests(same, CLUSTER, node) == manifests(same, CLUSTER, node)
    policy, pod = manifests(same, CLUSTER, node)
    assert (policy["kind"], pod["kind"]) == ("NetworkPolicy", "Pod")


def test_kube_manifest_prints_yaml_or_json(tmp_path, capsys):
    (tmp_path / "ws").mkdir()
    arguments = ["kube-manifest", "--name", "kube-test", "--root", f"{tmp_path / 'ws'}:rw", "--cpus", "0.5",
                 "--runtime", "runsc", "--runtime-class", "gvisor", "--node", "n1", "--channel-dir", "/var/lib/x",
                 "--seccomp-profile", "p.json", "--allow", "1.2.3.0/24:443"]
    assert main(arguments) == 0
    policy, pod = yaml.safe_load_all(capsys.readouterr().out)
    assert policy["spec"]["egress"][0]["to"] == [{"ipBlock": {"cidr": "1.2.3.0/24"}}]
    assert (pod["metadata"]["name"], pod["spec"]["runtimeClassName"], pod["spec"]["nodeName"]) == \
        ("kube-test", "gvisor", "n1")
    assert container(pod)["resources"]["limits"]["cpu"] == "500m"
    assert container(pod)["securityContext"]["seccompProfile"]["localhostProfile"] == "p.json"
    assert "--command-memory-bytes" in container(pod)["args"]  # runsc: the gVisor tuning
    assert {"name": "root-0", "mountPath": str(tmp_path / "ws"), "readOnly": False} in container(pod)["volumeMounts"]
    assert main([*arguments, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert (listed["kind"], listed["items"][0], listed["items"][1]["spec"]) == ("List", policy, pod["spec"])


def test_kube_manifest_refuses_what_makes_no_sandbox(capsys):
    assert main(["kube-manifest", "--name", "Upper"]) == 1
    assert "Kubernetes Pod" in capsys.readouterr().err
    assert main(["kube-manifest", "--root", "relative/dir"]) == 1
    assert "absolute" in capsys.readouterr().err


def test_a_policy_that_denies_every_non_public_address_keeps_them_out_of_ip_blocks():
    policy = EgressPolicy.parse(["192.0.2.0/24:443", "0.0.0.0/0:443"], addresses=AddressRules(deny=("non-public",)))
    (everything,) = network_policy(config(egress=policy), CLUSTER)["spec"]["egress"]  # documentation: denied
    assert {"192.0.2.0/24", "198.18.0.0/15", "10.0.0.0/8"} <= set(everything["to"][0]["ipBlock"]["except"])


def test_kube_manifest_makes_a_tcp_pods_secrets_in_a_new_private_directory(tmp_path, capsys):
    secrets_dir = tmp_path / "secrets"
    arguments = ["kube-manifest", "--name", "kube-tcp", "--root", str(tmp_path), "--tcp", "0.0.0.0:7443",
                 "--secrets-dir", str(secrets_dir)]
    assert main(arguments) == 0
    said = capsys.readouterr()
    assert yaml.safe_load_all(said.out)  # the manifests are printed as without the option
    files = {name: secrets_dir / name for name in ("token", "tls-cert.pem", "tls-key.pem")}
    assert sorted(path.name for path in secrets_dir.iterdir()) == sorted(files)
    assert secrets_dir.stat().st_mode & 0o777 == 0o700
    assert {path.stat().st_mode & 0o777 for path in files.values()} == {0o600}
    assert len(files["token"].read_text()) >= 16
    certificate = files["tls-cert.pem"].read_bytes()
    ssl.create_default_context().load_cert_chain(files["tls-cert.pem"], files["tls-key.pem"])  # a matching pair
    assert f"tls: {fingerprint_of(certificate)}" in said.err
    assert "/var/lib/protolink/kube-tcp" in said.err  # where the operator places them
    assert f"fingerprint={fingerprint_of(certificate)!r}" in said.err
    assert main(arguments) == 1  # never written over
    assert "exists" in capsys.readouterr().err
    assert files["tls-cert.pem"].read_bytes() == certificate


def test_kube_manifest_makes_no_secrets_for_a_unix_socket(tmp_path, capsys):
    assert main(["kube-manifest", "--root", str(tmp_path), "--secrets-dir", str(tmp_path / "secrets")]) == 1
    assert "TCP mode" in capsys.readouterr().err
    assert not (tmp_path / "secrets").exists()
