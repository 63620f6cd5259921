"""``python3 -m protolink_sandboxd``: parse the command line, hold the protections, then serve
under the orphan reaper.

The collector stays off while the server's modules load (a cold sandbox's first command waits
for them; collecting while they load costs some 5-8% more CPU and frees nothing): they are
frozen once loaded, and only then is it on.
"""

from __future__ import annotations

import gc
import os
import sys
from types import ModuleType


def main(argv: list[str] | None = None) -> int:
    gc.disable()
    import logging

    from protolink.wire.protections import REFUSED

    from . import protections
    from .config import parse_args
    from .init import run_under_reaper

    config = parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="sandbox: %(levelname)s %(message)s")
    if not protections.hold(config):  # before anything starts: every process inherits the filter
        return REFUSED

    def serve() -> int:
        asyncio = import_asyncio_without_ssl()

        # gRPC's fork handlers crash children that fail to exec after a setuid (SIGSEGV instead
        # of an error); commands and workers never use gRPC, so they are not needed.
        os.environ["GRPC_ENABLE_FORK_SUPPORT"] = "false"
        from .privileges import subreapers_work
        from .spawner_client import SpawnerClient

        subreapers = subreapers_work()  # before the spawner: no child may be orphaned meanwhile

        # A SPAWN carries one Execute request and the places its executable may be.
        spawner = SpawnerClient(config.command_uid, config.command_gid, max_request_bytes=2 * config.max_message_bytes,
                            memory_bytes=config.command_memory_bytes, program=config.spawner_program)
        if config.token is None:  # a forked spawner would carry the token; else one is started afresh
            spawner.fork()  # while this process has one thread
        from .server import serve  # grpc is imported (no thread starts yet) after the spawner's fork
        from .worker_pool import WorkerPool

        # Pages stay shared with the reaper (where this is its child) and with the workers
        # forked later while neither side writes them: the collector would write to every
        # object it scans.
        gc.freeze()
        gc.enable()
        workers = WorkerPool(uid=config.command_uid, gid=config.command_gid, memory_bytes=config.worker_memory_bytes,
                             max_workers=config.max_workers, max_message_bytes=config.max_message_bytes,
                             forks=config.token is None)  # a forked worker would carry the token
        asyncio.run(serve(config, spawner, workers, subreapers=subreapers))
        return 0

    code = run_under_reaper(serve)
    return code if code >= 0 else 128 - code


def import_asyncio_without_ssl() -> ModuleType:
    """``asyncio``, imported while ``ssl`` cannot be: asyncio's own TLS is then off in this process.

    asyncio imports ``ssl`` (and OpenSSL with it: 6-8 ms of a cold start) as it loads, for
    connections that ask for TLS, and does without it when it is missing. No connection of the
    server asks: gRPC has a TLS of its own, and the server listens on a Unix socket or, with a
    token, on plain TCP. The block is lifted at once: a later ``import ssl`` gets the module.
    """
    blocked = "ssl" not in sys.modules
    if blocked:
        sys.modules["ssl"] = None  # type: ignore[assignment]  # `import ssl` raises ImportError
    try:
        import asyncio
    finally:
        if blocked:
            del sys.modules["ssl"]
    return asyncio


if __name__ == "__main__":
    sys.exit(main())
