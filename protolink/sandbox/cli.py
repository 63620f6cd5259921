"""``protolink-sandbox up | down | status | exec``: a long-running sandbox appliance.

``up`` makes a Docker Engine answer (scripts/engine-up.sh), builds the images when needed
(scripts/build-images.sh), starts the appliance with the roots given as ``--root PATH[:rw]`` or in
``PROTOLINK_SANDBOX_ROOTS`` (comma-separated), waits until it answers, and prints the address to
connect to. ``down`` removes it, ``status`` shows it, ``exec`` runs one command in it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import socket
import sys
from collections.abc import Sequence
from typing import Any

from .docker import GiB, MiB, DockerSandbox, Root, roots_from_env
from .errors import SandboxError
from .hostdirs import runtime_dir, write_private
from .provision import DEFAULT_IMAGE, ensure_engine, ensure_image
from .reaper import CREATED_LABEL, OWNER_LABEL, remove_host_dirs

DEFAULT_NAME = "protolink-appliance"
APPLIANCE_LABEL = "io.protolink.appliance"
ADDRESS_LABEL = "io.protolink.address"
COMMAND_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}


def _say(message: str) -> None:
    print(f"protolink-sandbox: {message}", file=sys.stderr, flush=True)


def _docker() -> Any:
    import docker

    return docker.from_env()


def _find(name: str) -> Any | None:
    import docker.errors

    client = _docker()
    try:
        container = client.containers.get(name)
    except docker.errors.NotFound:
        return None
    finally:
        client.close()
    return container if container.labels.get(APPLIANCE_LABEL) == name else None


def _token_file(name: str) -> str:
    return str(runtime_dir() / f"{name}.token")


def _address(container: Any) -> str:
    """The address a client connects to (the socket label, or the published TCP port)."""
    if ADDRESS_LABEL in container.labels:
        return container.labels[ADDRESS_LABEL]
    bindings = (container.attrs["NetworkSettings"]["Ports"] or {}).values()
    for binding in bindings:
        for item in binding or ():
            host = item["HostIp"] if item["HostIp"] not in ("", "0.0.0.0", "::") else "127.0.0.1"
            return f"{host}:{item['HostPort']}"
    raise SandboxError(f"appliance {container.name} publishes no address")


def _snippet(address: str, token_file: str | None) -> str:
    token = f", token=open({token_file!r}).read()" if token_file else ""
    return f'from protolink.sandbox import connect; backend = await connect("{address}"{token})'


class _Appliance(DockerSandbox):
    """A DockerSandbox that carries the labels ``status`` and ``down`` look for."""

    def __init__(self, name: str, **options: Any) -> None:
        super().__init__(name=name, owner=f"appliance:{socket.gethostname()}", expiry_seconds=None, **options)

    def _labels(self) -> dict[str, str]:
        extra = {APPLIANCE_LABEL: self.name}
        if not self.tcp:
            extra[ADDRESS_LABEL] = f"unix://{self._host_dirs[0] / 'sandbox.sock'}"
        return {**super()._labels(), **extra}


async def _up(args: argparse.Namespace) -> int:
    roots = [Root.parse(text) for text in args.root] or roots_from_env()
    if not roots:
        _say("no roots: pass --root PATH[:rw] or set PROTOLINK_SANDBOX_ROOTS=PATH[:rw],...")
        return 2
    if _find(args.name) is not None:
        _say(f"{args.name} is already up; `protolink-sandbox down` first to change it")
        return await _status(args)
    await asyncio.to_thread(ensure_engine, _say)
    image = await asyncio.to_thread(ensure_image, args.image, _say)
    sandbox = _Appliance(args.name, roots=roots, image=image, memory=args.memory_mib * MiB, pids=args.pids,
                         cpus=args.cpus, disk_bytes=args.disk_mib * MiB, runtime=args.runtime, tcp=args.tcp)
    await sandbox.start()
    token_file = None
    if sandbox.token is not None:
        token_file = _token_file(args.name)
        write_private(token_file, sandbox.token)
    address = await sandbox.detach()
    for root in sandbox.roots:
        _say(f"root {root.path} ({'read-write' if root.writable else 'read-only'})")
    print(f"{args.name} is up at {address}")
    if token_file:
        print(f"token: {token_file}")
    print(_snippet(address, token_file))
    return 0


async def _down(args: argparse.Namespace) -> int:
    container = _find(args.name)
    if container is None:
        _say(f"{args.name} is not up")
        return 0
    await asyncio.to_thread(container.remove, force=True)
    remove_host_dirs(container.labels)
    try:
        os.unlink(_token_file(args.name))
    except FileNotFoundError:
        pass
    print(f"{args.name} removed")
    return 0


async def _status(args: argparse.Namespace) -> int:
    from .client import connect

    container = _find(args.name)
    if container is None:
        print(f"{args.name}: not up")
        return 3
    address = _address(container)
    print(f"{args.name}: {container.status} ({container.short_id}, image {container.image.tags or container.image.short_id})")
    print(f"address: {address}")
    print(f"owner: {container.labels.get(OWNER_LABEL)}, created {container.labels.get(CREATED_LABEL)}")
    token = _read_token(args.name)
    try:
        backend = await connect(address, token=token, timeout=3.0)
        try:
            await backend.health()
            info = await backend.info()
        finally:
            await backend.aclose()
    except SandboxError as error:
        print(f"health: not answering ({error})")
        return 1
    print(f"health: serving ({info.boundary}, server {info.server_version})")
    for root in info.roots:
        print(f"root: {root.path} ({'read-write' if root.writable else 'read-only'})")
    return 0


def _read_token(name: str) -> str | None:
    try:
        with open(_token_file(name)) as token:
            return token.read()
    except FileNotFoundError:
        return None


async def _exec(args: argparse.Namespace) -> int:
    from protolink.core.runs import RunContext
    from protolink.core.tools import ToolContext
    from protolink.execution.process import ProcessSpec

    from .client import connect

    container = _find(args.name)
    if container is None:
        _say(f"{args.name} is not up: run `protolink-sandbox up` first")
        return 3
    argv = list(args.command)
    if not os.path.isabs(argv[0]):
        argv = ["/usr/bin/env", "--", *argv]  # PATH lookup happens inside the sandbox
    spec = ProcessSpec(argv=tuple(argv), cwd=args.cwd, env=COMMAND_ENV, timeout_seconds=args.timeout,
                       max_output_bytes=args.max_output_bytes)
    backend = await connect(_address(container), token=_read_token(args.name))
    try:
        result = await backend.execute(spec, ToolContext(RunContext(), action_id="protolink-sandbox-exec"))
    finally:
        await backend.aclose()
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    if result.timed_out:
        _say(f"timed out after {args.timeout:g} s: {shlex.join(argv)}")
    if result.truncated:
        _say("output truncated")
    return result.exit_code if result.exit_code is not None and result.exit_code >= 0 else 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="protolink-sandbox", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="verb", required=True)
    up = commands.add_parser("up", help="build when needed, start the appliance and print how to connect")
    up.add_argument("--root", action="append", default=[], metavar="PATH[:rw]",
                    help="a directory to mount at the same path (read-only unless :rw); repeatable")
    up.add_argument("--image", default=DEFAULT_IMAGE)
    up.add_argument("--memory-mib", type=int, default=GiB // MiB)
    up.add_argument("--pids", type=int, default=512)
    up.add_argument("--cpus", type=float, default=1.0,
                    help="a whole number: that many of the engine's CPUs (a cpuset); a fraction: a CFS quota")
    up.add_argument("--disk-mib", type=int, default=GiB // MiB, help="largest file a command may write")
    up.add_argument("--runtime", default=None, help='e.g. "runsc" (gVisor), where installed')
    up.add_argument("--tcp", default=None, metavar="HOST:PORT",
                    help="publish over TCP with a token (for remote engines) instead of a Unix socket")
    execute = commands.add_parser("exec", help="run one command in the appliance")
    execute.add_argument("--cwd", default="/tmp")
    execute.add_argument("--timeout", type=float, default=60.0)
    execute.add_argument("--max-output-bytes", type=int, default=1 << 20)
    execute.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARG...]")
    commands.add_parser("down", help="remove the appliance")
    commands.add_parser("status", help="show the appliance and whether it answers")
    for sub in commands.choices.values():
        sub.add_argument("--name", default=DEFAULT_NAME)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.verb == "exec":
        args.command = args.command[1:] if args.command[:1] == ["--"] else args.command
        if not args.command:
            _parser().error("exec needs a command: protolink-sandbox exec -- COMMAND [ARG...]")
    verb = {"up": _up, "down": _down, "status": _status, "exec": _exec}[args.verb]
    try:
        return asyncio.run(verb(args))
    except (SandboxError, ValueError) as error:
        _say(str(error))
        return 1


if __name__ == "__main__":
    sys.exit(main())
