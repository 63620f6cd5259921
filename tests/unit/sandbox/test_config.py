"""A sandbox configuration keeps today's defaults, is frozen, and refuses a bad value by its field's name."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest

from protolink.sandbox.config import (
    GiB,
    Identity,
    Lease,
    Limits,
    MiB,
    NoNetwork,
    PublishedPort,
    SandboxConfig,
    resolve_roots,
)
from protolink.sandbox.docker import DockerSandbox
from protolink.sandbox.egress.policy import DENY_ALL, EgressPolicy
from protolink.sandbox.images import DEFAULT_IMAGE
from protolink.wire.roots import Root


def test_the_defaults():
    config = SandboxConfig()
    assert config.limits == Limits(memory=1 * GiB, pids=512, cpus=1.0, tmpfs_bytes=256 * MiB, shm_bytes=64 * MiB,
                                   disk_bytes=1 * GiB, nofile=8192)
    assert config.identity == Identity(65534, 65534)
    assert (config.roots, config.image, config.runtime, config.network) == ((), DEFAULT_IMAGE, None, NoNetwork())
    assert config.lease.expiry_seconds == 24 * 3600 and config.lease.owner.startswith("process:")
    assert config.name == f"protolink-sandbox-{config.lease.session}"
    assert SandboxConfig().lease.session != config.lease.session  # a fresh session for every sandbox


def test_a_configuration_cannot_change_once_made():
    config = SandboxConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.limits.memory = 1 << 40  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.network = PublishedPort()  # type: ignore[misc]


def test_the_group_is_the_users_unless_given():
    assert Identity.of() == Identity(65534, 65534)
    assert Identity.of(1000) == Identity(1000, 1000)
    assert Identity.of(1000, 2000) == Identity(1000, 2000)


@pytest.mark.parametrize(("limits", "field"), [
    ({"memory": 64 * MiB - 1}, "limits.memory"),
    ({"memory": "1G"}, "limits.memory"),
    ({"pids": 15}, "limits.pids"),
    ({"cpus": 0}, "limits.cpus"),
    ({"cpus": math.nan}, "limits.cpus"),
    ({"cpus": math.inf}, "limits.cpus"),
    ({"tmpfs_bytes": 0}, "limits.tmpfs_bytes"),
    ({"shm_bytes": 0}, "limits.shm_bytes"),
    ({"disk_bytes": -1}, "limits.disk_bytes"),
    ({"nofile": 1023}, "limits.nofile"),
    ({"pids": True}, "limits.pids"),
])
def test_limits_out_of_bounds_are_refused_by_name(limits, field):
    with pytest.raises(ValueError, match=f"^sandbox config: {re.escape(field)} must "):
        Limits(**limits)


def test_the_smallest_limits_are_accepted():
    assert Limits(memory=64 * MiB, pids=16, cpus=0.01, disk_bytes=0, nofile=1024).disk_bytes == 0


@pytest.mark.parametrize(("uid", "gid", "field", "why"), [
    (0, 65534, "identity.uid", "never run as uid or gid 0"),
    (1000, 0, "identity.gid", "never run as uid or gid 0"),
    (-1, 1000, "identity.uid", "from 1 to"),
    (1000, 2**32 - 1, "identity.gid", "from 1 to"),
])
def test_commands_never_run_as_root_nor_as_an_impossible_id(uid, gid, field, why):
    with pytest.raises(ValueError, match=f"{re.escape(field)} must .*{why}"):
        Identity(uid, gid)


@pytest.mark.parametrize(("make", "field"), [
    (lambda: PublishedPort.parse("localhost:http"), "tcp"),
    (lambda: PublishedPort("127.0.0.1", 65536), "network.port"),
    (lambda: PublishedPort("", 7000), "network.host"),
    (lambda: Lease(expiry_seconds=0), "lease.expiry_seconds"),
    (lambda: Lease(owner=""), "lease.owner"),
    (lambda: SandboxConfig(name="no/slashes"), "name"),
    (lambda: SandboxConfig(image=""), "image"),
    (lambda: SandboxConfig(runtime=""), "runtime"),
    (lambda: SandboxConfig(limits={"memory": GiB}), "limits"),  # type: ignore[arg-type]
    (lambda: SandboxConfig(network="none"), "network"),  # type: ignore[arg-type]
    (lambda: SandboxConfig(roots=["/srv"]), "roots"),  # type: ignore[arg-type]
    (lambda: SandboxConfig(egress=["pypi.org"]), "egress"),  # type: ignore[arg-type]
    (lambda: SandboxConfig(egress=DENY_ALL, network=PublishedPort()), "egress"),  # TCP mode has a network
])
def test_other_bad_values_are_refused_by_name(make, field):
    with pytest.raises(ValueError, match=f"^sandbox config: {re.escape(field)} must "):
        make()


def test_roots_must_be_resolved_directories_named_once(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real", target_is_directory=True)
    with pytest.raises(ValueError, match="is not resolved"):
        SandboxConfig(roots=(Root(str(tmp_path / "link")),))
    with pytest.raises(ValueError, match="must name each directory once"):
        SandboxConfig(roots=(Root(str(tmp_path / "real")), Root(str(tmp_path / "real"), writable=True)))
    with pytest.raises(ValueError, match="absolute path"):
        SandboxConfig(roots=(Root("real"),))
    assert resolve_roots([tmp_path / "link"], [tmp_path / "real"]) == (Root(str(tmp_path / "real"), writable=True),)


def test_the_flat_options_land_in_their_parts(tmp_path):
    config = SandboxConfig.from_options([tmp_path], image="example/other:1", memory=512 * MiB, pids=64, cpus=0.5,
                                        tmpfs_bytes=8 * MiB, disk_bytes=16 * MiB, runtime="runsc", command_uid=1000,
                                        expiry_seconds=60, owner="someone", name="box", tcp=":7100")
    assert config.roots == (Root(str(tmp_path)),)
    assert config.limits == Limits(memory=512 * MiB, pids=64, cpus=0.5, tmpfs_bytes=8 * MiB, disk_bytes=16 * MiB)
    assert (config.identity, config.network) == (Identity(1000, 1000), PublishedPort("127.0.0.1", 7100))
    assert (config.image, config.runtime, config.name) == ("example/other:1", "runsc", "box")
    assert (config.lease.owner, config.lease.expiry_seconds) == ("someone", 60)
    assert SandboxConfig.from_options().network == NoNetwork()


def test_the_built_images_are_taken_by_their_short_names_as_the_cli_takes_them():
    assert SandboxConfig.from_options(image="ci").image == "protolink/ci:latest"
    assert SandboxConfig(image="sandbox").image == "protolink/sandbox:latest"
    assert SandboxConfig(image="ci:latest").image == "ci:latest"  # a reference of its own


def test_egress_is_off_by_default_and_takes_a_policy_or_its_rules():
    assert SandboxConfig().egress is None and SandboxConfig.from_options().egress is None
    assert SandboxConfig.from_options(egress=["pypi.org:443"]).egress == EgressPolicy.parse(["pypi.org:443"])
    assert SandboxConfig.from_options(egress=[]).egress == DENY_ALL  # the proxy runs, allowing nothing yet
    policy = EgressPolicy.parse(["*.example.org"])
    assert SandboxConfig.from_options(egress=policy).egress is policy
    with pytest.raises(ValueError, match="pypi.org:http"):
        SandboxConfig.from_options(egress=["pypi.org:http"])
    with pytest.raises(TypeError):
        SandboxConfig.from_options(egress="pypi.org")  # one string is not a list of rules
    with pytest.raises(ValueError, match="^sandbox config: egress must go with the Unix socket"):
        SandboxConfig.from_options(egress=["pypi.org"], tcp=":7100")


def test_a_sandbox_takes_a_configuration_or_its_options_never_both(tmp_path):
    config = SandboxConfig.from_options([tmp_path])
    assert DockerSandbox(config=config).config is config
    assert DockerSandbox([tmp_path], memory=512 * MiB).config.limits.memory == 512 * MiB
    with pytest.raises(TypeError, match="not both"):
        DockerSandbox(config=config, memory=512 * MiB)
    with pytest.raises(TypeError, match="not both"):
        DockerSandbox([tmp_path], config=config)
    with pytest.raises(TypeError, match="memroy"):
        DockerSandbox([tmp_path], memroy=512 * MiB)
