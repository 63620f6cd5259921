"""A job's workspace is a fresh copy the command user owns, and it goes when the job ends."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import time

import pytest

from protolink.errors import RepositoryError, SandboxError
from protolink.sandbox.ci.workspace import Workspace, is_git_url, jobs_dir, public_source, sweep
from protolink.sandbox.leftovers import process_owner

NOBODY = 65534


@pytest.fixture
def jobs(tmp_path, monkeypatch):
    base = tmp_path / "jobs"
    monkeypatch.setenv("PROTOLINK_CI_DIR", str(base))
    return base


def _checkout(tmp_path):
    source = tmp_path / "checkout"
    (source / "pkg").mkdir(parents=True)
    (source / "pkg" / "mod.py").write_text("print('hi')\n")
    (source / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(source / "run.sh", 0o4755)
    os.utime(source / "pkg" / "mod.py", (1_000_000_000, 1_000_000_000))
    os.symlink("/etc/shadow", source / "junit.xml")
    os.symlink("pkg", source / "alias")
    os.mkfifo(source / "pipe")
    return source


@pytest.mark.root
def test_the_copy_keeps_files_links_and_times_drops_set_id_bits_and_special_files(tmp_path, jobs):
    source = _checkout(tmp_path)
    workspace = Workspace.create(NOBODY, NOBODY)
    stats, commit = workspace.fill(str(source), max_bytes=1 << 20, timeout=60)
    repo = workspace.repo
    assert commit is None
    assert (stats.files, stats.symlinks, stats.directories) == (2, 2, 2)
    assert stats.left_out == [{"path": "pipe", "reason": "not a regular file (prw-r--r--)"}]
    assert (repo / "pkg" / "mod.py").read_text() == "print('hi')\n"
    assert (repo / "pkg" / "mod.py").stat().st_mtime == 1_000_000_000
    assert stat.S_IMODE((repo / "run.sh").stat().st_mode) == 0o755
    assert os.readlink(repo / "junit.xml") == "/etc/shadow"
    assert os.readlink(repo / "alias") == "pkg"
    for path in (repo, repo / "pkg", repo / "pkg" / "mod.py", workspace.home):
        assert (path.stat().st_uid, path.stat().st_gid) == (NOBODY, NOBODY)
    assert (repo / "junit.xml").lstat().st_uid == NOBODY
    assert stat.S_IMODE(jobs_dir().stat().st_mode) == 0o700
    workspace.remove()
    assert not workspace.path.exists()
    assert (source / "pkg" / "mod.py").read_text() == "print('hi')\n"


def test_a_repository_larger_than_the_budget_is_refused(tmp_path, jobs):
    source = tmp_path / "big"
    source.mkdir()
    (source / "a").write_bytes(b"x" * 4096)
    (source / "b").write_bytes(b"x" * 4096)
    workspace = Workspace.create(os.getuid(), os.getgid())
    with pytest.raises(RepositoryError, match="disk budget"):
        workspace.fill(str(source), max_bytes=6000, timeout=60)
    workspace.remove()


def test_neither_a_directory_nor_a_url_is_refused(tmp_path, jobs):
    workspace = Workspace.create(os.getuid(), os.getgid())
    with pytest.raises(RepositoryError, match="neither a directory nor a git URL"):
        workspace.fill(str(tmp_path / "missing"), max_bytes=1 << 20, timeout=60)
    workspace.remove()


def test_sweep_removes_only_the_jobs_whose_runner_is_gone(tmp_path, jobs):
    mine = Workspace.create(os.getuid(), os.getgid())
    done = subprocess.Popen(["true"])
    done.wait()
    gone = jobs / "job-gone"
    gone.mkdir()
    (gone / "owner").write_text(process_owner(done.pid).replace(":None", ":1"))
    (gone / "workspace").mkdir()
    (gone / "workspace" / "locked").mkdir(mode=0)
    half = jobs / "job-half"  # killed before it wrote its owner, long ago
    half.mkdir()
    os.utime(half, (time.time() - 3600, time.time() - 3600))
    starting = jobs / "job-starting"  # a live runner's, a moment before it writes its owner
    starting.mkdir()
    stranger = jobs / "notes"
    stranger.mkdir()
    assert sorted(path.name for path in sweep()) == ["job-gone", "job-half"]
    assert mine.path.exists() and starting.exists() and stranger.exists()
    mine.remove()


def test_a_jobs_directory_others_can_open_is_refused(tmp_path, monkeypatch):
    base = tmp_path / "open"
    base.mkdir(mode=0o755)
    os.chmod(base, 0o755)
    monkeypatch.setenv("PROTOLINK_CI_DIR", str(base))
    with pytest.raises(SandboxError, match="only its owner can open.*PROTOLINK_CI_DIR"):
        jobs_dir()


@pytest.mark.parametrize("text, url", [
    ("https://github.com/o/r.git", True), ("git://host/r", True), ("ssh://git@host/r", True),
    ("git@github.com:o/r.git", True), ("file:///srv/r", False), ("ext::sh -c touch% /tmp/x", False),
    ("-uhelp", False), ("./relative", False),
])
def test_only_network_transports_count_as_git_urls(text, url):
    assert is_git_url(text) is url


def test_credentials_in_a_url_are_never_shown():
    assert public_source("https://user:t0ken@example.org/r.git") == "https://***@example.org/r.git"
    assert public_source("/srv/checkout") == "/srv/checkout"


@pytest.fixture
def git_daemon(tmp_path):
    """A bare repository served by `git daemon` on loopback: (URL, its HEAD commit)."""
    work = tmp_path / "origin-work"
    work.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.org", "-C", str(work)]
    subprocess.run(["git", "init", "-q", str(work)], check=True)
    (work / "README").write_text("origin\n")
    (work / ".gitmodules").write_text('[submodule "dep"]\n\tpath = dep\n\turl = /etc\n')
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    served = tmp_path / "served"
    served.mkdir()
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(served / "r.git")], check=True)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # `git daemon` runs git-daemon as a child: a session of their own, so both go with the group.
    daemon = subprocess.Popen(["git", "daemon", "--reuseaddr", "--export-all", "--listen=127.0.0.1",
                               f"--port={port}", f"--base-path={served}", str(served)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                os.killpg(daemon.pid, signal.SIGKILL)
                raise
            time.sleep(0.05)
    yield f"git://127.0.0.1:{port}/r.git", head
    os.killpg(daemon.pid, signal.SIGKILL)
    daemon.wait()


def test_a_git_url_is_cloned_without_hooks_or_submodules_and_its_commit_reported(git_daemon, jobs):
    url, head = git_daemon
    workspace = Workspace.create(os.getuid(), os.getgid())
    stats, commit = workspace.fill(url, max_bytes=1 << 20, timeout=60)
    assert commit == head
    assert (workspace.repo / "README").read_text() == "origin\n"
    assert not (workspace.repo / "dep").exists() or not any((workspace.repo / "dep").iterdir())
    hooks = workspace.repo / ".git" / "hooks"
    assert not hooks.exists() or not any(hooks.iterdir())
    assert not (workspace.path / "clone").exists()
    workspace.remove()


def test_a_clone_that_fails_says_why_without_credentials(jobs):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens there once closed
    workspace = Workspace.create(os.getuid(), os.getgid())
    with pytest.raises(RepositoryError, match=r"cannot clone http://\*\*\*@127.0.0.1") as failure:
        workspace.fill(f"http://user:t0ken@127.0.0.1:{port}/r.git", max_bytes=1 << 20, timeout=60)
    assert "t0ken" not in str(failure.value)
    workspace.remove()
