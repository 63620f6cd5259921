"""The sandbox against the host backend and against what peers do (`docker exec`, `docker run`).

Needs a Docker Engine and the sandbox image (built when missing)::

    python bench/sandbox.py

One run prints, side by side (sandbox and local calls are timed in turns):
  1. ``/bin/true`` through ``execute_command``: sandbox vs LocalExecutionBackend vs ``docker exec``
     vs ``docker run --rm`` (targets: sandbox/local median <= 1.5; sandbox >= 30x faster than
     ``docker exec``), and the sandbox's call with this client pinned to the sandbox's CPU and
     to another;
  2. cold start, DockerSandbox entered -> first command's result, median of 10 (target <= 400 ms);
  3. 200 concurrent commands in one sandbox: throughput and errors (target >= 400/s, 0 errors);
  4. 1 GiB of stdout under a 64 KiB cap: wall time, peak memory growth of the server and of this
     client (target < 50 MB each);
  5. ``search_files`` over 10,000 files and ``read_document`` of a 200-page PDF: sandbox/local
     (target <= 1.3).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

from search import build_tree

from protolink import Agent, AgentCard, CapabilityPolicy
from protolink.execution.local import LocalExecutionBackend
from protolink.execution.process_types import ProcessSpec
from protolink.sandbox.docker import DockerSandbox
from protolink.sandbox.provision import ensure_image
from protolink.tools import document_tools, filesystem_tools, process_tool

ROUND_TRIPS = 200
DOCKER_EXECS = 20
DOCKER_RUNS = 10
COLD_STARTS = 10
CONCURRENT = 200
FLOOD_BYTES = 1 << 30
CAP = 64 << 10
PAGES = 200
REPEATS = 5
ENV = {"PATH": "/usr/bin:/bin"}


class Quiet:
    async def emit(self, type: str, **data: Any) -> None:
        return None


def agent_for(backend: Any, root: Path) -> Agent:
    agent = Agent(AgentCard(name="bench"), policy=CapabilityPolicy(default_effect="allow"))
    agent.add_tool(process_tool(backend=backend))
    for tool in [*filesystem_tools(roots=[root], backend=backend), *document_tools(roots=[root], backend=backend)]:
        agent.add_tool(tool)
    return agent


async def true_once(agent: Agent, root: Path, **options: Any) -> Any:
    return await agent.call_tool("execute_command", argv=["/bin/true"], cwd=str(root), env=ENV, **options)


async def timed(call: Callable[[], Awaitable[Any]], times: list[float]) -> None:
    """Await ``call()`` and append how long it took to ``times``."""
    started = time.perf_counter()
    await call()
    times.append(time.perf_counter() - started)


async def medians_of(count: int, *calls: Callable[[], Awaitable[Any]]) -> list[float]:
    """The median time of each call, the calls taking turns (each sees the machine as the others do)."""
    for call in calls:
        await call()  # warm
    timings: list[list[float]] = [[] for _ in calls]
    for _ in range(count):
        for call, times in zip(calls, timings):
            await timed(call, times)
    return [statistics.median(times) for times in timings]


def median_blocking(count: int, argv: list[str]) -> float:
    timings = []
    for _ in range(count):
        started = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
        timings.append(time.perf_counter() - started)
    return statistics.median(timings)


def rss_kib(pid: int | str, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise LookupError(field)


def reset_peak(pid: int | str) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS


@contextlib.contextmanager
def container_of(sandbox: DockerSandbox) -> Iterator[Any]:
    """The sandbox's container, through a Docker client of its own."""
    import docker

    client = docker.from_env()
    try:
        yield client.containers.get(sandbox.container_id)
    finally:
        client.close()


def server_pids(sandbox: DockerSandbox) -> list[str]:
    """Host pids of the container's uid-0 processes (the server, its init and its workers)."""
    with container_of(sandbox) as container:
        top = container.top(ps_args="-eo pid,uid")
    return [pid for pid, uid in top["Processes"] if uid == "0"]


def sandbox_cpus(sandbox: DockerSandbox) -> set[int]:
    """The CPUs of the sandbox's cpuset (empty when it has none)."""
    with container_of(sandbox) as container:
        cpuset = container.attrs["HostConfig"]["CpusetCpus"]
    return {int(cpu) for cpu in cpuset.split(",")} if cpuset else set()


async def pinned_medians(count: int, call: Callable[[], Awaitable[Any]], *placements: set[int]) -> list[float]:
    """The median time of ``call`` with this process pinned to each set of CPUs in turn."""
    everywhere = os.sched_getaffinity(0)
    timings: list[list[float]] = [[] for _ in placements]
    try:
        for _ in range(count // 50):
            for cpus, times in zip(placements, timings):
                os.sched_setaffinity(0, cpus)
                await call()
                for _ in range(50):
                    await timed(call, times)
    finally:
        os.sched_setaffinity(0, everywhere)
    return [statistics.median(times) for times in timings]


def make_pdf(path: Path) -> None:
    from reportlab.lib.pagesizes import A4
    from reportlab.pdfgen import canvas

    pdf = canvas.Canvas(str(path), pagesize=A4)
    for page in range(PAGES):
        for line in range(40):
            pdf.drawString(40, 800 - line * 19, f"page {page + 1} line {line + 1}: the sandbox keeps documents apart")
        pdf.showPage()
    pdf.save()


def row(label: str, *cells: str) -> None:
    print(f"{label:<44}" + "".join(f"{cell:>18}" for cell in cells))


async def main() -> None:
    image = await asyncio.to_thread(ensure_image)
    with tempfile.TemporaryDirectory(prefix="protolink-bench-") as temporary:
        root = Path(temporary).resolve()
        os.chmod(root, 0o755)
        (root / "tree").mkdir()
        build_tree(root / "tree")
        make_pdf(root / "report.pdf")
        local = agent_for(LocalExecutionBackend(), root)

        print(f"sandbox image {image}; {os.cpu_count()} CPUs\n")
        sandbox = DockerSandbox([root], image=image)
        async with sandbox as backend:
            boxed = agent_for(backend, root)

            # 1. Round trip.
            box_true, local_true = await medians_of(ROUND_TRIPS, lambda: true_once(boxed, root),
                                                    lambda: true_once(local, root))
            docker_exec = await asyncio.to_thread(median_blocking, DOCKER_EXECS,
                                                  ["docker", "exec", sandbox.name, "/bin/true"])
            docker_run = await asyncio.to_thread(median_blocking, DOCKER_RUNS,
                                                 ["docker", "run", "--rm", "--network", "none",
                                                  "--entrypoint", "/bin/true", image])
            row("/bin/true via execute_command (median)", "sandbox", "local", "docker exec", "docker run --rm")
            row("", f"{box_true * 1e3:.2f} ms", f"{local_true * 1e3:.2f} ms", f"{docker_exec * 1e3:.1f} ms",
                f"{docker_run * 1e3:.0f} ms")
            row("  sandbox/local (target <= 1.5)", f"{box_true / local_true:.2f}")
            row("  docker exec/sandbox (target >= 30)", f"{docker_exec / box_true:.0f}x")
            row("  docker run --rm/sandbox", f"{docker_run / box_true:.0f}x")
            spec = ProcessSpec(("/bin/true",), str(root), ENV, 60, 65536)
            box_raw, local_raw = await medians_of(ROUND_TRIPS, lambda: backend.execute(spec, Quiet()),
                                                  lambda: LocalExecutionBackend().execute(spec, Quiet()))
            row("  backend.execute alone: sandbox, local", f"{box_raw * 1e3:.2f} ms", f"{local_raw * 1e3:.2f} ms",
                f"ratio {box_raw / local_raw:.2f}")
            boxed_cpus = sandbox_cpus(sandbox)
            if boxed_cpus and (other_cpus := os.sched_getaffinity(0) - boxed_cpus):
                same, other = await pinned_medians(ROUND_TRIPS, lambda: true_once(boxed, root), boxed_cpus, other_cpus)
                row("  this client on the sandbox's CPU, on another", f"{same * 1e3:.2f} ms", f"{other * 1e3:.2f} ms")

            # 3. Concurrency.
            started = time.perf_counter()
            outcomes = await asyncio.gather(*(true_once(boxed, root) for _ in range(CONCURRENT)),
                                            return_exceptions=True)
            wall = time.perf_counter() - started
            errors = sum(1 for item in outcomes if isinstance(item, BaseException) or item.exit_code != 0)
            print()
            row(f"{CONCURRENT} concurrent /bin/true in one sandbox", f"{CONCURRENT / wall:.0f}/s", f"{errors} errors")
            row("  target", ">= 400/s", "0 errors")

            # 4. Flood.
            servers = server_pids(sandbox)
            for pid in [*servers, "self"]:
                reset_peak(pid)
            server_before = {pid: rss_kib(pid, "VmRSS") for pid in servers}
            client_before = rss_kib("self", "VmRSS")
            started = time.perf_counter()
            flood = await boxed.call_tool("execute_command", argv=["/usr/bin/head", "-c", str(FLOOD_BYTES), "/dev/zero"],
                                          cwd=str(root), env=ENV, max_output_bytes=CAP, timeout_seconds=120)
            wall = time.perf_counter() - started
            server_growth = max(rss_kib(pid, "VmHWM") - before for pid, before in server_before.items()
                                if Path(f"/proc/{pid}").exists())
            client_growth = rss_kib("self", "VmHWM") - client_before
            print()
            row("1 GiB stdout, 64 KiB cap", f"{wall:.2f} s", f"kept {len(flood.stdout)} B",
                f"truncated={flood.truncated}")
            row("  peak memory growth: server, client", f"{server_growth / 1024:.1f} MB", f"{client_growth / 1024:.1f} MB")
            row("  target", "< 50 MB", "< 50 MB")

            # 5. Workspace and documents.
            async def search(agent: Agent) -> Any:
                return await agent.call_tool("search_files", path=str(root / "tree"), query="Quokka")

            async def read(agent: Agent) -> Any:
                return await agent.call_tool("read_document", path=str(root / "report.pdf"))

            box_search, local_search = await medians_of(REPEATS, lambda: search(boxed), lambda: search(local))
            box_read, local_read = await medians_of(REPEATS, lambda: read(boxed), lambda: read(local))
            print()
            row("", "sandbox", "local", "sandbox/local")
            row("search_files, 10,000 files (median)", f"{box_search * 1e3:.0f} ms", f"{local_search * 1e3:.0f} ms",
                f"{box_search / local_search:.2f}")
            row(f"read_document, {PAGES}-page PDF (median)", f"{box_read * 1e3:.0f} ms", f"{local_read * 1e3:.0f} ms",
                f"{box_read / local_read:.2f}")
            row("  target", "", "", "<= 1.3")

        # 2. Cold start.
        timings = []
        for _ in range(COLD_STARTS):
            started = time.perf_counter()
            async with DockerSandbox([root], image=image) as backend:
                await true_once(agent_for(backend, root), root)
                timings.append(time.perf_counter() - started)
        print()
        row(f"cold start -> first result (median of {COLD_STARTS})", f"{statistics.median(timings) * 1e3:.0f} ms",
            f"min {min(timings) * 1e3:.0f} ms", f"max {max(timings) * 1e3:.0f} ms")
        row("  target", "<= 400 ms")


if __name__ == "__main__":
    asyncio.run(main())
