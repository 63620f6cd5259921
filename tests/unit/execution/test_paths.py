"""Paths beneath roots: aliases of a root are respelled through its real path, and the walk
beneath a root follows no symlink, even on a kernel that follows one opened as a directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from protolink.execution import paths
from protolink.execution.paths import WorkspacePath, canonical_target


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    """A root, a directory beside it, and aliases in a directory of links outside both."""
    base = tmp_path.resolve()
    root, outside, links = base / "root", base / "outside", base / "links"
    for directory in (root / "sub", outside, links):
        directory.mkdir(parents=True)
    (outside / "secret.txt").write_text("secret\n")
    (links / "root").symlink_to(root)
    (links / "parent").symlink_to(base)
    (links / "chain").symlink_to(links / "root")
    (links / "outside").symlink_to(outside)
    (links / "sub").symlink_to(root / "sub")
    (links / "loop").symlink_to(links / "loop")
    return {"root": root, "outside": outside, "links": links}


@pytest.mark.parametrize("alias", ["root", "parent/root", "chain"])
def test_an_alias_of_a_root_is_respelled_through_its_real_path(tree, alias):
    """A link to the root, a link to one of its parents, a link to a link: the rest is kept as written."""
    requested = f"{tree['links']}/{alias}/sub/./a.txt"
    assert canonical_target(requested, [str(tree["root"])]) == WorkspacePath(str(tree["root"]), ("sub", "a.txt"))


def test_the_real_spelling_is_taken_as_written_without_touching_the_file_system(tree, monkeypatch):
    """A symlink beneath a root, even one to another root, is part of the path and refused when opened."""
    other = tree["outside"]
    (tree["root"] / "to-other").symlink_to(other)

    def no_file_system(*args, **kwargs):
        raise AssertionError("a real spelling needs no file system access")

    monkeypatch.setattr(paths.os, "lstat", no_file_system)
    monkeypatch.setattr(paths.os.path, "realpath", no_file_system)
    roots = [str(tree["root"]), str(other)]
    target = canonical_target(f"{tree['root']}/to-other/secret.txt", roots)
    assert target == WorkspacePath(str(tree["root"]), ("to-other", "secret.txt"))
    monkeypatch.undo()
    with pytest.raises(ValueError, match="symlink"):
        read_regular_file(target.path, roots, max_bytes=100)


def test_a_symlink_beneath_the_root_is_refused_through_an_alias(tree):
    (tree["root"] / "escape").symlink_to(tree["outside"])
    roots = [str(tree["root"])]
    target = canonical_target(f"{tree['links']}/root/escape/secret.txt", roots)
    assert target.path == f"{tree['root']}/escape/secret.txt"
    with pytest.raises(ValueError, match="symlink"):
        read_regular_file(target.path, roots, max_bytes=100)


@pytest.mark.parametrize("alias", ["outside/secret.txt", "sub/a.txt", "loop/a.txt", "missing/a.txt", "root-file/a"])
def test_aliases_that_do_not_name_a_root_are_outside_the_roots(tree, alias):
    """A link outside every root, a link to a directory beneath a root (not the root), a loop, a missing link."""
    (tree["links"] / "root-file").symlink_to(tree["outside"] / "secret.txt")
    with pytest.raises(ValueError, match="not inside a configured root"):
        canonical_target(f"{tree['links']}/{alias}", [str(tree["root"])])


def test_the_deepest_root_holds_a_respelled_path(tree):
    roots = [str(tree["root"]), str(tree["root"] / "sub")]
    target = canonical_target(f"{tree['links']}/root/sub/a.txt", roots)
    assert target == WorkspacePath(str(tree["root"] / "sub"), ("a.txt",))


@pytest.mark.parametrize("path", ["relative/a.txt", "{links}/root/../outside/secret.txt", "{links}/root/a\0b"])
def test_malformed_paths_are_refused_before_any_alias_is_resolved(tree, path):
    with pytest.raises(ValueError, match="absolute|'..'|NUL"):
        canonical_target(path.format(links=tree["links"]), [str(tree["root"])])


def test_directory_symlink_followed_by_the_kernel_is_rejected(tmp_path: Path, monkeypatch):
    """gVisor follows a symlink to a directory opened with O_DIRECTORY | O_NOFOLLOW; the walk must still refuse it."""
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text("secret\n")
    (root / "link").symlink_to(tmp_path / "outside")
    real_open = os.open

    def following(path, flags, *args, **kwargs):  # what gVisor does with O_DIRECTORY
        if flags & os.O_DIRECTORY:
            flags &= ~os.O_NOFOLLOW
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(paths.os, "open", following)
    with pytest.raises(ValueError, match="symlink"):
        read_regular_file(str(root / "link" / "secret.txt"), [str(root)], max_bytes=100)
    (root / "sub" / "ok.txt").write_text("ok\n")
    assert read_regular_file(str(root / "sub" / "ok.txt"), [str(root)], max_bytes=100) == b"ok\n"


def read_regular_file(path: str, roots: list[str], *, max_bytes: int) -> bytes:
    with paths.open_regular_file(path, roots) as opened:
        return paths.read_bounded(opened, max_bytes)
