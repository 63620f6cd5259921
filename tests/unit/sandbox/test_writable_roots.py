"""A writable root the command user cannot write is refused before a sandbox starts, with the
command that fixes it; it changes owner only when asked; the check agrees with the kernel."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from protolink.errors import RootNotWritableError, SandboxError
from protolink.sandbox import engine, posix_acl
from protolink.sandbox.docker import DockerSandbox
from protolink.sandbox.posix_acl import (
    GROUP,
    GROUP_OBJ,
    MASK,
    OTHER,
    USER,
    USER_OBJ,
    Entry,
)
from protolink.sandbox.writable_roots import (
    check_writable,
    default_workspace,
    writable_by,
)
from protolink.wire.roots import Root

pytestmark = pytest.mark.root

UID = GID = 65534  # the sandbox's command user
OTHER_GID = 4242


@pytest.fixture
def base() -> Iterator[Path]:
    """A fresh directory that other uids can reach (pytest's own sits in a 0700 directory)."""
    path = Path(tempfile.mkdtemp(prefix="protolink-roots-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def _kernel_lets_write(path: Path, uid: int, gid: int) -> bool:
    """Whether a process of uid/gid and no other groups really can create a file in ``path``."""
    probe = path / f"probe-{uid}"
    done = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "touch", str(probe)],
                          capture_output=True)
    probe.unlink(missing_ok=True)
    return done.returncode == 0


def _directory(base: Path, mode: int, owner: tuple[int, int] = (0, 0), acl: tuple[Entry, ...] = ()) -> Path:
    path = base / "root"
    path.mkdir()
    os.chown(path, *owner)
    path.chmod(mode)
    if acl:
        posix_acl.write(str(path), acl)
    return path


def _acl(user: int, group: int, other: int, *named: Entry, mask: int) -> tuple[Entry, ...]:
    return (Entry(USER_OBJ, user), Entry(GROUP_OBJ, group), Entry(OTHER, other), *named, Entry(MASK, mask))


CASES = {
    "root's 0755": (0o755, (0, 0), (), False),
    "open to all, 0777": (0o777, (0, 0), (), True),
    "through its group, 0775": (0o775, (0, GID), (), True),
    "its group has less than others, 0707": (0o707, (0, GID), (), False),
    "its own, without write for the owner": (0o577, (UID, GID), (), False),
    "through an ACL for the uid": (0o755, (0, 0), _acl(7, 5, 5, Entry(USER, 7, UID), mask=7), True),
    "through an ACL for the gid": (0o755, (0, 0), _acl(7, 5, 5, Entry(GROUP, 7, GID), mask=7), True),
    "an ACL for another group": (0o755, (0, 0), _acl(7, 5, 5, Entry(GROUP, 7, OTHER_GID), mask=7), False),
    "an ACL entry the mask limits": (0o755, (0, 0), _acl(7, 5, 5, Entry(USER, 7, UID), mask=5), False),
    "an ACL entry for the uid below others'": (0o757, (0, 0), _acl(7, 5, 7, Entry(USER, 5, UID), mask=7), False),
}


@pytest.mark.parametrize("case", CASES)
def test_the_check_agrees_with_the_kernel(base, case):
    mode, owner, acl, expected = CASES[case]
    path = _directory(base, mode, owner, acl)
    assert writable_by(str(path), UID, GID) is expected
    assert _kernel_lets_write(path, UID, GID) is expected


def test_a_root_the_command_user_cannot_write_is_refused_with_the_fix(base):
    path = _directory(base, 0o755)
    with pytest.raises(RootNotWritableError) as refused:
        check_writable([Root(str(path), writable=True)], UID, GID)
    message = str(refused.value)
    assert str(path) in message and f"uid {UID}" in message
    assert refused.value.fix == f"chown {UID}:{GID} {path}" and refused.value.fix in message
    assert isinstance(refused.value, PermissionError) and isinstance(refused.value, SandboxError)
    assert os.stat(path).st_uid == 0  # nothing changed owner
    subprocess.run(refused.value.fix, shell=True, check=True)
    assert _kernel_lets_write(path, UID, GID)  # the one command fixes it


def test_a_root_writable_through_an_acl_is_accepted_as_it_is(base):
    path = _directory(base, 0o755)
    posix_acl.grant(str(path), {UID: 7})
    assert check_writable([Root(str(path), writable=True)], UID, GID) == []
    assert (os.stat(path).st_uid, os.stat(path).st_gid) == (0, 0)


def test_the_opt_in_hands_the_root_to_the_command_user(base):
    path = _directory(base, 0o755)
    (path / "kept.txt").write_text("kept")
    assert check_writable([Root(str(path), writable=True)], UID, GID, hand_over=True) == [str(path)]
    assert (os.stat(path).st_uid, os.stat(path).st_gid) == (UID, GID)
    assert os.stat(path / "kept.txt").st_uid == 0  # only the root itself changes owner
    assert _kernel_lets_write(path, UID, GID)


def test_read_only_roots_are_not_looked_at(base):
    path = _directory(base, 0o700)
    assert check_writable([Root(str(path), writable=False)], UID, GID, hand_over=True) == []
    assert (os.stat(path).st_uid, os.stat(path).st_mode & 0o777) == (0, 0o700)


async def test_a_sandbox_refuses_the_root_before_it_asks_the_engine(base, monkeypatch):
    def no_engine() -> None:
        raise AssertionError("the engine was asked before the roots were checked")

    monkeypatch.setattr(engine, "client", no_engine)
    sandbox = DockerSandbox(writable=[_directory(base, 0o755)])
    with pytest.raises(RootNotWritableError, match=f"uid {UID}"):
        await sandbox.start()


def test_the_default_workspace_of_root_belongs_to_the_command_user(base, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(base / "data"))
    path = default_workspace(UID, GID)
    assert path == base / "data" / "protolink" / "workspace"
    info = os.stat(path)
    assert (info.st_uid, info.st_gid, info.st_mode & 0o777) == (UID, GID, 0o700)
    assert _kernel_lets_write(path, UID, GID)
    assert default_workspace(UID, GID) == path  # found again, as it is


def test_another_users_default_workspace_stays_theirs_and_the_command_users_through_an_acl(base, monkeypatch):
    user = 4321
    monkeypatch.setenv("XDG_DATA_HOME", str(base / "data"))
    (base / "data").mkdir()
    os.chown(base / "data", user, user)
    monkeypatch.setattr(os, "getuid", lambda: user)
    path = default_workspace(UID, GID)
    os.chown(path, user, user)  # as that user's mkdir would have made it
    info = os.stat(path)
    assert (info.st_uid, info.st_mode & 0o007) == (user, 0)
    assert writable_by(str(path), UID, GID) and _kernel_lets_write(path, UID, GID)
    # What commands create there stays open to the user, through the inherited ACL.
    made = path / "made-by-a-command"
    subprocess.run(["setpriv", f"--reuid={UID}", f"--regid={GID}", "--clear-groups", "mkdir", str(made)], check=True)
    assert _kernel_lets_write(made, user, user) and not _kernel_lets_write(made, 1111, 1111)


def test_no_default_workspace_beneath_a_directory_the_image_keeps_private(monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", "/root/.local/share")
    with pytest.raises(ValueError, match="cannot enter"):
        default_workspace(UID, GID)


def test_a_default_workspace_on_a_file_system_without_acls_is_refused_with_the_fix(base, monkeypatch):
    def no_acls(path: str, users: dict[int, int]) -> None:
        raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))

    monkeypatch.setenv("XDG_DATA_HOME", str(base / "data"))
    monkeypatch.setattr(os, "getuid", lambda: 4321)
    monkeypatch.setattr(posix_acl, "grant", no_acls)
    with pytest.raises(RootNotWritableError, match=f"cannot be opened to uid {UID}") as refused:
        default_workspace(UID, GID)
    assert refused.value.fix == f"sudo chown {UID}:{GID} {base / 'data' / 'protolink' / 'workspace'}"
