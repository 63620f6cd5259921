"""Process execution overhead and output-flood handling on the host backend.

(a) ``/bin/true`` through ``Agent.call_tool("execute_command", ...)`` (validation, preparation
    with resolution, policy, events, group cleanup) against a bare asyncio subprocess that
    captures stdout and stderr as well; the figure is the ratio of medians, target <= 1.3.
(b) 1 GiB on stdout through a 64 KiB output cap: wall time and throughput (target >= 500 MB/s)
    beside ``head -c`` writing to /dev/null, and the growth of this process's peak RSS
    (VmHWM, target < 50 MB)::

    python bench/process.py
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import tempfile
import time
from typing import Any

from protolink import Agent, AgentCard
from protolink.execution.local import LocalExecutionBackend
from protolink.execution.process_types import ProcessSpec
from protolink.tools.builtins import process_tool

CALLS = 300
FLOOD_BYTES = 1 << 30
CAP = 64 * 1024


class Silent:
    async def emit(self, type: str, **data: Any) -> None:
        return None


async def bare_true() -> None:
    process = await asyncio.create_subprocess_exec(
        "/bin/true", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    await process.communicate()


async def overhead(directory: str) -> tuple[float, float]:
    agent = Agent(AgentCard(name="bench", description="bench", url="runtime://bench"))
    agent.add_tool(process_tool())

    async def through_agent() -> None:
        await agent.call_tool("execute_command", argv=["/bin/true"], cwd=directory, env={})

    for warm in (bare_true, through_agent):
        for _ in range(20):
            await warm()
    bare, tool = [], []
    for _ in range(CALLS):  # interleaved, so drift affects both alike
        for run, samples in ((bare_true, bare), (through_agent, tool)):
            started = time.perf_counter()
            await run()
            samples.append(time.perf_counter() - started)
    return statistics.median(bare), statistics.median(tool)


def peak_rss_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise RuntimeError("no VmHWM in /proc/self/status")


async def flood(directory: str) -> tuple[float, float, int]:
    command = ("/usr/bin/head", "-c", str(FLOOD_BYTES), "/dev/zero")
    started = time.perf_counter()
    subprocess.run(command, stdout=subprocess.DEVNULL, check=True)
    baseline = time.perf_counter() - started

    before = peak_rss_kib()
    spec = ProcessSpec(command, directory, {}, 300, CAP)
    started = time.perf_counter()
    result = await LocalExecutionBackend().execute(spec, Silent())
    elapsed = time.perf_counter() - started
    assert result.exit_code == 0 and result.truncated and len(result.stdout) == CAP, result.exit_code
    return baseline, elapsed, peak_rss_kib() - before


async def main() -> None:
    with tempfile.TemporaryDirectory() as directory:
        bare, tool = await overhead(directory)
        baseline, elapsed, growth_kib = await flood(directory)
    mb = FLOOD_BYTES / 1e6
    print(f"(a) /bin/true, median of {CALLS}")
    print(f"    bare asyncio communicate()  {bare * 1e3:8.3f} ms")
    print(f"    Agent.call_tool             {tool * 1e3:8.3f} ms")
    print(f"    ratio                       {tool / bare:8.2f}   (target <= 1.3)")
    print(f"(b) 1 GiB stdout flood, {CAP // 1024} KiB cap")
    print(f"    head -c > /dev/null         {baseline:8.3f} s  {mb / baseline:8.0f} MB/s")
    print(f"    LocalExecutionBackend       {elapsed:8.3f} s  {mb / elapsed:8.0f} MB/s"
          "   (target >= 500 MB/s)")
    print(f"    peak RSS growth             {growth_kib / 1024:8.1f} MB   (target < 50 MB)")


if __name__ == "__main__":
    asyncio.run(main())
