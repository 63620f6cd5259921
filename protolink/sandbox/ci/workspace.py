"""A CI job's workspace on the host: a fresh copy of the repository that only the job writes.

Each job gets a directory of its own under :func:`jobs_dir` (owner-only), holding the file
``owner`` (the runner process, as the reaper names it) and ``workspace/``, the sandbox's one
writable root, with ``repo/`` (the copy; the commands' working directory) and ``home/`` (their
``HOME``). The user's checkout is read, never mounted: the copy keeps regular files (without
setuid, setgid or sticky bits), directories and symbolic links (as links, never followed), and
leaves out what else it meets (devices, FIFOs, sockets), saying so. A git URL is cloned first
on the host with Git's safety switches (no hooks, fsmonitor, submodules or templates, objects
checked) and copied the same way. The workspace and everything the job left in it go at the
end; a runner that was killed leaves a directory whose owner is gone, and the next runner's
:func:`sweep` removes it.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import stat
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from protolink.errors import RepositoryError
from protolink.execution.git_safety import GLOBAL_OPTIONS, git_environment

from .. import posix_acl
from ..hostdirs import owner_only_dir
from ..leftovers import owner_gone, process_owner

#: Transports a git URL may use (never ``ext::`` or ``fd::``, which run commands).
GIT_PROTOCOLS = "http:https:ssh:git"
_GIT_URL = re.compile(r"(https?|ssh|git)://[^\s]+|[A-Za-z0-9._-]+@[A-Za-z0-9.-]+:[^\s]+")
_USERINFO = re.compile(r"^([a-z+]+://)[^/@]*@")
#: Clone-time switches beyond the git tool's: no template (no sample hooks), no submodules,
#: every object checked, and only the transports above.
_CLONE_OPTIONS = ("-c", "transfer.fsckObjects=true", "-c", "submodule.recurse=false", "-c", "core.symlinks=true")
_COPY_CHUNK = 1 << 20
#: How long a job directory may lack its ``owner`` file before :func:`sweep` takes it for a leftover.
UNOWNED_GRACE_SECONDS = 600


@dataclass
class CopyStats:
    """What the copy kept (``files``, ``directories``, ``symlinks``, ``bytes``) and left out."""

    files: int = 0
    directories: int = 0
    symlinks: int = 0
    bytes: int = 0
    left_out: list[dict[str, str]] = field(default_factory=list)


def jobs_dir() -> Path:
    """Where CI jobs' directories live: ``PROTOLINK_CI_DIR``, else ``/var/tmp/protolink-ci-<uid>``;
    created 0700 and refused (SandboxError) when another user owns it or others can open it."""
    path = Path(os.environ.get("PROTOLINK_CI_DIR") or f"/var/tmp/protolink-ci-{os.getuid()}")
    return owner_only_dir(path, "PROTOLINK_CI_DIR", "the CI jobs directory")


def sweep(base: Path | None = None) -> list[Path]:
    """Remove the job directories whose runner is gone; the ones removed. A directory without
    its ``owner`` file is a runner's killed between making it and writing that file, once it is
    older than :data:`UNOWNED_GRACE_SECONDS` (a younger one may be a live runner's, a moment
    before it writes the file)."""
    base = jobs_dir() if base is None else base
    removed = []
    for entry in base.iterdir():
        if not entry.name.startswith("job-") or entry.is_symlink() or not entry.is_dir():
            continue
        try:
            gone = owner_gone((entry / "owner").read_text())
        except FileNotFoundError:
            gone = entry.stat().st_mtime < time.time() - UNOWNED_GRACE_SECONDS
        if gone:
            remove_tree(entry)
            removed.append(entry)
    return removed


def remove_tree(path: Path) -> None:
    """Remove ``path`` and all beneath it, also what the job made unwritable (modes it set)."""
    def retry_writable(function: Callable[[str], object], failed: str, _: object) -> None:
        os.chmod(os.path.dirname(failed), 0o700)
        function(failed)

    shutil.rmtree(path, onerror=retry_writable)


class Workspace:
    """A job's directory (see the module): made by :meth:`create`, gone after :meth:`remove`."""

    def __init__(self, path: Path, uid: int, gid: int) -> None:
        self.path = path
        self.uid = uid
        self.gid = gid

    @classmethod
    def create(cls, uid: int, gid: int, base: Path | None = None) -> Workspace:
        """A new job directory whose workspace the command user ``uid``:``gid`` owns."""
        path = (jobs_dir() if base is None else base) / f"job-{secrets.token_hex(6)}"
        path.mkdir(mode=0o700)
        (path / "owner").write_text(process_owner())
        workspace = cls(path, uid, gid)
        for directory in (workspace.root, workspace.home):
            directory.mkdir(mode=0o755)
            workspace.hand_over(directory)
        return workspace

    @property
    def root(self) -> Path:
        """The sandbox's writable root."""
        return self.path / "workspace"

    @property
    def repo(self) -> Path:
        return self.root / "repo"

    @property
    def home(self) -> Path:
        return self.root / "home"

    def hand_over(self, path: Path) -> None:
        """Make ``path`` the command user's: its owner as root, an ACL entry otherwise."""
        if os.getuid() == 0:
            os.chown(path, self.uid, self.gid, follow_symlinks=False)
        elif not path.is_symlink():
            posix_acl.grant(str(path), {self.uid: 7, os.getuid(): 7})

    def fill(self, source: str, *, max_bytes: int, timeout: float) -> tuple[CopyStats, str | None]:
        """Copy the repository ``source`` (a directory or a git URL) into :attr:`repo`; what was
        copied, and the commit a clone checked out (None for a directory)."""
        if is_git_url(source):
            clone = self.path / "clone"
            commit = git_clone(source, clone, timeout=timeout)
            try:
                return copy_tree(clone, self.repo, self, max_bytes=max_bytes), commit
            finally:
                remove_tree(clone)
        directory = Path(source).expanduser()
        if not directory.is_dir():
            raise RepositoryError(f"the repository {source!r} is neither a directory nor a git URL "
                                  "(https://, ssh://, git://, user@host:path)")
        return copy_tree(directory.resolve(), self.repo, self, max_bytes=max_bytes), None

    def remove(self) -> None:
        remove_tree(self.path)


def is_git_url(text: str) -> bool:
    return _GIT_URL.fullmatch(text) is not None and not os.path.exists(text)


def public_source(text: str) -> str:
    """``text`` without the credentials a URL may carry (``https://user:token@host``)."""
    return _USERINFO.sub(r"\1***@", text)


def git_clone(url: str, target: Path, *, timeout: float) -> str:
    """Clone ``url`` into ``target`` with Git's safety switches; the commit checked out."""
    env = git_environment({"PATH": os.environ.get("PATH", os.defpath), "HOME": str(target.parent),
                           "GIT_ALLOW_PROTOCOL": GIT_PROTOCOLS, "LANG": "C"})
    argv = ["git", *GLOBAL_OPTIONS, *_CLONE_OPTIONS, "clone", "--quiet", "--template=", "--no-recurse-submodules",
            "--", url, str(target)]
    try:
        subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, check=True, timeout=timeout)
        head = subprocess.run(["git", *GLOBAL_OPTIONS, "-C", str(target), "rev-parse", "HEAD"], env=env,
                              stdin=subprocess.DEVNULL, capture_output=True, check=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        raise RepositoryError(f"cloning {public_source(url)} took longer than {timeout:g} s") from None
    except subprocess.CalledProcessError as error:
        detail = error.stderr.decode("utf-8", "replace").strip() if isinstance(error.stderr, bytes) else error.stderr
        raise RepositoryError(f"cannot clone {public_source(url)}: {public_source(detail or '')[-2000:]}") from None
    except FileNotFoundError:
        raise RepositoryError("cloning a git URL needs git on this host") from None
    return head.stdout.strip()


def copy_tree(source: Path, target: Path, workspace: Workspace, *, max_bytes: int) -> CopyStats:
    """Copy the tree at ``source`` into the new directory ``target`` as the module says, handing
    each entry to the command user; RepositoryError past ``max_bytes`` of file content."""
    stats = CopyStats()
    pending = [(source, target)]
    while pending:
        here, there = pending.pop()
        there.mkdir(mode=0o755)
        workspace.hand_over(there)
        stats.directories += 1
        try:
            entries = sorted(os.scandir(here), key=lambda entry: entry.name)
        except OSError as error:
            raise RepositoryError(f"cannot read {here}: {error.strerror}") from None
        for entry in entries:
            destination = there / entry.name
            info = entry.stat(follow_symlinks=False)
            if stat.S_ISDIR(info.st_mode):
                pending.append((Path(entry.path), destination))
            elif stat.S_ISLNK(info.st_mode):
                os.symlink(os.readlink(entry.path), destination)
                workspace.hand_over(destination)
                stats.symlinks += 1
            elif stat.S_ISREG(info.st_mode):
                stats.bytes += _copy_file(entry.path, destination, info, max_bytes - stats.bytes)
                workspace.hand_over(destination)
                stats.files += 1
            else:
                relative = os.path.relpath(entry.path, source)
                stats.left_out.append({"path": relative, "reason": f"not a regular file ({stat.filemode(info.st_mode)})"})
    return stats


def _copy_file(path: str, destination: Path, info: os.stat_result, room: int) -> int:
    """Copy one regular file (never through a link), its permission bits without set-id or
    sticky bits and its modification time; its size."""
    if info.st_size > room:
        raise RepositoryError(f"the repository holds more than its disk budget allows ({path} does not fit)")
    source_fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(source_fd).st_mode):
            raise RepositoryError(f"{path} changed while it was copied")
        target_fd = os.open(destination, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                            stat.S_IMODE(info.st_mode) & 0o777)
        try:
            copied = 0
            while chunk := os.read(source_fd, _COPY_CHUNK):
                copied += len(chunk)
                if copied > room:
                    raise RepositoryError(f"the repository holds more than its disk budget allows ({path} grew)")
                _write_all(target_fd, chunk)
            os.fchmod(target_fd, stat.S_IMODE(info.st_mode) & 0o777)
        finally:
            os.close(target_fd)
    finally:
        os.close(source_fd)
    os.utime(destination, ns=(info.st_atime_ns, info.st_mtime_ns), follow_symlinks=False)
    return copied


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
