"""The sandbox service: warm and cold creates, idle sandboxes' memory, and many clients at once.

Needs a Docker Engine and the sandbox image (built when missing)::

    python bench/service.py [--runs 10] [--cold 5] [--idle 20] [--clients 20] [--commands 10] [--only SECTION,...]

It starts a service of its own (a process, in a temporary runtime directory, its default
template pooled) and removes it and everything it made at the end. In one run:

1. create from the warm pool, entered -> first command's result (``/bin/true``), median of
   ``--runs`` (target <= 10 ms), split into the create and the first command, beside a second
   command;
2. cold create (a label makes it skip the pool) -> first command's result against
   ``docker run --rm IMAGE true``, ``--cold`` times in turns, medians (target <= 1.3x), and
   each turn's ratio;
3. ``--idle`` idle sandboxes (``--idle 100`` for the full figure): memory per sandbox, the PSS
   of all of its processes (engine overhead apart; its anonymous part too), and the service's
   own growth per sandbox (target <= 25 MB together); their CPU over 5 s (target: about zero);
4. ``--clients`` clients at once, each with its own connection, creating a sandbox and running
   ``--commands`` commands: errors, commands per second, the 99th percentile of a command's
   latency;
5. 10 MB and 100 MB of stdout kept whole via ``execute_command`` in a sandbox of the service
   (bench/sandbox.py's case, through the service's forwarding) against the host backend, in
   turns: throughput ratio, and the CPU the service and this client spend per MB.

``--only`` runs some of the sections (warm, cold, idle, clients, kept).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from sandbox import KEPT, CpuMeter, agent_for, medians_of, print_kept

from protolink.execution.local import LocalExecutionBackend
from protolink.execution.process_types import ProcessSpec
from protolink.sandbox import engine
from protolink.sandbox.provision import ensure_image
from protolink.sandbox.service.client import Sandbox, ServiceClient, connect
from protolink.sandbox.service.files import ServiceFiles
from protolink.sandbox.service.process import remove_everything
from protolink.sandbox.usage import cgroup_dir, pids_in

TRUE = ProcessSpec(("/bin/true",), "/tmp", {"PATH": "/usr/bin:/bin"}, 30, 1 << 16)
COLD = {"bench": "cold"}
POOL = 2
SECTIONS = ("warm", "cold", "idle", "clients", "kept")


class _Silent:
    async def emit(self, type: str, **data: Any) -> None:
        return None


def row(label: str, *cells: str) -> None:
    print(f"{label:<52}" + "".join(f"{cell:>16}" for cell in cells))


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def load() -> str:
    return "load average: " + " ".join(f"{value:.2f}" for value in os.getloadavg())


async def first_result(client: ServiceClient, **options: Any) -> tuple[float, Sandbox]:
    started = time.perf_counter()
    sandbox = await client.create(**options)
    result = await sandbox.backend.execute(TRUE, _Silent())
    took = time.perf_counter() - started
    assert result.exit_code == 0, result
    return took, sandbox


async def pool_full(client: ServiceClient) -> None:
    deadline = time.monotonic() + 300
    while (await client.pool_ready()).get("default", 0) < POOL:
        if time.monotonic() > deadline:
            raise TimeoutError("the pool did not fill in 300 s")
        await asyncio.sleep(0.05)


async def warm(client: ServiceClient, runs: int) -> tuple[float, float, float, float]:
    """Medians of: create -> first result, the create alone, the first command, the second."""
    times = []
    for _ in range(runs):
        await pool_full(client)
        started = time.perf_counter()
        sandbox = await client.create()
        created = time.perf_counter()
        first = await sandbox.backend.execute(TRUE, _Silent())
        ran = time.perf_counter()
        second = await sandbox.backend.execute(TRUE, _Silent())
        assert sandbox.status.pooled and first.exit_code == second.exit_code == 0
        times.append((ran - started, created - started, ran - created, time.perf_counter() - ran))
        await sandbox.delete()
    total, create, first_command, second_command = (statistics.median(column) for column in zip(*times))
    return total, create, first_command, second_command


def docker_run(image: str) -> float:
    started = time.perf_counter()
    subprocess.run(["docker", "run", "--rm", "--network", "none", "--entrypoint", "/bin/true", image], check=True,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


async def cold(client: ServiceClient, image: str, runs: int) -> tuple[float, float, list[float]]:
    """Medians of a cold create -> first result and of ``docker run --rm``, in turns; and each
    turn's ratio of the two."""
    ours, theirs = [], []
    for _ in range(runs):
        took, sandbox = await first_result(client, labels=COLD)
        ours.append(took)
        await sandbox.delete()
        theirs.append(await asyncio.to_thread(docker_run, image))
    return statistics.median(ours), statistics.median(theirs), [a / b for a, b in zip(ours, theirs)]


def pss(pid: int, field: str = "Pss") -> int:
    """Proportional set size of ``pid`` in bytes (0 once it is gone); ``Pss_Anon``: of its
    anonymous memory alone (not the image's files, which sandboxes share)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def cpu_seconds(pid: int) -> float:
    """CPU time of ``pid``'s cgroup (v1 cpuacct, or v2 cpu.stat)."""
    try:
        return int((cgroup_dir(pid, "cpuacct") / "cpuacct.usage").read_text()) / 1e9
    except (LookupError, FileNotFoundError):
        stat = (cgroup_dir(pid, "cpu") / "cpu.stat").read_text()
        return int(next(line.split()[1] for line in stat.splitlines() if line.startswith("usage_usec"))) / 1e6


async def idle(client: ServiceClient, service_pid: int, count: int) -> tuple[float, float, float, float]:
    """Memory per idle sandbox (its processes' PSS), the same of anonymous memory alone, the
    service's growth per sandbox, and the CPU seconds all of them used in 5 s."""
    before = pss(service_pid)
    sandboxes: list[Sandbox] = []
    for start in range(0, count, 4):
        sandboxes += await asyncio.gather(*(client.create(labels=COLD) for _ in range(start, min(count, start + 4))))
    for sandbox in sandboxes:
        await sandbox.backend.execute(TRUE, _Silent())
    await asyncio.sleep(2)  # what started them settles
    docker = engine.client()
    try:
        pids = [docker.api.inspect_container(name)["State"]["Pid"]
                for name in (c["Id"] for c in docker.api.containers(filters={"label": "io.protolink.label.bench=cold"}))]
    finally:
        docker.close()
    processes = [pid for first in pids for pid in pids_in(first)]
    memory = sum(pss(pid) for pid in processes) / len(pids)
    anonymous = sum(pss(pid, "Pss_Anon") for pid in processes) / len(pids)
    growth = (pss(service_pid) - before) / count
    cpu_before = sum(cpu_seconds(pid) for pid in pids)
    await asyncio.sleep(5)
    cpu = sum(cpu_seconds(pid) for pid in pids) - cpu_before
    for sandbox in sandboxes:
        await sandbox.delete()
    return memory, anonymous, growth, cpu


async def clients_at_once(address: str, token: str, clients: int, commands: int) -> tuple[int, float, float, float]:
    """Errors, commands per second over the whole run (creates included) and over the span
    in which commands ran, and the 99th percentile of a command's latency."""
    latencies: list[float] = []
    spans: list[float] = []
    errors = 0

    async def one() -> None:
        nonlocal errors
        try:
            client = await connect(address, token, timeout=60)
            async with client, await client.create() as sandbox:
                for _ in range(commands):
                    started = time.perf_counter()
                    await sandbox.backend.execute(TRUE, _Silent())
                    latencies.append(time.perf_counter() - started)
                    spans.extend((started, time.perf_counter()))
        except Exception as error:
            errors += 1
            print(f"  client failed: {type(error).__name__}: {error}", file=sys.stderr)

    started = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(clients)))
    wall = time.perf_counter() - started
    p99 = statistics.quantiles(latencies, n=100)[98] if len(latencies) >= 2 else float("nan")
    running = max(spans) - min(spans) if spans else float("nan")
    return errors, len(latencies) / wall, len(latencies) / running, p99


async def kept_output(client: ServiceClient, service_pid: int) -> None:
    """Section 5: output kept whole through the service, in turns with the host backend."""
    sandbox = await client.create(workspace=True)
    workspace = Path(sandbox.status.workspace)
    try:
        with tempfile.TemporaryDirectory(prefix="pl-bench-kept-") as local_root:
            boxed = agent_for(sandbox.backend, workspace)
            local = agent_for(LocalExecutionBackend(), Path(local_root))
            for size, runs in KEPT:
                meter = CpuMeter([str(service_pid)])
                box_kept, local_kept = await medians_of(runs, meter.of(lambda: print_kept(boxed, workspace, size)),
                                                        lambda: print_kept(local, Path(local_root), size))
                megabytes = size / 1e6 * (runs + 1)  # the warming call is measured too
                row(f"5. {size // 1_000_000} MB kept: service, local (median of {runs})",
                    f"{size / 1e6 / box_kept:.0f} MB/s", f"{size / 1e6 / local_kept:.0f} MB/s",
                    f"{local_kept / box_kept:.2f}x")
                row("   CPU per MB: the service, this client", f"{meter.server / megabytes * 1e3:.2f} ms",
                    f"{meter.client / megabytes * 1e3:.2f} ms", "")
    finally:
        await sandbox.delete()


@contextlib.asynccontextmanager
async def running_service(image: str) -> AsyncIterator[ServiceFiles]:
    """A service process of this bench's own (its default template pooled, ``POOL``), in a
    temporary runtime directory; stopped, and all it made removed, at the end."""
    runtime = Path(tempfile.mkdtemp(prefix="pl-bench-"))
    os.environ["PROTOLINK_RUNTIME_DIR"] = str(runtime)
    name = f"protolink-bench-svc-{uuid.uuid4().hex[:6]}"
    files = ServiceFiles.of(name)
    log = open(files.log, "ab")
    process = subprocess.Popen([sys.executable, "-m", "protolink.sandbox.service", "--name", name, "--image", image,
                                "--pool", str(POOL)], stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    try:
        while not files.pid.exists():
            if process.poll() is not None:
                raise RuntimeError(files.log.read_text())
            await asyncio.sleep(0.05)
        yield files
    finally:
        process.terminate()
        process.wait(timeout=60)
        log.close()
        docker = engine.client()
        try:
            remove_everything(name, docker)
        finally:
            docker.close()
        shutil.rmtree(runtime, ignore_errors=True)


async def main(args: argparse.Namespace) -> None:
    image = args.image or await asyncio.to_thread(ensure_image)
    async with running_service(image) as files:
        service_pid = json.loads(files.pid.read_text())["pid"]
        token = files.default_token.read_text()
        client = await connect(files.address, token, timeout=60)
        print(f"sandbox image {image}; {os.cpu_count()} CPUs; {load()}\n")
        row("", "service", "baseline", "ratio")
        if "warm" in args.only:
            median, create, first_command, second_command = await warm(client, args.runs)
            row(f"1. pool create -> first result (median of {args.runs})", ms(median), "", "target <= 10 ms")
            row("   of which the create; the first command", ms(create), ms(first_command), "")
            row("   a second command, for comparison", ms(second_command), "", "")
        if "cold" in args.only:
            turns = args.cold or max(3, args.runs // 2)
            ours, theirs, ratios = await cold(client, image, turns)
            row("2. cold create -> first result vs docker run --rm", ms(ours), ms(theirs),
                f"{ours / theirs:.2f}x (<= 1.3)")
            row(f"   each of the {turns} turns' ratio: median, range", "", "",
                f"{statistics.median(ratios):.2f}x, {min(ratios):.2f}-{max(ratios):.2f}x")
        if "idle" in args.only:
            print(load())
            memory, anonymous, growth, cpu = await idle(client, service_pid, args.idle)
            row(f"3. {args.idle} idle sandboxes: PSS per sandbox", f"{memory / 1e6:.1f} MB", "", "")
            row("   of which anonymous", f"{anonymous / 1e6:.1f} MB", "", "")
            row("   the service's growth per sandbox", f"{growth / 1e6:.1f} MB", "",
                f"{(memory + growth) / 1e6:.1f} MB (<= 25)")
            row("   CPU of all of them over 5 s", f"{cpu:.3f} s", "", "about 0")
        if "clients" in args.only:
            print(load())
            errors, rate, busy_rate, p99 = await clients_at_once(files.address, token, args.clients, args.commands)
            row(f"4. {args.clients} clients x {args.commands} commands: errors", str(errors), "", "target 0")
            row("   commands per second, creates included", f"{rate:.0f}/s", "", "")
            row("   commands per second while commands ran", f"{busy_rate:.0f}/s", "", "")
            row("   command latency, 99th percentile", ms(p99), "", "")
        if "kept" in args.only:
            print(load())
            await kept_output(client, service_pid)
        await client.aclose()


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--cold", type=int, default=0, help="cold creates, in turns with docker run (default: half of --runs)")
    parser.add_argument("--idle", type=int, default=20, help="idle sandboxes (100 for the full figure)")
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--commands", type=int, default=10)
    parser.add_argument("--image", default=None)
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"some of {', '.join(SECTIONS)}")
    parsed = parser.parse_args()
    parsed.only = set(parsed.only.split(","))
    if unknown := parsed.only - set(SECTIONS):
        parser.error(f"unknown sections: {', '.join(sorted(unknown))}")
    return parsed


if __name__ == "__main__":
    asyncio.run(main(arguments()))
