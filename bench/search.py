"""search_files against ``grep -rF`` on the same generated tree.

The tree fills the traversal limits exactly: 10 directories of 999 UTF-8 files (10,000
entries) holding about 32 MB, under the 32 MiB search budget, so both tools read everything.
The needle occurs once in 500 files, below max_results. Each figure is the median of several
warm-cache runs; the target is a ratio of at most 3::

    python bench/search.py
"""

from __future__ import annotations

import asyncio
import random
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from protolink.execution.local import LocalExecutionBackend
from protolink.execution.paths import canonical_roots

DIRECTORIES = 10
FILES_PER_DIRECTORY = 999
FILE_BYTES = 3_300
NEEDLE = "Quokka"
NEEDLE_FILES = 500
RUNS = 7


def build_tree(root: Path) -> int:
    words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet"]
    rng = random.Random(7)
    needles = set(rng.sample(range(DIRECTORIES * FILES_PER_DIRECTORY), NEEDLE_FILES))
    total = 0
    for index in range(DIRECTORIES * FILES_PER_DIRECTORY):
        lines: list[str] = []
        size = 0
        while size < FILE_BYTES:
            line = " ".join(rng.choice(words) for _ in range(10)) + "\n"
            lines.append(line)
            size += len(line)
        if index in needles:
            lines[rng.randrange(len(lines))] = f"the {NEEDLE} line\n"
        directory = root / f"d{index // FILES_PER_DIRECTORY:02d}"
        directory.mkdir(exist_ok=True)
        data = "".join(lines).encode()[:FILE_BYTES]
        (directory / f"f{index:05d}.txt").write_bytes(data)
        total += len(data)
    return total


def median_seconds(run: Callable[[], object]) -> float:
    run()  # warm the page cache and the interpreter
    timings = []
    for _ in range(RUNS):
        started = time.perf_counter()
        run()
        timings.append(time.perf_counter() - started)
    return statistics.median(timings)


def main() -> None:
    backend = LocalExecutionBackend()
    with tempfile.TemporaryDirectory() as temporary:
        root = Path(temporary).resolve()
        total = build_tree(root)
        roots = canonical_roots([root])
        print(f"tree: {DIRECTORIES * FILES_PER_DIRECTORY} files in {DIRECTORIES} directories, "
              f"{total / 2**20:.1f} MiB, needle in {NEEDLE_FILES} files; median of {RUNS} runs")

        for case_sensitive, grep_flags in ((True, "-rFn"), (False, "-rFni")):
            compare(backend, root, roots, case_sensitive, grep_flags)


def compare(backend: LocalExecutionBackend, root: Path, roots: tuple[str, ...], case_sensitive: bool,
            grep_flags: str) -> None:
    def search() -> object:
        result = asyncio.run(backend.search_files(
            str(root), roots=roots, query=NEEDLE, pattern="*", case_sensitive=case_sensitive,
            max_results=1000, max_file_bytes=8 * 2**20))
        assert len(result.items) == NEEDLE_FILES and not result.truncated and not result.skipped
        return result

    def grep() -> object:
        done = subprocess.run(["grep", grep_flags, NEEDLE, str(root)], capture_output=True, check=True)
        assert done.stdout.count(b"\n") == NEEDLE_FILES
        return done

    ours, theirs = median_seconds(search), median_seconds(grep)
    label = "case-sensitive  " if case_sensitive else "case-insensitive"
    print(f"{label}  search_files {ours * 1000:7.1f} ms   grep {grep_flags:6} {theirs * 1000:7.1f} ms"
          f"   ratio {ours / theirs:4.2f} (target <= 3)")


if __name__ == "__main__":
    main()
