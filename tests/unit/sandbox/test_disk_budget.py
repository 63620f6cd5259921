"""The disk watch measures what writable roots really allocate and stops commands past the budget."""

from __future__ import annotations

import asyncio
import os

from protolink.sandbox.disk import ENTRY_COST, DiskWatch, usage_bytes


def test_usage_counts_allocated_blocks_entries_and_hardlinks_once(tmp_path):
    empty = usage_bytes([str(tmp_path)])
    (tmp_path / "data").write_bytes(os.urandom(1 << 20))
    os.link(tmp_path / "data", tmp_path / "again")
    for index in range(100):
        (tmp_path / f"empty{index}").touch()
    used = usage_bytes([str(tmp_path)]) - empty
    assert (1 << 20) + 100 * ENTRY_COST <= used < 2 * (1 << 20)


def test_symlinks_are_not_followed(tmp_path):
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "big").write_bytes(os.urandom(1 << 20))
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "link").symlink_to(tmp_path / "outside", target_is_directory=True)
    assert usage_bytes([str(tmp_path / "root")]) < 1 << 16


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
