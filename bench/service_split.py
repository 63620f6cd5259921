"""Where the pooled create -> first result goes: the create, the attach, the first command, a
second command, and the same command on the sandbox's own server straight (no service between);
and the service process's CPU time per forwarded command (``svc cpu``: over
:data:`CPU_COMMANDS` commands in a row, the least load-dependent figure of the hop).

    python bench/service_split.py [--runs 15] [--turns 3] [--baseline main] [--image IMAGE]

Each turn starts a service of its own (bench/service.py's, default template pooled) and
claims ``--runs`` sandboxes from its pool, each once the pool is full and has settled; medians.
With ``--baseline REF`` the turns alternate between that git ref's code (a ``git archive`` of
it, on ``PYTHONPATH`` and as the working directory, for the client and the service alike) and
this checkout's, in one run, on one image.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import grpc
from service import TRUE, _Silent, pool_full, running_service  # bench/service.py, beside this file
from turns import print_turns

from protolink.sandbox import engine
from protolink.sandbox.appliance import ADDRESS_LABEL
from protolink.sandbox.client import attach, channel_options
from protolink.sandbox.service.client import Sandbox, SandboxStatus, connect
from protolink.wire._pb import service_pb2

SETTLE_SECONDS = 1.5
TIMED = ("total", "create", "attach", "first", "second", "direct")
COLUMNS = (*TIMED, "svc cpu")
#: The commands whose forwarding the service's CPU time is measured over, in each turn.
CPU_COMMANDS = 200


async def one_turn(image: str, runs: int) -> dict[str, float]:
    """Medians, in seconds, of each column over ``runs`` pooled claims of a service of this code."""
    rows: list[tuple[float, ...]] = []
    docker = engine.client()
    async with running_service(image) as files:
        client = await connect(files.address, files.default_token.read_text(), timeout=60)
        for _ in range(runs):
            await pool_full(client)
            await asyncio.sleep(SETTLE_SECONDS)
            started = time.perf_counter()
            status = SandboxStatus.of(await client._call("Create", service_pb2.CreateRequest()))
            created = time.perf_counter()
            sandbox = await Sandbox.open(client, status)
            attached = time.perf_counter()
            first = await sandbox.backend.execute(TRUE, _Silent())
            ran = time.perf_counter()
            second = await sandbox.backend.execute(TRUE, _Silent())
            again = time.perf_counter()
            assert status.pooled and first.exit_code == second.exit_code == 0
            direct = await straight(docker, status.id)
            rows.append((ran - started, created - started, attached - created, ran - attached, again - ran, direct))
            await sandbox.delete()
        cpu = await service_cpu_per_command(client, json.loads(files.pid.read_text())["pid"])
        await client.aclose()
    docker.close()
    return {**{column: statistics.median(values) for column, values in zip(TIMED, zip(*rows))}, "svc cpu": cpu}


async def service_cpu_per_command(client: Any, pid: int) -> float:
    """The service's CPU time (user and system, seconds) per command, over CPU_COMMANDS run
    one after another on one sandbox."""
    async with await client.create() as sandbox:
        await sandbox.backend.execute(TRUE, _Silent())
        before = cpu_seconds(pid)
        for _ in range(CPU_COMMANDS):
            await sandbox.backend.execute(TRUE, _Silent())
        return (cpu_seconds(pid) - before) / CPU_COMMANDS


def cpu_seconds(pid: int) -> float:
    """Process ``pid``'s CPU time so far (its threads', user and system), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def straight(docker: Any, sandbox_id: str) -> float:
    """A second command run on the sandbox's own server over a grpcio channel of this process."""
    found = [c for c in docker.api.containers() if any(n.endswith(f".{sandbox_id}") for n in c["Names"])]
    channel = grpc.aio.insecure_channel(found[0]["Labels"][ADDRESS_LABEL], options=channel_options())
    backend = await attach(channel, timeout=10)
    try:
        await backend.execute(TRUE, _Silent())
        started = time.perf_counter()
        await backend.execute(TRUE, _Silent())
        return time.perf_counter() - started
    finally:
        await backend.aclose()
        await channel.close()


def main(args: argparse.Namespace) -> None:
    if args.one:
        print(json.dumps(asyncio.run(one_turn(args.image, args.runs))))
        return
    print(f"image {args.image}; {os.cpu_count()} CPUs; medians of {args.runs} in ms")
    print_turns(__file__, args.baseline, args.turns, ("--image", args.image, "--runs", str(args.runs)), COLUMNS,
                width=9, scale=1000)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--baseline", default=None, help="a git ref whose code runs in the other turns")
    parser.add_argument("--image", required=True)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    main(parser.parse_args())
