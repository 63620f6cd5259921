"""DockerSandbox's options are checked before any container exists: roots, identities, profile."""

from __future__ import annotations

import json

import pytest

from protolink.sandbox.docker import (
    DockerSandbox,
    Root,
    roots_from_env,
    seccomp_profile,
)


def test_root_parse_reads_an_optional_mode():
    assert Root.parse("/srv/repo") == Root("/srv/repo", writable=False)
    assert Root.parse("/srv/repo:rw") == Root("/srv/repo", writable=True)
    assert Root.parse("/srv/repo:ro") == Root("/srv/repo", writable=False)
    assert roots_from_env("/a:rw, /b") == [Root("/a", True), Root("/b", False)]


def test_roots_are_resolved_merged_and_writable_wins(tmp_path):
    (tmp_path / "link").symlink_to(tmp_path / "real", target_is_directory=True)
    (tmp_path / "real").mkdir()
    sandbox = DockerSandbox([tmp_path / "link", Root(str(tmp_path / "real"))], writable=[tmp_path / "real"])
    assert sandbox.roots == (Root(str(tmp_path / "real"), writable=True),)


@pytest.mark.parametrize("path", ["relative/dir", "/", "/tmp", "/usr", "/etc", "/proc", "/var/run", "/opt/protolink",
                                  "/var/lib/docker"])
def test_system_paths_and_relative_paths_are_refused_as_roots(path):
    with pytest.raises(ValueError):
        DockerSandbox([path])


def test_a_root_holding_the_docker_socket_is_refused(tmp_path, monkeypatch):
    socket_path = tmp_path / "engine" / "docker.sock"
    socket_path.parent.mkdir()
    socket_path.touch()
    monkeypatch.setenv("DOCKER_HOST", f"unix://{socket_path}")
    with pytest.raises(ValueError, match="Docker socket"):
        DockerSandbox([tmp_path])


def test_a_missing_root_is_refused(tmp_path):
    with pytest.raises(ValueError, match="not a directory"):
        DockerSandbox([tmp_path / "missing"])


def test_commands_never_run_as_root(tmp_path):
    with pytest.raises(ValueError, match="uid or gid 0"):
        DockerSandbox([tmp_path], command_uid=0)
    with pytest.raises(ValueError, match="uid or gid 0"):
        DockerSandbox([tmp_path], command_uid=1000, command_gid=0)
    sandbox = DockerSandbox([tmp_path])
    assert (sandbox.command_uid, sandbox.command_gid) == (65534, 65534)
    assert (DockerSandbox([tmp_path], command_uid=1000).command_gid) == 1000


def test_limits_are_validated(tmp_path):
    with pytest.raises(ValueError):
        DockerSandbox([tmp_path], memory=1 << 20)
    with pytest.raises(ValueError):
        DockerSandbox([tmp_path], cpus=0)


def test_the_seccomp_profile_denies_by_default_and_never_allows_escape_calls():
    profile = json.loads(seccomp_profile())
    assert profile["defaultAction"] == "SCMP_ACT_ERRNO"
    allowed = {name for rule in profile["syscalls"] if rule["action"] == "SCMP_ACT_ALLOW" and "args" not in rule
               for name in rule["names"]}
    never = {"ptrace", "process_vm_readv", "process_vm_writev", "mount", "umount2", "unshare", "setns",
             "pivot_root", "bpf", "perf_event_open", "keyctl", "add_key", "request_key", "userfaultfd",
             "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
             "open_by_handle_at", "name_to_handle_at", "io_uring_setup", "io_uring_enter", "io_uring_register",
             "chroot", "reboot", "swapon", "clone3", "personality", "socket", "clone"}
    assert not allowed & never
