"""The sandbox against the host backend and against what peers do (`docker exec`, `docker run`).

Needs a Docker Engine and the sandbox image (built when missing)::

    python bench/sandbox.py [--only SECTION,...] [--image TAG]

``--only`` runs some sections (roundtrip, concurrent, kept, flood, workspace, coldstart) to
iterate faster; without it, all run. ``--image`` runs a given sandbox image instead of building
the checkout's (with an older checkout on ``PYTHONPATH``, to measure before and after);
``--baseline-image`` times the round trip on a second sandbox of that image (main's, say) in the
same turns, with what its processes spend per command. One run
prints, side by side (sandbox, local and bare calls are timed in turns), with the machine's load
average, since figures move 2-3x with it:
  1. ``/bin/true`` through ``execute_command``: sandbox vs LocalExecutionBackend vs a bare asyncio
     spawn of the same program vs ``docker exec`` vs ``docker run --rm`` (targets: sandbox/bare
     median <= 1.5; sandbox/local <= 1.5; sandbox >= 30x faster than ``docker exec``), the same
     sandbox's call without the command channel (``connect(..., command_channel=False)``: gRPC, what
     TCP, a service's forwarding and gVisor get) in the same turns, and the
     sandbox's call with this client pinned to the sandbox's CPU and to another, the call after a
     pause of 1.5 s (an agent's commands come seconds apart), and what the
     sandbox's processes spend per command (the server's and the spawner's CPU and sleeps, and
     the CPU of the keepers and commands the spawner reaped);
  2. cold start, DockerSandbox entered -> first command's result, median of 10 (target <= 400 ms);
  3. 200 concurrent commands in one sandbox, on gRPC in the same sandbox, and on the host backend:
     throughput and errors (target >= 400/s, 0 errors), and the CPU time the sandbox's server and
     this client spent per command (on the command channel);
  4. 10 MB and 100 MB of stdout, all of it kept, through ``execute_command``: sandbox vs local
     (target: the sandbox's throughput >= 0.8x local's; the sandbox passes the command's pipes to
     this host), and beside them the same output on the Execute stream (a backend that takes no
     pipes: what TCP and a service's forwarding get) and the same bytes written by a command in
     the sandbox into a FIFO this process reads as the host backend reads its pipes, the server's and this client's CPU
     time per MB (the local backend's too) and this client's page faults per MB; peak memory growth of the server and of this client with 100 MB kept (target:
     at most the output's size plus 20 MB each);
  5. 1 GiB of stdout under a 64 KiB cap: wall time, peak memory growth of the server and of this
     client (target < 50 MB each);
  6. ``search_files`` over 10,000 files and ``read_document`` of a 200-page PDF: sandbox/local
     (target <= 1.3).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
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
from protolink.execution.output import OutputCap, OutputCollector
from protolink.execution.output_pipes import OutputPipes
from protolink.execution.process_types import ProcessSpec
from protolink.sandbox import connect
from protolink.sandbox.docker import DockerSandbox
from protolink.sandbox.provision import ensure_image
from protolink.tools import document_tools, filesystem_tools, process_tool

ROUND_TRIPS = 200
#: Round trips after a pause, as an agent's commands come (a model's turn between them).
PAUSED_TRIPS = 10
PAUSE_SECONDS = 1.5
DOCKER_EXECS = 20
DOCKER_RUNS = 10
COLD_STARTS = 10
CONCURRENT = 200
FLOOD_BYTES = 1 << 30
CAP = 64 << 10
#: Output kept whole: (bytes, runs of each backend in turns).
KEPT = ((10_000_000, 7), (100_000_000, 3))
MAX_KEPT = 128 << 20
PAGES = 200
REPEATS = 5
ENV = {"PATH": "/usr/bin:/bin"}
SECTIONS = ("roundtrip", "concurrent", "kept", "flood", "workspace", "coldstart")


class Quiet:
    async def emit(self, type: str, **data: Any) -> None:
        return None


def agent_for(backend: Any, root: Path) -> Agent:
    agent = Agent(AgentCard(name="bench"), policy=CapabilityPolicy(default_effect="allow"))
    agent.add_tool(process_tool(backend=backend, max_output_bytes=MAX_KEPT))
    for tool in [*filesystem_tools(roots=[root], backend=backend), *document_tools(roots=[root], backend=backend)]:
        agent.add_tool(tool)
    return agent


async def true_once(agent: Agent, root: Path, **options: Any) -> Any:
    return await agent.call_tool("execute_command", argv=["/bin/true"], cwd=str(root), env=ENV, **options)


async def bare_true() -> None:
    """The floor: a bare asyncio spawn of ``/bin/true``, its output captured."""
    process = await asyncio.create_subprocess_exec("/bin/true", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    await process.communicate()


async def print_kept(agent: Agent, root: Path, size: int) -> Any:
    """``size`` bytes of stdout, every byte kept."""
    result = await agent.call_tool("execute_command", argv=["/usr/bin/head", "-c", str(size), "/dev/zero"],
                                   cwd=str(root), env=ENV, max_output_bytes=size, timeout_seconds=120)
    assert len(result.stdout) == size and not result.truncated, (len(result.stdout), result.truncated)
    return result


async def print_to_host(backend: Any, root: Path, size: int) -> None:
    """``size`` bytes written by a command in the sandbox into a FIFO in the workspace, read and
    kept here as the host backend reads and keeps its pipes: what output kept whole would cost
    with the sandbox's server out of its path (the command's pipe read by the host itself)."""
    fifo = root / "kept.fifo"
    if not fifo.exists():
        os.mkfifo(fifo)
        os.chmod(fifo, 0o666)
    spec = ProcessSpec(("/bin/sh", "-c", f"exec /usr/bin/head -c {size} /dev/zero > {fifo}"), str(root), ENV, 120, 0)
    writing = asyncio.ensure_future(backend.execute(spec, Quiet()))
    opening = asyncio.ensure_future(asyncio.to_thread(os.open, fifo, os.O_RDONLY))
    await asyncio.wait((writing, opening), return_when=asyncio.FIRST_COMPLETED)
    if not opening.done():  # the command ended without opening it: release the reader's open
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        os.close(await opening)
        raise RuntimeError(f"the command did not write to the FIFO: {writing.result()}")
    collector = OutputCollector(Quiet())
    pipes = OutputPipes({opening.result(): "stdout"}, OutputCap(size), collector)
    pipes.drain()
    await pipes.closed
    pipes.close()
    await pipes.delivered()
    await collector.finish()
    result = await writing
    assert result.exit_code == 0 and len(collector.stdout) == size, (result, len(collector.stdout))


async def concurrent_rate(agent: Agent, root: Path) -> tuple[float, int]:
    """Commands per second with CONCURRENT ``/bin/true`` at once, and how many failed."""
    started = time.perf_counter()
    outcomes = await asyncio.gather(*(true_once(agent, root) for _ in range(CONCURRENT)), return_exceptions=True)
    wall = time.perf_counter() - started
    errors = sum(1 for item in outcomes if isinstance(item, BaseException) or item.exit_code != 0)
    return CONCURRENT / wall, errors


async def paused_medians(count: int, *calls: Callable[[], Awaitable[Any]]) -> list[float]:
    """:func:`medians_of`, each call made after a pause of PAUSE_SECONDS (not timed)."""
    timings: list[list[float]] = [[] for _ in calls]
    for _ in range(count):
        for call, times in zip(calls, timings):
            await asyncio.sleep(PAUSE_SECONDS)
            await timed(call, times)
    return [statistics.median(times) for times in timings]


def load() -> str:
    return "load " + " ".join(f"{figure:.1f}" for figure in os.getloadavg())


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


async def peak_growth(sandbox: DockerSandbox, call: Callable[[], Awaitable[Any]]) -> tuple[int, int]:
    """Bytes by which ``call`` raised the peak resident memory of the sandbox's server (its
    largest process) and of this client, above what each held before."""
    servers = server_pids(sandbox)
    for pid in [*servers, "self"]:
        reset_peak(pid)
    server_before = {pid: rss_kib(pid, "VmRSS") for pid in servers}
    client_before = rss_kib("self", "VmRSS")
    await call()
    server_growth = max(rss_kib(pid, "VmHWM") - before for pid, before in server_before.items()
                        if Path(f"/proc/{pid}").exists())
    return server_growth * 1024, (rss_kib("self", "VmHWM") - client_before) * 1024


def sandbox_processes(sandbox: DockerSandbox) -> dict[str, str]:
    """Host pids of the sandbox's long-lived processes by name (the server ``python``, the
    spawner ``protolink-spawn``, the init ``tini``): of a name, the one whose parent has
    another (a spawner's keepers, forks of it, have its name); the last of those wins."""
    with container_of(sandbox) as container:
        top = container.top(ps_args="-eo pid,ppid,comm")
    names = {pid: name for pid, _, name in top["Processes"]}
    return {name: pid for pid, parent, name in top["Processes"] if names.get(parent) != name}


def process_use(pid: str) -> tuple[float, float, int]:
    """Process ``pid``'s CPU seconds, its reaped children's CPU seconds (a spawner's keepers
    and the commands they reaped), and how often its threads slept (voluntary context switches:
    each is a wakeup; preemptions, which follow the machine's load, are left out)."""
    fields = stat_fields(pid)
    tick = os.sysconf("SC_CLK_TCK")
    sleeps = sum(int(line.split()[1]) for task in Path(f"/proc/{pid}/task").iterdir()
                 for line in (task / "status").read_text().splitlines()
                 if line.startswith("voluntary_ctxt_switches"))
    return (int(fields[11]) + int(fields[12])) / tick, (int(fields[13]) + int(fields[14])) / tick, sleeps


async def use_per_call(count: int, call: Callable[[], Awaitable[Any]], pids: dict[str, str]) -> dict[str, list[float]]:
    """What each process of ``pids`` spent per call of ``call``, over ``count`` calls in a row:
    its CPU ms, its reaped children's CPU ms and its sleeps."""
    before = {name: process_use(pid) for name, pid in pids.items()}
    for _ in range(count):
        await call()
    return {name: [(after - earlier) * scale / count
                   for after, earlier, scale in zip(process_use(pid), before[name], (1e3, 1e3, 1))]
            for name, pid in pids.items()}


def stat_fields(pid: str) -> list[str]:
    """The fields of ``/proc/PID/stat`` after the command's name (``utime`` is index 11)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_seconds(pids: list[str]) -> float:
    """The CPU time (user and system) the processes ``pids`` have used; one that has exited counts none."""
    ticks = 0
    for pid in pids:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            fields = stat_fields(pid)
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """The CPU time the processes ``servers`` (a sandbox's server, or none) and this client spend
    in the calls :meth:`of` wraps, and the page faults this client takes in them: less scattered
    than wall time on a shared machine."""

    def __init__(self, servers: list[str]) -> None:
        self._servers = servers
        self.server = self.client = 0.0
        self.faults = 0

    def of(self, call: Callable[[], Awaitable[Any]]) -> Callable[[], Awaitable[Any]]:
        async def measured() -> Any:
            server, client = cpu_seconds(self._servers), time.process_time()
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            try:
                return await call()
            finally:
                self.server += cpu_seconds(self._servers) - server
                self.client += time.process_time() - client
                self.faults += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
        return measured


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


async def baseline_rows(baseline: DockerSandbox, based: Agent, sandbox: DockerSandbox, boxed: Agent, root: Path) -> None:
    """The round trip on the baseline image's sandbox and on this one, in turns with a bare spawn,
    and what each sandbox's processes spend per command."""
    base_true, box_true, bare = await medians_of(ROUND_TRIPS, lambda: true_once(based, root),
                                                 lambda: true_once(boxed, root), bare_true)
    row("  baseline image, this, bare (in turns)", f"{base_true * 1e3:.2f} ms", f"{box_true * 1e3:.2f} ms",
        f"{bare * 1e3:.2f} ms")
    row("    sandbox/bare: baseline, this", f"{base_true / bare:.2f}", f"{box_true / bare:.2f}")
    paused_base, paused_box, paused_bare = await paused_medians(
        PAUSED_TRIPS, lambda: true_once(based, root), lambda: true_once(boxed, root), bare_true)
    row(f"    after a {PAUSE_SECONDS:g} s pause, /bare: baseline, this", f"{paused_base / paused_bare:.2f}",
        f"{paused_box / paused_bare:.2f}")
    for label, box, agent in (("baseline", baseline, based), ("this", sandbox, boxed)):
        processes = sandbox_processes(box)
        use = await use_per_call(ROUND_TRIPS, lambda: true_once(agent, root),
                                 {name: processes[name] for name in ("python", "protolink-spawn")})
        row(f"    {label}: server CPU, sleeps; spawner; keepers+cmds", f"{use['python'][0]:.2f} ms",
            f"{use['python'][2]:.1f}", f"{use['protolink-spawn'][0]:.2f} ms", f"{use['protolink-spawn'][1]:.2f} ms")
    print(f"    {load()}")


def row(label: str, *cells: str) -> None:
    print(f"{label:<44}" + "".join(f"{cell:>18}" for cell in cells))


async def main(sections: set[str], image: str | None = None, baseline_image: str | None = None) -> None:
    image = image or await asyncio.to_thread(ensure_image)
    with tempfile.TemporaryDirectory(prefix="protolink-bench-") as temporary:
        root = Path(temporary).resolve()
        os.chmod(root, 0o755)
        if "workspace" in sections:
            (root / "tree").mkdir()
            build_tree(root / "tree")
            make_pdf(root / "report.pdf")
        local = agent_for(LocalExecutionBackend(), root)

        print(f"sandbox image {image}; {os.cpu_count()} CPUs\n")
        sandbox = DockerSandbox([root], image=image)
        baseline = DockerSandbox([root], image=baseline_image) if baseline_image else None
        async with sandbox as backend, await connect(sandbox.address, command_channel=False) as grpc_backend, \
                baseline if baseline is not None else contextlib.nullcontext() as baseline_backend:
            boxed = agent_for(backend, root)
            on_grpc = agent_for(grpc_backend, root)  # the same sandbox without the command channel

            if "roundtrip" in sections:
                # 1. Round trip.
                print(load())
                box_true, grpc_true, local_true, bare = await medians_of(
                    ROUND_TRIPS, lambda: true_once(boxed, root), lambda: true_once(on_grpc, root),
                    lambda: true_once(local, root), bare_true)
                docker_exec = await asyncio.to_thread(median_blocking, DOCKER_EXECS,
                                                      ["docker", "exec", sandbox.name, "/bin/true"])
                docker_run = await asyncio.to_thread(median_blocking, DOCKER_RUNS,
                                                     ["docker", "run", "--rm", "--network", "none",
                                                      "--entrypoint", "/bin/true", image])
                row("/bin/true via execute_command (median)", "sandbox", "local", "bare asyncio", "docker exec",
                    "docker run --rm")
                row("", f"{box_true * 1e3:.2f} ms", f"{local_true * 1e3:.2f} ms", f"{bare * 1e3:.2f} ms",
                    f"{docker_exec * 1e3:.1f} ms", f"{docker_run * 1e3:.0f} ms")
                row("  sandbox/bare (target <= 1.5)", f"{box_true / bare:.2f}")
                row("  the same sandbox on gRPC, its /bare", f"{grpc_true * 1e3:.2f} ms", f"{grpc_true / bare:.2f}")
                row("  sandbox/local (target <= 1.5), local/bare", f"{box_true / local_true:.2f}",
                    f"{local_true / bare:.2f}")
                if baseline is not None:
                    await baseline_rows(baseline, agent_for(baseline_backend, root), sandbox, boxed, root)
                row("  docker exec/sandbox (target >= 30)", f"{docker_exec / box_true:.0f}x")
                row("  docker run --rm/sandbox", f"{docker_run / box_true:.0f}x")
                spec = ProcessSpec(("/bin/true",), str(root), ENV, 60, 65536)
                box_raw, local_raw = await medians_of(ROUND_TRIPS, lambda: backend.execute(spec, Quiet()),
                                                      lambda: LocalExecutionBackend().execute(spec, Quiet()))
                row("  backend.execute alone: sandbox, local", f"{box_raw * 1e3:.2f} ms", f"{local_raw * 1e3:.2f} ms",
                    f"ratio {box_raw / local_raw:.2f}")
                boxed_cpus = sandbox_cpus(sandbox)
                if boxed_cpus and (other_cpus := os.sched_getaffinity(0) - boxed_cpus):
                    same, other = await pinned_medians(ROUND_TRIPS, lambda: true_once(boxed, root), boxed_cpus,
                                                       other_cpus)
                    row("  this client on the sandbox's CPU, on another", f"{same * 1e3:.2f} ms",
                        f"{other * 1e3:.2f} ms")
                paused_box, paused_bare = await paused_medians(PAUSED_TRIPS, lambda: true_once(boxed, root), bare_true)
                row(f"  after a {PAUSE_SECONDS:g} s pause: sandbox, bare", f"{paused_box * 1e3:.2f} ms",
                    f"{paused_bare * 1e3:.2f} ms", f"ratio {paused_box / paused_bare:.2f}")
                processes = sandbox_processes(sandbox)
                use = await use_per_call(ROUND_TRIPS, lambda: true_once(boxed, root),
                                         {name: processes[name] for name in ("python", "protolink-spawn")})
                server, _, server_sleeps = use["python"]
                spawner, children, spawner_sleeps = use["protolink-spawn"]
                row("  per command: server CPU, sleeps", f"{server:.2f} ms", f"{server_sleeps:.1f}")
                row("  spawner CPU, sleeps; keepers+commands", f"{spawner:.2f} ms", f"{spawner_sleeps:.1f}",
                    f"{children:.2f} ms")

            if "concurrent" in sections:
                # 3. Concurrency, in turns with the host backend.
                await concurrent_rate(boxed, root)  # warm
                await concurrent_rate(on_grpc, root)
                rates: dict[str, list[float]] = {"sandbox": [], "gRPC": [], "local": [], "baseline": []}
                errors = 0
                meter = CpuMeter(server_pids(sandbox))
                bursts = [("sandbox", meter.of(lambda: concurrent_rate(boxed, root))),
                          ("gRPC", lambda: concurrent_rate(on_grpc, root)),
                          ("local", lambda: concurrent_rate(local, root))]
                if baseline is not None:
                    based = agent_for(baseline_backend, root)
                    await concurrent_rate(based, root)  # warm
                    bursts.append(("baseline", lambda: concurrent_rate(based, root)))
                for _ in range(REPEATS):
                    for name, burst in bursts:
                        rate, failed = await burst()
                        rates[name].append(rate)
                        errors += failed
                box_rate, grpc_rate, local_rate = (statistics.median(rates[name]) for name in ("sandbox", "gRPC", "local"))
                print()
                print(load())
                row(f"{CONCURRENT} concurrent /bin/true (median of {REPEATS})", "sandbox", "local", "sandbox/local")
                row("", f"{box_rate:.0f}/s", f"{local_rate:.0f}/s", f"{box_rate / local_rate:.2f}")
                row("  the same sandbox on gRPC", f"{grpc_rate:.0f}/s", "", f"{grpc_rate / local_rate:.2f}")
                if rates["baseline"]:
                    base_rate = statistics.median(rates["baseline"])
                    row("  the baseline image's sandbox", f"{base_rate:.0f}/s", "", f"{base_rate / local_rate:.2f}")
                row("  errors (target 0); target", f"{errors}", "", ">= 400/s")
                commands = CONCURRENT * REPEATS
                row("  CPU per command: server, this client", f"{meter.server / commands * 1e3:.2f} ms",
                    f"{meter.client / commands * 1e3:.2f} ms")

            if "kept" in sections:
                # 4. Memory with 100 MB kept (the server's first large output: what it keeps of its
                # heap afterwards counts), then output kept whole, in turns with the host backend.
                print()
                print(load())
                size = KEPT[-1][0]
                server_growth, client_growth = await peak_growth(sandbox, lambda: print_kept(boxed, root, size))
                row(f"peak memory growth, {size // 1_000_000} MB kept: server, client", f"{server_growth / 1e6:.1f} MB",
                    f"{client_growth / 1e6:.1f} MB")
                row("  target", f"<= {(size + 20_000_000) / 1e6:.0f} MB", f"<= {(size + 20_000_000) / 1e6:.0f} MB")
                row("stdout kept whole via execute_command", "sandbox", "local", "sandbox/local")
                async with await connect(sandbox.address, token=sandbox.token, output_pipes=False) as streaming:
                    streamed = agent_for(streaming, root)
                    for size, runs in KEPT:
                        meter, stream_meter, local_meter = (CpuMeter(server_pids(sandbox)),
                                                            CpuMeter(server_pids(sandbox)), CpuMeter([]))
                        box_kept, stream_kept, local_kept, piped = await medians_of(
                            runs, meter.of(lambda: print_kept(boxed, root, size)),
                            stream_meter.of(lambda: print_kept(streamed, root, size)),
                            local_meter.of(lambda: print_kept(local, root, size)),
                            lambda: print_to_host(backend, root, size))
                        row(f"  {size // 1_000_000} MB (median of {runs})", f"{box_kept:.3f} s", f"{local_kept:.3f} s",
                            f"{box_kept / local_kept:.2f}")
                        row("    throughput (target: sandbox >= 0.8x local)", f"{size / 1e6 / box_kept:.0f} MB/s",
                            f"{size / 1e6 / local_kept:.0f} MB/s", f"{local_kept / box_kept:.2f}x")
                        row("    the output on the Execute stream (no pipes)", f"{size / 1e6 / stream_kept:.0f} MB/s",
                            "", f"{local_kept / stream_kept:.2f}x")
                        row("    the command's FIFO read by this host", f"{size / 1e6 / piped:.0f} MB/s", "",
                            f"{local_kept / piped:.2f}x")
                        megabytes = size / 1e6 * (runs + 1)  # the warming call is measured too
                        row("    CPU per MB: server, this client; local", f"{meter.server / megabytes * 1e3:.2f} ms",
                            f"{meter.client / megabytes * 1e3:.2f} ms",
                            f"{local_meter.client / megabytes * 1e3:.2f} ms")
                        row("    the same on the Execute stream", f"{stream_meter.server / megabytes * 1e3:.2f} ms",
                            f"{stream_meter.client / megabytes * 1e3:.2f} ms")
                        # Growing the result's string faults in 244 pages per MB, unless the heap still
                        # holds those of a result before: glibc serves blocks under 32 MiB from its heap
                        # once one that size was freed, so 10 MB runs may take none on either side.
                        row("    client page faults per MB: sandbox, local", f"{meter.faults / megabytes:.0f}",
                            f"{local_meter.faults / megabytes:.0f}")

            if "flood" in sections:
                # 5. Flood.
                flooded: list[Any] = []

                async def flood() -> None:
                    flooded.append(await boxed.call_tool(
                        "execute_command", argv=["/usr/bin/head", "-c", str(FLOOD_BYTES), "/dev/zero"], cwd=str(root),
                        env=ENV, max_output_bytes=CAP, timeout_seconds=120))

                started = time.perf_counter()
                server_growth, client_growth = await peak_growth(sandbox, flood)
                wall = time.perf_counter() - started
                print()
                row("1 GiB stdout, 64 KiB cap", f"{wall:.2f} s", f"kept {len(flooded[0].stdout)} B",
                    f"truncated={flooded[0].truncated}")
                row("  peak memory growth: server, client", f"{server_growth / 1e6:.1f} MB",
                    f"{client_growth / 1e6:.1f} MB")
                row("  target", "< 50 MB", "< 50 MB")

            if "workspace" in sections:
                # 6. Workspace and documents.
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
                row(f"read_document, {PAGES}-page PDF (median)", f"{box_read * 1e3:.0f} ms",
                    f"{local_read * 1e3:.0f} ms",
                    f"{box_read / local_read:.2f}")
                row("  target", "", "", "<= 1.3")

        if "coldstart" in sections:
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


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(SECTIONS),
                        help=f"comma-separated sections to run, of: {', '.join(SECTIONS)}")
    parser.add_argument("--image", help="a sandbox image to use instead of the checkout's (to measure an older one)")
    parser.add_argument("--baseline-image", help="a sandbox image whose round trip is timed beside this one's")
    parsed = parser.parse_args()
    parsed.only = set(parsed.only.split(","))
    if unknown := parsed.only - set(SECTIONS):
        parser.error(f"unknown sections: {', '.join(sorted(unknown))}")
    return parsed


if __name__ == "__main__":
    asked = arguments()
    asyncio.run(main(asked.only, asked.image, asked.baseline_image))
