"""Command resolution: absolute, explicit relative, or the supplied PATH; never the host's PATH."""

import os

import pytest

from protolink.execution.resolve import (
    Resolved,
    check_real_executable,
    resolve_command,
    resolve_directory,
    resolve_executable,
)


@pytest.fixture
def tree(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, mode in (("tool", 0o755), ("plain", 0o644)):
        (bin_dir / name).write_text("#!/bin/sh\n")
        (bin_dir / name).chmod(mode)
    (tmp_path / "work").mkdir()
    return tmp_path


def test_absolute_executable_is_kept_verbatim(tree):
    path = str(tree / "bin" / "tool")
    assert resolve_executable(path, cwd="/", env={}) == path


def test_explicit_relative_path_is_taken_from_the_working_directory(tree):
    assert resolve_executable("bin/tool", cwd=str(tree), env={}) == str(tree / "bin" / "tool")
    assert resolve_executable("./bin/tool", cwd=str(tree), env={}) == f"{tree}/./bin/tool"


def test_bare_name_uses_only_absolute_entries_of_the_supplied_path(tree, monkeypatch):
    monkeypatch.setenv("PATH", str(tree / "bin"))
    with pytest.raises(ValueError, match="no PATH"):
        resolve_executable("tool", cwd=str(tree), env={})
    with pytest.raises(ValueError, match="not found"):
        resolve_executable("tool", cwd=str(tree), env={"PATH": "bin:"})  # relative, empty
    env = {"PATH": f"/nonexistent:{tree / 'bin'}"}
    assert resolve_executable("tool", cwd=str(tree), env=env) == str(tree / "bin" / "tool")


def test_non_executable_and_missing_files_are_rejected(tree):
    with pytest.raises(ValueError, match="not an executable file"):
        resolve_executable(str(tree / "bin" / "plain"), cwd="/", env={})
    with pytest.raises(ValueError, match="not found"):
        resolve_executable("plain", cwd="/", env={"PATH": str(tree / "bin")})
    with pytest.raises(ValueError, match="not an executable file"):
        resolve_executable("./missing", cwd=str(tree), env={})
    with pytest.raises(ValueError, match="empty"):
        resolve_executable("", cwd=str(tree), env={})


def test_working_directory_is_absolute_existing_and_resolved(tree):
    (tree / "link").symlink_to(tree / "work")
    assert resolve_directory(str(tree / "link")) == str(tree / "work")
    with pytest.raises(ValueError, match="absolute"):
        resolve_directory("work")
    with pytest.raises(ValueError, match="does not exist"):
        resolve_directory(str(tree / "missing"))
    with pytest.raises(ValueError, match="does not exist"):
        resolve_directory(str(tree / "bin" / "tool"))


def test_resolve_command_replaces_argv0_and_checks_everything(tree):
    resolved = resolve_command(["tool", "-x", "arg"], str(tree / "work"), {"PATH": str(tree / "bin")})
    tool = str(tree / "bin" / "tool")
    assert resolved == Resolved((tool, "-x", "arg"), str(tree / "work"), tool)
    with pytest.raises(ValueError, match="at least the executable"):
        resolve_command([], str(tree), {})
    with pytest.raises(ValueError, match="NUL"):
        resolve_command([str(tree / "bin" / "tool"), "a\0b"], str(tree), {})
    with pytest.raises(ValueError, match="invalid environment variable name"):
        resolve_command([str(tree / "bin" / "tool")], str(tree), {"A=B": "1"})
    with pytest.raises(ValueError, match="NUL"):
        resolve_command([str(tree / "bin" / "tool")], str(tree), {"A": "\0"})


def test_the_host_path_is_never_consulted(tree, monkeypatch):
    monkeypatch.setenv("PATH", os.pathsep.join([str(tree / "bin"), os.defpath]))
    with pytest.raises(ValueError):
        resolve_command(["tool"], str(tree), {})


def test_a_symlinked_executable_keeps_its_name_and_names_the_file_it_runs(tree):
    """A virtualenv's python is a symlink: argv[0] stays the link (the interpreter finds its
    environment through it), and the file it runs is named too."""
    (tree / "venv").mkdir()
    (tree / "venv" / "python").symlink_to(tree / "bin" / "tool")
    resolved = resolve_command(["python", "-V"], str(tree), {"PATH": str(tree / "venv")})
    assert resolved == Resolved((str(tree / "venv" / "python"), "-V"), str(tree), str(tree / "bin" / "tool"))


def test_the_check_before_launch_refuses_a_link_that_moved(tree):
    link = tree / "bin" / "link"
    link.symlink_to(tree / "bin" / "tool")
    check_real_executable(str(link), str(tree / "bin" / "tool"))
    link.unlink()
    link.symlink_to(tree / "bin" / "plain")
    with pytest.raises(ValueError, match="now resolves to .*plain.*nothing was started"):
        check_real_executable(str(link), str(tree / "bin" / "tool"))
