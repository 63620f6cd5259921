"""The egress daemon of one appliance: its host-side proxy, outliving ``protolink-sandbox up``.

``up --allow ...`` starts it detached (its own session, stdin closed, its messages in
``NAME.egress.log``)::

    python -m protolink.sandbox.egress.daemon NAME --channel-dir DIR --container ID [--allow RULE ...]

It runs an :class:`~protolink.sandbox.egress.service.EgressService` for the appliance's channel
directory, records every decision (:mod:`.eventlog`), answers the control socket
(:mod:`.control`), and ends on ``stop``, on SIGTERM or SIGINT, or by itself once the container is
gone: it watches the container's first process through ``/proc`` (once a second, no engine call)
when this host sees it, else asks the Docker Engine every 5 s; and it ends when ``down`` has
removed the channel directory.

``PROTOLINK_EGRESS_TEST_ALLOW_LOOPBACK=1`` in its environment (inherited from ``up``) lets the
proxy reach this host's loopback addresses (:func:`~.policy.parse_policy`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from logging.handlers import RotatingFileHandler
from pathlib import Path
from typing import Any

from protolink.errors import SandboxProtocolError

from ..hostdirs import write_private
from ..leftovers import owner_gone, process_owner
from .control import MAX_MESSAGE, EgressFiles, encode, read_message, refusal
from .eventlog import EventLog
from .policy import parse_policy
from .service import EgressService

log = logging.getLogger("protolink.sandbox.egress.daemon")

PID_POLL_SECONDS = 1.0
ENGINE_POLL_SECONDS = 5.0
#: The daemon's own messages: at most this much, and one previous part.
LOG_BYTES = 1 << 20


def container_watch(container_id: str, pid: int) -> tuple[Callable[[], bool], float]:
    """A check that says whether the container still runs, and how often to make it.

    Its first process (``pid``, as the engine reported it) when this host sees that pid in the
    container's cgroup: cheap, no engine call. Otherwise (the engine in another pid namespace)
    the engine is asked.
    """
    try:
        cgroups = Path(f"/proc/{pid}/cgroup").read_text() if pid > 0 else ""
    except OSError:
        cgroups = ""
    if container_id and container_id in cgroups:
        owner = process_owner(pid)
        return (lambda: not owner_gone(owner)), PID_POLL_SECONDS
    return (lambda: _engine_says_running(container_id)), ENGINE_POLL_SECONDS


def _engine_says_running(container_id: str) -> bool:
    import docker.errors

    from .. import engine

    try:
        client = engine.client()
        try:
            return client.containers.get(container_id).status not in ("exited", "dead", "removing")
        finally:
            client.close()
    except docker.errors.NotFound:
        return False
    except Exception as error:  # the engine restarting: ask again later
        log.warning("could not ask the engine about container %s: %s", container_id, error)
        return True


class Daemon:
    """One appliance's egress: the service, its record of decisions, the control socket."""

    def __init__(self, name: str, channel_dir: Path, container_id: str, container_pid: int,
                 allow: Sequence[str]) -> None:
        self.name = name
        self.channel_dir = channel_dir
        self.files = EgressFiles.of(name)
        self.allow = list(allow)
        self.policy = parse_policy(self.allow)
        self.alive, self.poll_seconds = container_watch(container_id, container_pid)
        self.started = time.time()
        self._stop = asyncio.Event()
        self._service: EgressService | None = None

    async def run(self) -> None:
        events = EventLog(self.files.events)
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._stop.set)
        server = None
        try:
            write_private(self.files.pid, json.dumps({"pid": os.getpid(), "owner": process_owner()}))
            self._service = await EgressService.start(self.channel_dir, self.policy, sandbox=self.name,
                                                      on_event=events.write)
            self.files.socket.unlink(missing_ok=True)
            old = os.umask(0o177)  # the socket is born 0600
            try:
                server = await asyncio.start_unix_server(self._answer, self.files.socket, limit=MAX_MESSAGE)
            finally:
                os.umask(old)
            log.info("egress of %s: allow %s", self.name, ", ".join(self.allow) or "nothing (deny all)")
            watch = asyncio.create_task(self._watch())
            await self._stop.wait()
            watch.cancel()
        finally:
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(signum)
            if server is not None:
                server.close()
            for path in (self.files.socket, self.files.pid):
                path.unlink(missing_ok=True)
            if self._service is not None:
                await self._service.aclose()
            events.close()
            log.info("egress of %s ended", self.name)

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.poll_seconds)
            if not self.channel_dir.exists() or not await asyncio.to_thread(self.alive):
                log.info("the container of %s is gone", self.name)
                self._stop.set()
                return

    def status(self) -> dict[str, Any]:
        return {"ok": True, "allow": self.allow, "deny_all": self.policy.denies_all, "pid": os.getpid(),
                "since": self.started, "events": str(self.files.events), "log": str(self.files.log)}

    def _handle(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        if op == "status":
            return self.status()
        if op == "stop":
            self._stop.set()
            return {"ok": True}
        if op != "set":
            return refusal("bad-request", f"unknown operation {op!r}: status, set or stop")
        allow = request.get("allow")
        if not isinstance(allow, list) or not all(isinstance(rule, str) for rule in allow):
            return refusal("bad-request", "set needs allow: a list of rules")
        try:
            policy = parse_policy(allow)
        except ValueError as error:
            return refusal("bad-rule", str(error))
        assert self._service is not None
        self._service.set_policy(policy)
        self.policy, self.allow = policy, allow
        log.info("egress of %s now allows %s", self.name, ", ".join(allow) or "nothing (deny all)")
        return self.status()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(5.0):
                try:
                    answer = self._handle(await read_message(reader))
                except SandboxProtocolError as error:
                    answer = refusal("bad-request", str(error))
                writer.write(encode(answer))
                await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m protolink.sandbox.egress.daemon",
                                     description="The egress daemon of one appliance: its host-side proxy.")
    parser.add_argument("name")
    parser.add_argument("--channel-dir", type=Path, required=True)
    parser.add_argument("--container", required=True, help="the container's id")
    parser.add_argument("--container-pid", type=int, default=0, help="its first process, as the engine says")
    parser.add_argument("--allow", action="append", default=[], metavar="HOST[:PORT]")
    args = parser.parse_args(argv)
    os.umask(0o077)  # whatever it creates is this user's only
    # Its messages, bounded: ``up`` points stderr at the same file for what comes before this.
    handler = RotatingFileHandler(EgressFiles.of(args.name).log, maxBytes=LOG_BYTES, backupCount=1)
    logging.basicConfig(format="%(asctime)s %(message)s", level=logging.INFO, handlers=[handler])
    try:
        daemon = Daemon(args.name, args.channel_dir, args.container, args.container_pid, args.allow)
        asyncio.run(daemon.run())
    except Exception:
        log.exception("the egress daemon of %s failed", args.name)
        return 1
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
