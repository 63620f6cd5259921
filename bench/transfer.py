"""Upload and download through a sandbox (protolink.sandbox.transfer) against ``docker cp``.

Needs a Docker Engine and the sandbox image (built when missing)::

    python bench/transfer.py [--repeats N] [--image TAG]

One run, both tools timed in turns on the same sandbox container, with the machine's load
average, prints the median wall time of each direction and the ratio ours / ``docker cp`` for:
  1. one file of 100 MB (random bytes);
  2. a tree of 5,000 files (2-6 KiB each, 50 directories).
``docker cp`` writes as root and checks nothing; ours streams through the sandbox's server and a
transfer process as the command user, and checks every path and tar member at both ends.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from protolink.sandbox.docker import DockerSandbox
from protolink.sandbox.provision import ensure_image
from protolink.sandbox.transfer import download, upload

NOBODY = 65534
FILE_BYTES = 100_000_000
TREE_FILES, TREE_DIRECTORIES = 5_000, 50


def build_file(path: Path) -> None:
    with open(path, "wb") as file:
        for _ in range(FILE_BYTES // (1 << 20)):
            file.write(os.urandom(1 << 20))
        file.write(os.urandom(FILE_BYTES % (1 << 20)))


def build_tree(root: Path) -> None:
    rng = random.Random(7)
    for index in range(TREE_FILES):
        directory = root / f"d{index % TREE_DIRECTORIES:02d}"
        directory.mkdir(parents=True, exist_ok=True)
        (directory / f"f{index:05d}.txt").write_bytes(rng.randbytes(rng.randrange(2048, 6144)))


def load() -> str:
    return "load " + " ".join(f"{figure:.1f}" for figure in os.getloadavg())


def clear(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


async def timed(action: Callable[[], Awaitable[object]]) -> float:
    started = time.perf_counter()
    await action()
    return time.perf_counter() - started


async def docker_cp(source: str, destination: str) -> None:
    process = await asyncio.create_subprocess_exec("docker", "cp", "-q", source, destination)
    if await process.wait() != 0:
        raise RuntimeError(f"docker cp {source} {destination} failed")


async def compare(name: str, local: Path, sandbox: DockerSandbox, work: Path, back: Path, repeats: int) -> None:
    backend, container = sandbox.backend, sandbox.container_id
    remote, returned = work / name, back / name
    times: dict[str, list[float]] = {key: [] for key in ("up", "down", "cp up", "cp down")}
    for _ in range(repeats):
        times["up"].append(await timed(lambda: upload(backend, local, str(remote))))
        times["down"].append(await timed(lambda: download(backend, str(remote), returned)))
        clear(remote)
        clear(returned)
        times["cp up"].append(await timed(lambda: docker_cp(str(local), f"{container}:{remote}")))
        times["cp down"].append(await timed(lambda: docker_cp(f"{container}:{remote}", str(returned))))
        clear(remote)
        clear(returned)
    median = {key: statistics.median(values) for key, values in times.items()}
    print(f"{name}: upload {median['up'] * 1000:.0f} ms vs docker cp {median['cp up'] * 1000:.0f} ms "
          f"(ratio {median['up'] / median['cp up']:.2f}); download {median['down'] * 1000:.0f} ms vs docker cp "
          f"{median['cp down'] * 1000:.0f} ms (ratio {median['down'] / median['cp down']:.2f}); {load()}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--image")
    args = parser.parse_args()
    image = args.image or ensure_image()
    base = Path(tempfile.mkdtemp(prefix="protolink-bench-transfer-")).resolve()
    try:
        work, back, inputs = base / "work", base / "back", base / "inputs"
        for directory in (work, back, inputs):
            directory.mkdir()
        os.chown(work, NOBODY, NOBODY)
        build_file(inputs / "file.bin")
        build_tree(inputs / "tree")
        sandbox = DockerSandbox([], writable=[work], image=image)
        async with sandbox:
            print(f"{load()}; median of {args.repeats}, both tools in turns")
            await compare("file.bin", inputs / "file.bin", sandbox, work, back, args.repeats)
            await compare("tree", inputs / "tree", sandbox, work, back, args.repeats)
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)


if __name__ == "__main__":
    asyncio.run(main())
