"""The disk watch measures what writable roots really allocate and stops commands past the budget."""

from __future__ import annotations

import asyncio
import os

from protolink.sandbox.disk import ENTRY_COST, MAX_DEPTH, DiskWatch, usage_bytes


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
        for _ in range(200):
            if stops:
                break
            await asyncio.sleep(0.02)
        assert stops and watch.exceeded == 1
        (tmp_path / "big").unlink()
        await asyncio.sleep(0.3)
        assert len(stops) == 1
    finally:
        await watch.aclose()


def _deep(base, levels: int):
    """A chain of ``levels`` nested directories, made with relative steps; the deepest one, open."""
    fd = os.dup(base) if isinstance(base, int) else os.open(base, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(levels):
        os.mkdir("d" * 20, dir_fd=fd)
        child = os.open("d" * 20, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = child
    return fd


def test_a_tree_deeper_than_path_max_is_measured(tmp_path):
    fd = _deep(tmp_path, MAX_DEPTH - 1)  # about 5,300 characters of path
    before = usage_bytes([str(tmp_path)])
    data = os.open("data", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd)
    os.write(data, os.urandom(1 << 20))
    os.fsync(data)
    os.close(data)
    deeper = _deep(fd, 2)  # past MAX_DEPTH: not measured
    os.close(deeper)
    os.close(fd)
    after = usage_bytes([str(tmp_path)])
    assert before.complete and not after.complete
    assert after.bytes - before.bytes >= 1 << 20


async def test_an_unmeasurable_tree_counts_the_file_systems_growth(tmp_path):
    stops = []
    watch = DiskWatch([str(tmp_path)], 1 << 20, lambda: stops.append(1), poll_seconds=0.01, walk_seconds=0.05)
    await watch.start()
    try:
        fd = _deep(tmp_path, MAX_DEPTH + 10)
        for index in range(4):
            data = os.open(f"f{index}", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd)
            os.write(data, os.urandom(1 << 20))
            os.fsync(data)
            os.close(data)
        os.close(fd)
        for _ in range(200):
            if stops:
                break
            await asyncio.sleep(0.02)
        assert stops
    finally:
        await watch.aclose()
