"""The disk watch measures what writable roots really allocate and stops commands past the budget."""

from __future__ import annotations

import asyncio
import os
import resource
import subprocess

import pytest

from protolink.sandbox import disk
from protolink.sandbox.disk import ENTRY_COST, DiskWatch, usage_bytes

#: How long a test waits for the watch to act: a bound on a hang (it takes some 20 ms), not a speed.
STOP_GUARD_SECONDS = 30


def test_usage_counts_allocated_blocks_entries_and_hardlinks_once(tmp_path):
    empty = usage_bytes([str(tmp_path)]).bytes
    (tmp_path / "data").write_bytes(os.urandom(1 << 20))
    os.link(tmp_path / "data", tmp_path / "again")
    for index in range(100):
        (tmp_path / f"empty{index}").touch()
    used = usage_bytes([str(tmp_path)]).bytes - empty
    assert (1 << 20) + 100 * ENTRY_COST <= used < 2 * (1 << 20)


def test_symlinks_are_not_followed(tmp_path):
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "big").write_bytes(os.urandom(1 << 20))
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "link").symlink_to(tmp_path / "outside", target_is_directory=True)
    assert usage_bytes([str(tmp_path / "root")]).bytes < 1 << 16


async def test_growth_past_the_budget_calls_stop_and_shrinking_does_not(tmp_path):
    stops = []
    watch = DiskWatch([str(tmp_path)], 1 << 20, lambda: stops.append(1), poll_seconds=0.01, walk_seconds=0.05)
    await watch.start()
    try:
        (tmp_path / "small").write_bytes(b"x" * 1000)
        await asyncio.sleep(0.3)
        assert stops == []
        (tmp_path / "big").write_bytes(os.urandom(2 << 20))
        assert await _stops_within(stops, STOP_GUARD_SECONDS)
        assert watch.exceeded == 1
        (tmp_path / "big").unlink()
        await asyncio.sleep(0.3)
        assert len(stops) == 1
    finally:
        await watch.aclose()


@pytest.fixture(autouse=True)
def _remove_deep_trees(tmp_path):
    """rm(1) removes what a test made, by descriptors: pytest's own cleanup of old runs would
    recurse past Python's limit on a tree 1,100 levels deep (and fail every later run's end)."""
    yield
    subprocess.run(["rm", "-rf", "--", *(str(path) for path in tmp_path.iterdir())], check=False)


def _deep(base, levels: int, name: str = "d" * 20) -> tuple[int, int, list[tuple[int, int]]]:
    """A chain of ``levels`` nested directories, made with relative steps: the deepest one, open;
    the bytes the chain allocates as :func:`usage_bytes` counts them; each level's (device, inode)."""
    fd = os.dup(base) if isinstance(base, int) else os.open(base, os.O_RDONLY | os.O_DIRECTORY)
    allocated, identities = 0, []
    for _ in range(levels):
        os.mkdir(name, dir_fd=fd)
        child = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = child
        info = os.fstat(fd)
        allocated += info.st_blocks * 512 + ENTRY_COST
        identities.append((info.st_dev, info.st_ino))
    return fd, allocated, identities


def _write(dir_fd: int, name: str, size: int) -> int:
    """A synced file of ``size`` random bytes; the bytes it allocates as :func:`usage_bytes` counts them."""
    data = os.open(name, os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=dir_fd)
    try:
        os.write(data, os.urandom(size))
        os.fsync(data)
        return os.fstat(data).st_blocks * 512 + ENTRY_COST
    finally:
        os.close(data)


@pytest.fixture
def few_descriptors():
    """At most 64 descriptors for the process while the test runs (the walk needs a handful)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    open_now = len(os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(64, open_now + 16), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_tree_1100_levels_deep_is_measured_exactly_with_few_descriptors(tmp_path, few_descriptors):
    root = tmp_path / "root"
    root.mkdir()
    empty = usage_bytes([str(root)])
    fd, allocated, _ = _deep(root, 1100)  # about 23,000 characters of path, far past PATH_MAX
    try:
        allocated += _write(fd, "data", 1 << 20)
        sibling, more, _ = _deep(fd, 3, name="s")  # a second branch at the bottom, walked back up
        os.close(sibling)
        allocated += more + _write(fd, "after", 4096)
    finally:
        os.close(fd)
    usage = usage_bytes([str(root)])
    assert empty.complete and usage.complete
    assert usage.bytes - empty.bytes == allocated


def _race_while_walking(monkeypatch, depth: int, move) -> None:
    """Call ``move`` once, when the walk enters the directory ``depth`` levels down."""
    enter = disk._enter

    def entering(levels, fd, identity):
        if len(levels) == depth:
            move()
        return enter(levels, fd, identity)

    monkeypatch.setattr(disk, "_enter", entering)


@pytest.mark.parametrize("to", ["inside", "outside"])
def test_a_rename_racing_the_walk_makes_it_incomplete_not_wrong(tmp_path, monkeypatch, to):
    """A directory the walk stands in is moved elsewhere (within the root, or out of it) while it
    walks 1,100 levels down: going back up, ``..`` is no longer the directory it came from, so the
    walk of that root ends there, incomplete. It counts nothing twice and nothing outside the root."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "big").write_bytes(os.urandom(4 << 20))
    (root / "early").write_bytes(os.urandom(1 << 20))
    fd, allocated, _ = _deep(root, 1100)
    try:
        allocated += _write(fd, "data", 1 << 20)
    finally:
        os.close(fd)
    exact = usage_bytes([str(root)])
    assert exact.complete
    target = root / "moved" if to == "inside" else outside / "moved"
    _race_while_walking(monkeypatch, 1000, lambda: os.rename(root / ("d" * 20) / ("d" * 20), target))
    raced = usage_bytes([str(root)])
    assert not raced.complete
    assert raced.bytes <= exact.bytes  # each inode once, and never what lies outside the root
    assert raced.bytes >= allocated - 2 * (ENTRY_COST + 4096)  # what it walked before it lost its place


def test_a_removal_racing_the_walk_keeps_it_complete(tmp_path, monkeypatch):
    """The tree is removed (rm -rf, deepest first) while the walk is 1,000 levels down: going back
    up through directories already removed still arrives where it came from (Linux keeps a removed
    directory's ``..``), so the walk goes on and is complete."""
    root = tmp_path / "root"
    root.mkdir()
    (root / "kept").write_bytes(os.urandom(1 << 20))
    fd, _, _ = _deep(root, 1100)
    os.close(fd)
    exact = usage_bytes([str(root)])
    _race_while_walking(monkeypatch, 1000,
                        lambda: subprocess.run(["rm", "-rf", str(root / ("d" * 20) / ("d" * 20))], check=True))
    raced = usage_bytes([str(root)])
    assert raced.complete and raced.bytes <= exact.bytes
    assert usage_bytes([str(root)]).bytes >= 1 << 20  # the file beside the tree


def test_a_directory_replaced_before_the_walk_enters_it_makes_it_incomplete(tmp_path, monkeypatch):
    root = tmp_path / "root"
    root.mkdir()
    fd, _, _ = _deep(root, 3, name="a")
    os.close(fd)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "big").write_bytes(os.urandom(1 << 20))
    exact = usage_bytes([str(root)])
    stat, swapped = os.stat, []

    def swapping(name, *, dir_fd=None, follow_symlinks=True):
        info = stat(name, dir_fd=dir_fd, follow_symlinks=follow_symlinks)
        if name == "a" and not swapped:
            swapped.append(name)
            os.rename(root / "a", root / "old")
            os.rename(tmp_path / "other", root / "a")
        return info

    monkeypatch.setattr(disk.os, "stat", swapping)
    raced = usage_bytes([str(root)])
    assert not raced.complete and raced.bytes <= exact.bytes


def test_more_entries_than_the_limit_make_the_walk_incomplete(tmp_path):
    for index in range(100):
        (tmp_path / f"empty{index}").touch()
    assert usage_bytes([str(tmp_path)], max_entries=100).complete
    assert not usage_bytes([str(tmp_path)], max_entries=99).complete


def test_roots_inside_one_another_are_counted_once(tmp_path):
    (tmp_path / "inner").mkdir()
    (tmp_path / "inner" / "data").write_bytes(os.urandom(1 << 20))
    alone = usage_bytes([str(tmp_path)]).bytes
    assert usage_bytes([str(tmp_path), str(tmp_path / "inner")]).bytes == alone
    # Measured as a root first, the inner directory's own entry is not counted (a root's never is).
    inner = (tmp_path / "inner").stat().st_blocks * 512 + ENTRY_COST
    assert usage_bytes([str(tmp_path / "inner"), str(tmp_path)]).bytes == alone - inner


async def _grow_by_three_mib(root, fs: dict[str, int]) -> None:
    """Write three 1 MiB files into ``root``, a poll apart, and add them to the stand-in ``fs``."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for index in range(3):
            fs["used"] += _write(fd, f"f{index}", 1 << 20)
            await asyncio.sleep(0.05)
    finally:
        os.close(fd)


async def _stops_within(stops, seconds: float) -> bool:
    return await _holds_within(lambda: bool(stops), seconds)


async def _holds_within(condition, seconds: float) -> bool:
    for _ in range(int(seconds / 0.02)):
        if condition():
            return True
        await asyncio.sleep(0.02)
    return condition()


async def test_a_deep_tree_does_not_count_other_writers(tmp_path):
    """The regression: with a tree too deep to walk, the file system's growth stood in, so another
    writer on the same file system counted as the sandbox's growth and commands were stopped."""
    root, other = tmp_path / "root", tmp_path / "other"
    root.mkdir()
    other.mkdir()
    fd, _, _ = _deep(root, 1100)
    stops = []
    watch = DiskWatch([str(root)], 1 << 20, lambda: stops.append(1), poll_seconds=0.01, walk_seconds=0.05)
    await watch.start()
    try:
        for index in range(4):
            (other / f"f{index}").write_bytes(os.urandom(1 << 20))
            os.sync()
        _write(fd, "small", 4096)
        assert not await _stops_within(stops, 0.5)
        for index in range(3):
            _write(fd, f"f{index}", 1 << 20)  # past the budget, at the bottom of the tree
        assert await _stops_within(stops, STOP_GUARD_SECONDS)
    finally:
        os.close(fd)
        await watch.aclose()


async def test_an_unmeasurable_tree_counts_the_file_systems_growth(tmp_path, monkeypatch):
    monkeypatch.setattr(disk, "MAX_ENTRIES", 50)
    for index in range(60):
        (tmp_path / f"empty{index}").touch()
    stops = []
    watch = DiskWatch([str(tmp_path)], 1 << 20, lambda: stops.append(1), poll_seconds=0.01, walk_seconds=0.05)
    await watch.start()
    try:
        fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for index in range(4):
                _write(fd, f"f{index}", 1 << 20)  # not measured: past the entries the walk visits
        finally:
            os.close(fd)
        assert await _stops_within(stops, STOP_GUARD_SECONDS)
    finally:
        await watch.aclose()


async def test_space_freed_by_others_does_not_hide_growth(tmp_path, monkeypatch):
    """Another process frees 1 GiB (a large file truncated) just before a command writes past the
    budget: the watch still measures at once (its periodic measurement is a minute away)."""
    fs = {"used": 10 << 30}  # the file system's used space as the watch sees it, other jobs' changes included
    monkeypatch.setattr(disk, "_fs_used", lambda path: fs["used"])
    stops = []
    watch = DiskWatch([str(tmp_path)], 1 << 20, lambda: stops.append(1), poll_seconds=0.01, walk_seconds=60)
    await watch.start()
    try:
        await asyncio.sleep(0.1)
        fs["used"] -= 1 << 30
        await asyncio.sleep(0.1)
        await _grow_by_three_mib(tmp_path, fs)
        assert await _stops_within(stops, STOP_GUARD_SECONDS)
    finally:
        await watch.aclose()


async def test_the_stand_in_counts_rises_since_the_last_complete_measurement(tmp_path, monkeypatch):
    """While a walk is incomplete, the last complete measurement plus the file system's rises
    since then stand in: other jobs' writes before that measurement do not count, space they free
    does not hide the roots' growth."""
    fs = {"used": 10 << 30}
    monkeypatch.setattr(disk, "_fs_used", lambda path: fs["used"])
    for index in range(10):
        (tmp_path / f"empty{index}").touch()
    stops = []
    watch = DiskWatch([str(tmp_path)], 1 << 20, lambda: stops.append(1), poll_seconds=0.01, walk_seconds=0.05)
    await watch.start()
    try:
        fs["used"] += 64 << 20  # another job writes, and the roots are measured completely
        assert await _holds_within(lambda: watch._complete[1] >= 64 << 20, STOP_GUARD_SECONDS)
        monkeypatch.setattr(disk, "MAX_ENTRIES", 5)  # from now on every walk is incomplete
        await asyncio.sleep(0.3)
        assert stops == []
        fs["used"] -= 1 << 30  # another job frees 1 GiB
        await asyncio.sleep(0.05)
        await _grow_by_three_mib(tmp_path, fs)
        assert await _stops_within(stops, STOP_GUARD_SECONDS)
    finally:
        await watch.aclose()
