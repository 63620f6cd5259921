"""What the service's events cost its event loop: the time an ``emit`` takes on the call's path,
and the CPU of each record all told (the emit and the audit record it becomes), hot (records in a
row) and after a pause (a CPU that was idle, as a service between calls).

    python bench/audit_record.py [--records 3000] [--paused 40] [--turns 3] [--baseline main]

The events are the service's own: an :class:`~protolink.sandbox.service.events.Events` over a
:class:`~protolink.sandbox.service.events.Flattened` audit log in a temporary directory, wired as
the service wires them (given its loop where the code has that). With ``--baseline REF`` the
turns alternate between that git ref's code (a ``git archive`` of it, in a process of its own)
and this checkout's, in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from turns import print_turns  # bench/turns.py, beside this file

PAUSE_SECONDS = 0.05
COLUMNS = ("path hot", "all hot", "path paused", "all paused")
#: The fields of a ``command.ended`` as the service emits them.
ENDED = {"id": 7, "argv": ["/bin/sh", "-c", "make test"], "cwd": "/work", "exit_code": 0,
         "duration_seconds": 0.0123, "output_bytes": 2048, "timed_out": False, "error": None}


async def one_turn(records: int, paused: int) -> dict[str, float]:
    """Microseconds per event, medians over ``paused`` single events and means over ``records``."""
    from protolink.sandbox.service.audit import AuditLog
    from protolink.sandbox.service.events import Events, Flattened

    directory = Path(tempfile.mkdtemp(prefix="pl-audit-bench-"))
    os.chmod(directory, 0o700)
    audit = AuditLog(directory / "audit.jsonl")
    deferred = "loop" in inspect.signature(Events).parameters
    events = Events([Flattened(audit)], **({"loop": asyncio.get_running_loop()} if deferred else {}))

    def drain() -> None:
        if deferred:
            events.flush()

    try:
        started = time.perf_counter()
        for _ in range(records):
            events.emit("command.ended", "tenant-0123456789ab", "sandbox-0123", **ENDED)
        on_path = time.perf_counter() - started
        drain()
        all_told = time.perf_counter() - started
        path_paused, all_paused = [], []
        for _ in range(paused):
            await asyncio.sleep(PAUSE_SECONDS)
            started = time.perf_counter()
            events.emit("command.ended", "tenant-0123456789ab", "sandbox-0123", **ENDED)
            emitted = time.perf_counter()
            drain()
            path_paused.append(emitted - started)
            all_paused.append(time.perf_counter() - started)
        assert audit.count == records + paused
    finally:
        audit.close()
        shutil.rmtree(directory, ignore_errors=True)
    return {"path hot": on_path / records * 1e6, "all hot": all_told / records * 1e6,
            "path paused": statistics.median(path_paused) * 1e6, "all paused": statistics.median(all_paused) * 1e6}


def main(args: argparse.Namespace) -> None:
    if args.one:
        print(json.dumps(asyncio.run(one_turn(args.records, args.paused))))
        return
    print(f"{os.cpu_count()} CPUs; microseconds per event: on the call's path, and all told")
    print_turns(__file__, args.baseline, args.turns, ("--records", str(args.records), "--paused", str(args.paused)),
                COLUMNS, width=13)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=3000)
    parser.add_argument("--paused", type=int, default=40)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--baseline", default=None, help="a git ref whose code runs in the other turns")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    main(parser.parse_args())
