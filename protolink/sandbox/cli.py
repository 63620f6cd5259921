"""``protolink-sandbox up | down | status | exec | egress | ci | serve | service | token | gateway
| audit | kube-manifest``: a long-running sandbox appliance and its sandbox service, and a CI runner.

``up`` makes a Docker Engine answer (scripts/engine-up.sh), builds the images when needed
(scripts/build-images.sh), starts the appliance with the roots given as ``--root PATH[:rw]`` or in
``PROTOLINK_SANDBOX_ROOTS`` (comma-separated), or else over a default workspace, waits until it
answers, and prints the address to connect to; with ``--allow HOST[:PORT]`` its commands reach
those hosts through a host-side proxy that a detached daemon runs (:mod:`.egress.daemon`), and
with ``--ca-file PEM`` they trust that bundle (a copy of it).
``down`` removes it (and its daemon), ``status`` shows it, ``exec`` runs one command in it,
``egress`` changes its allow-list live or shows its decisions. ``up`` also starts the sandbox
service (:mod:`.service`; a sandbox per request), which ``down`` stops, removing every sandbox it
made; ``serve`` runs the service in the foreground, ``service`` shows it, ``token add`` adds a token,
``audit verify`` checks the service's audit log (:mod:`.service.audit`); ``gateway`` runs a Swarm
node's gateway (:mod:`.gateway`).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from protolink.errors import SandboxError, SandboxNotReachedError, ToolExecutionError

# ``exec`` is timed against ``docker exec``: only what it needs is imported here (no asyncio,
# grpc or protobuf: :mod:`.exec_client`); the docker SDK, the images, the container options
# and the event loop load in the verbs that use them.
from . import records
from .addresses import socket_gone, socket_path
from .engine import engine_errors
from .typed import COMMAND_ENV, as_typed, command_env, typed_argv

if TYPE_CHECKING:
    from .exec_client import Command, Outcome

DEFAULT_NAME = "protolink-appliance"
#: exec's defaults: a command runs as long as it would on a host, within a day, and its output is
#: passed through up to the appliance's limit (exec keeps none of it).
EXEC_TIMEOUT_SECONDS = 86400.0
EXEC_OUTPUT_BYTES = 1 << 30


def _reader_gone() -> int:
    """The exit status once what reads the output has gone: a shell's for SIGPIPE."""
    import signal

    return 128 + signal.SIGPIPE


def _say(message: str) -> None:
    print(f"protolink-sandbox: {message}", file=sys.stderr, flush=True)


def _snippet(address: str, token_file: str | None, fingerprint: str | None) -> str:
    token = f", token=open({token_file!r}).read()" if token_file else ""
    pinned = f", fingerprint={fingerprint!r}" if fingerprint else ""
    return f'from protolink.sandbox import connect; backend = await connect("{address}"{token}{pinned})'


def when(epoch: int, now: float) -> str:
    """``epoch`` (Unix seconds) in ISO 8601, UTC, with how long ago or ahead it is:
    ``2026-12-01T14:03:22Z (5 min ago)``."""
    from datetime import datetime, timezone

    stamp = datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    seconds = round(now - epoch)
    span = next((f"{abs(seconds) // size} {unit}" for unit, size in (("d", 86400), ("h", 3600), ("min", 60))
                 if abs(seconds) >= size), f"{abs(seconds)} s")
    return f"{stamp} ({span} ago)" if seconds >= 0 else f"{stamp} (in {span})"


async def _up(args: argparse.Namespace) -> int:
    import asyncio
    from dataclasses import replace

    from protolink.wire.roots import Root

    from .appliance import Appliance, appliance_config, find
    from .config import Identity
    from .docker import roots_from_env
    from .images import DEFAULT_IMAGE
    from .provision import ensure_engine, ensure_image
    from .writable_roots import check_writable, default_workspace

    egress = None
    if args.allow:
        from .egress.policy import parse_policy

        egress = parse_policy(args.allow)  # a rule it cannot parse ends here, before anything slow
    if args.ca_file is not None:
        from .ca_file import read_ca_file

        read_ca_file(args.ca_file)  # a file it would refuse ends here, before anything is made
    if args.swarm is not None:  # a table that does not hold ends here, before anything slow
        from .service.config import load_swarm_table

        load_swarm_table(Path(args.swarm))
    roots = [Root.parse(text) for text in args.root] or roots_from_env()
    identity = Identity.of()
    workspace = None
    if not roots:
        workspace = await asyncio.to_thread(default_workspace, identity.uid, identity.gid)
        roots = [Root(str(workspace), writable=True)]
    config = appliance_config(args.name, roots=roots, image=args.image or DEFAULT_IMAGE, memory=args.memory_mib << 20,
                              pids=args.pids, cpus=args.cpus, disk_bytes=args.disk_mib << 20, runtime=args.runtime,
                              tcp=args.tcp, egress=egress, ca_file=args.ca_file)
    # Before anything slow; it logs what it hands over.
    await asyncio.to_thread(check_writable, config.roots, identity.uid, identity.gid, hand_over=args.chown_writable)
    await asyncio.to_thread(ensure_engine, _say)
    if await asyncio.to_thread(find, args.name) is not None:
        _say(f"{args.name} is already up; `protolink-sandbox down` first to change it")
        return await _status(args)
    image = await asyncio.to_thread(ensure_image, config.image, _say)
    sandbox = Appliance(config=replace(config, image=image), chown_writable=args.chown_writable)
    await sandbox.start()
    container_id = sandbox.container_id or ""
    address = await sandbox.detach()
    records.save(records.Record(args.name, container_id, address, egress=bool(args.allow),
                                fingerprint=sandbox.fingerprint), sandbox.token)
    if args.allow:
        try:
            daemon = await _start_egress(args.name, container_id, address, args.allow)
        except BaseException:
            await _down(args)  # all or nothing: an appliance whose egress is missing is not what was asked
            raise
        _say(f"egress: {_allowed(daemon)} (daemon pid {daemon['pid']}; decisions: "
             f"`protolink-sandbox egress --name {args.name} --log`)")
    try:
        service = await _start_service(args, image)
    except BaseException:
        await _down(args)
        raise
    for root in sandbox.roots:
        _say(f"root {root.path} ({'read-write' if root.writable else 'read-only'})")
    print(f"{args.name} is up at {address}")
    print(service)
    if workspace is not None:
        print(f"workspace: {workspace} (read-write; commands run as uid {identity.uid})")
    token_file = str(records.token_path(args.name)) if sandbox.token is not None else None
    if token_file:
        print(f"token: {token_file}")
    if sandbox.fingerprint:
        print(f"tls: {sandbox.fingerprint} (the fingerprint of its certificate, which clients pin)")
    print(_snippet(address, token_file, sandbox.fingerprint))
    return 0


async def _start_service(args: argparse.Namespace, image: str) -> str:
    """Start the sandbox service of appliance ``args.name``; the line that says where it is."""
    from .service.files import ServiceFiles
    from .service.process import start_service

    arguments = ["--image", image, "--pool", str(args.pool)]
    if args.service_config is not None:
        arguments += ["--config", args.service_config]
    if args.swarm is not None:
        arguments += ["--swarm", str(Path(args.swarm).resolve())]  # the service runs in /
    if args.service_tcp is not None:
        arguments += ["--tcp", args.service_tcp]
    record = await start_service(args.name, arguments)
    files = ServiceFiles.of(args.name)
    lines = [f"service: {', '.join(record['addresses'])} (pid {record['pid']}; default token {files.default_token}): "
             f"from protolink.sandbox.service import connect; service = await connect(name={args.name!r})"]
    if record.get("fingerprint"):
        tcp = next(where for where in record["addresses"] if socket_path(where) is None)
        lines.append(f"service tls: {record['fingerprint']}: remote clients pin it: "
                     f"connect({tcp!r}, token=..., fingerprint={record['fingerprint']!r})")
    return "\n".join(lines)


async def _start_egress(name: str, container_id: str, address: str, allow: list[str]) -> dict[str, Any]:
    """Start the egress daemon of appliance ``name``, whose server listens at ``address``."""
    import asyncio
    from .appliance import find
    from .egress.control import start_daemon

    container = await asyncio.to_thread(find, name)
    pid = int(container.attrs["State"]["Pid"]) if container is not None else 0
    path = socket_path(address)
    assert path is not None, "an appliance with egress listens on a Unix socket (SandboxConfig checks it)"
    return await start_daemon(name, Path(path).parent, container_id, pid, allow)


def _allowed(answer: dict[str, Any]) -> str:
    """What an egress daemon's status says it allows."""
    rules = answer.get("allow") or []
    return f"allow {', '.join(map(str, rules))}" if rules else "deny all"


def _daemon(answer: dict[str, Any]) -> str:
    """An egress daemon's status in one line."""
    return f"{_allowed(answer)} (daemon pid {answer.get('pid')}, decisions in {answer.get('events')})"


async def _down(args: argparse.Namespace) -> int:
    import asyncio

    from .appliance import find
    from .egress.control import stop_daemon
    from .leftovers import HOSTDIRS_LABEL, remove_host_dirs

    if await stop_daemon(args.name):
        _say(f"stopped the egress daemon of {args.name}")
    await _down_service(args.name)
    container = await asyncio.to_thread(find, args.name)
    record = records.load(args.name)
    records.forget(args.name)
    if container is None:
        if record is not None and (path := socket_path(record.address)) is not None:  # removed behind our back
            remove_host_dirs({HOSTDIRS_LABEL: os.path.dirname(path)})
        _say(f"{args.name} is not up")
        return 0
    await asyncio.to_thread(container.remove, force=True)
    remove_host_dirs(container.labels)
    print(f"{args.name} removed")
    return 0


async def _down_service(name: str) -> None:
    """Stop the sandbox service of appliance ``name`` and remove every sandbox it made."""
    import asyncio

    from . import engine
    from .service.process import remove_everything, stop_service

    stopped = await stop_service(name)
    client = await asyncio.to_thread(engine.client)
    try:
        removed = await asyncio.to_thread(remove_everything, name, client)
    finally:
        client.close()
    if stopped or removed:
        _say(f"stopped the sandbox service of {name}; removed {removed} sandbox(es)")


async def _service(args: argparse.Namespace) -> int:
    """Print the service's state and the default token's sandboxes; 3 when it is not up."""
    from .service.client import connect
    from .service.process import running

    record = running(args.name)
    if record is None:
        print(f"service {args.name}: not up")
        return 3
    print(f"service {args.name}: serving at {', '.join(record['addresses'])} (pid {record['pid']})")
    if record.get("fingerprint"):
        print(f"tls: {record['fingerprint']} (the fingerprint TCP clients pin)")
    client = await connect(name=args.name)
    try:
        listed = await client.list()
    finally:
        await client.aclose()
    now = time.time()
    for status in listed:
        ends = [f"{what} {when(int(at), now)}" for what, at in (("expires", status.expires),
                                                                 ("idle after", status.idle_expires)) if at]
        print(f"{status.id}: {status.state}, template {status.template}{' (pooled)' if status.pooled else ''}, "
              f"created {when(int(status.created), now)}" + "".join(f", {end}" for end in ends if status.state == "running"))
    return 0


def _token(args: argparse.Namespace) -> int:
    from .service.files import ServiceFiles
    from .service.tokens import Quota, Tokens

    quota = Quota(args.sandboxes, None if args.memory_mib is None else args.memory_mib << 20, args.cpus)
    print(Tokens(ServiceFiles.of(args.name).tokens).add(args.token_name, quota))
    return 0


async def _status(args: argparse.Namespace) -> int:
    import asyncio

    from .appliance import address, find
    from .client import connect
    from .leftovers import CREATED_LABEL, EXPIRY_LABEL, OWNER_LABEL

    container = await asyncio.to_thread(find, args.name)
    if container is None:
        print(f"{args.name}: not up")
        return 3
    where = address(container)
    image = ", ".join(container.image.tags) or container.image.short_id
    print(f"{args.name}: {container.status} ({container.short_id}, image {image})")
    print(f"address: {where}")
    now = time.time()
    created, expiry = (container.labels.get(label, "") for label in (CREATED_LABEL, EXPIRY_LABEL))
    times = [f"created {when(int(created), now)}" if created.isdigit() else "created at an unknown time"]
    if expiry.isdigit() and int(expiry):
        times.append(f"expires {when(int(expiry), now)}")
    print(f"owner: {container.labels.get(OWNER_LABEL)}, {', '.join(times)}")
    record = records.load(args.name)
    fingerprint = record.fingerprint if record is not None else None
    if fingerprint:
        print(f"tls: {fingerprint} (the fingerprint TCP clients pin)")
    try:
        backend = await connect(where, token=records.read_token(args.name), timeout=3.0, fingerprint=fingerprint)
        try:
            await backend.health()
            info = await backend.info()
        finally:
            await backend.aclose()
    except (SandboxError, ValueError) as error:  # ValueError: a TCP appliance whose fingerprint is not recorded
        print(f"health: not answering ({error})")
        return 1
    print(f"health: serving ({info.boundary}, server {info.server_version})")
    for root in info.roots:
        print(f"root: {root.path} ({'read-write' if root.writable else 'read-only'})")
    return await _egress_status(args.name)


async def _egress_status(name: str) -> int:
    """Print the egress line of ``status``; 1 when the appliance has egress but no daemon answers."""
    from .egress.control import EgressControlError, NoEgressDaemonError, ask

    record = records.load(name)
    try:
        answer = await ask(name, "status", timeout=3.0)
    except NoEgressDaemonError as error:
        if record is not None and record.egress:
            print(f"egress: no daemon: its commands reach nothing ({error})")
            return 1
        print("egress: none (no network)")
        return 0
    except EgressControlError as error:
        print(f"egress: {error}")
        return 1
    print(f"egress: {_daemon(answer)}")
    return 0


async def _egress(args: argparse.Namespace) -> int:
    from .egress.control import ask

    if args.log:
        return await _egress_log(args)
    if args.allow or args.deny_all:
        answer = await ask(args.name, "set", allow=[] if args.deny_all else args.allow)
        closed = "; open connections closed" if args.deny_all else ""
        print(f"{args.name}: egress now {'denies everything' + closed if args.deny_all else _allowed(answer)}")
        return 0
    print(f"{args.name}: egress {_daemon(await ask(args.name, 'status'))}")
    return 0


async def _egress_log(args: argparse.Namespace) -> int:
    import asyncio

    from .egress.control import EgressFiles, NoEgressDaemonError
    from .egress.eventlog import Tail, describe, recent

    path = EgressFiles.of(args.name).events
    if not path.exists():
        raise NoEgressDaemonError(f"{args.name} has no egress log: it was not started with "
                                  "`protolink-sandbox up --allow HOST[:PORT]`")
    tail = Tail(path) if args.follow else None
    for record in await asyncio.to_thread(recent, path, args.lines):
        print(describe(record))
    while tail is not None:
        for record in await asyncio.to_thread(tail.read):
            print(describe(record), flush=True)
        await asyncio.sleep(0.2)
    return 0


#: exec's own exit statuses, beside its command's: as ``timeout`` and ``docker exec`` give them.
TIMED_OUT, SANDBOX_FAILED, NOT_STARTED, NOT_UP = 124, 125, 126, 3


def _exec(args: argparse.Namespace) -> int:
    """Run the command, its output passed through as it comes. Its exit status is a shell's:
    the command's exit code, 128 + N when signal N ended it; 124 when it timed out, 126 when it
    could not start, 125 when the sandbox failed, 3 when the appliance is not up."""
    from .exec_client import Command

    argv = typed_argv(args.command)
    command = Command(argv=argv, cwd=args.cwd, env=args.env, timeout_seconds=args.timeout,
                      max_output_bytes=args.max_output_bytes)
    try:
        outcome = _execute_in(args.name, command, _standard_input() if args.interactive else None)
    except BrokenPipeError:  # what reads the output went away: the command ends with the connection
        return _reader_gone()
    except ToolExecutionError as error:  # the sandbox's own word: the command could not start
        _say(as_typed(str(error), args.command))
        return NOT_STARTED
    except (OSError, RuntimeError) as error:  # the sandbox's failure (or its error for this call)
        _say(str(error))
        return SANDBOX_FAILED
    if outcome is None:
        _say(f"{args.name} is not up: run `protolink-sandbox up` first")
        return NOT_UP
    if outcome.truncated:
        _say("output truncated")
    if outcome.timed_out:
        import shlex

        _say(f"timed out after {args.timeout:g} s: {shlex.join(args.command)}")
        return TIMED_OUT
    if outcome.exit_code is None:
        _say("the sandbox did not report how the command ended")
        return SANDBOX_FAILED
    return outcome.exit_code if outcome.exit_code >= 0 else 128 - outcome.exit_code


def _standard_input() -> int | None:
    """This process's standard input for ``exec -i``; None (empty input) when it is closed, as
    the connection to the sandbox may then take its descriptor."""
    try:
        os.fstat(0)
    except OSError:
        return None
    return 0


def _execute_in(name: str, command: Command, stdin: int | None) -> Outcome | None:
    """``command`` run in appliance ``name``, its standard input read from ``stdin`` (None:
    empty): at the address ``up`` recorded, else where the engine says it is; None when it is
    not up."""
    from .exec_client import CONNECT_SECONDS, execute

    record = records.load(name)
    if record is not None and not socket_gone(record.address):
        try:
            return execute(record.address, records.read_token(name), command, stdin=stdin,
                           fingerprint=record.fingerprint)
        except SandboxNotReachedError:
            pass  # removed behind `down`'s back, or restarted: the engine knows (nothing ran)
    from .appliance import address, find

    container = find(name)
    if container is None:
        records.forget(name)
        return None
    return execute(address(container), records.read_token(name), command, stdin=stdin,
                   connect_seconds=CONNECT_SECONDS, fingerprint=record.fingerprint if record is not None else None)


_CI_DESCRIPTION = """Copy REPO (a directory, or a git URL cloned here) into a fresh workspace, run the
--setup commands with the --allow hosts reachable, cut the network, run TEST_CMD, collect --junit
files and --artifacts, write the --report, and remove everything. Exit status: TEST_CMD's; the
runner's own: 2 usage, 120 setup failed, 121 repository not fetched, 124 timed out, 125 runner
or sandbox failure, 130 interrupted, 143 terminated (the report's "outcome" says which)."""


def _name(text: str) -> str:
    try:
        return records.checked_name(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _parser() -> argparse.ArgumentParser:
    parser, commands = _verbs()
    up = commands.add_parser("up", help="build when needed, start the appliance and print how to connect")
    up.add_argument("--chown-writable", action="store_true",
                    help="hand a writable root that the command user (uid 65534) cannot write to that user "
                         "(chown) instead of refusing it")
    _add_config_options(up)
    up.add_argument("--ca-file", default=None, metavar="PEM",
                    help="a CA bundle every command trusts (a copy of it, read-only): SSL_CERT_FILE, PIP_CERT and "
                         "the other trust variables name it, for a network that intercepts TLS")
    up.add_argument("--pool", type=int, default=0, help="warm sandboxes the service keeps of its default template")
    up.add_argument("--service-tcp", default=None, metavar="HOST:PORT",
                    help="the sandbox service also listens here, with TLS (a certificate of its own, whose "
                         "fingerprint is printed) and tokens")
    up.add_argument("--service-config", default=None, metavar="FILE",
                    help="the sandbox service's TOML file (templates, allowed roots): docs/service.md")
    up.add_argument("--swarm", default=None, metavar="FILE",
                    help="the sandbox service places its sandboxes on Docker Swarm: FILE is TOML with a [swarm] "
                         "table (manager = a manager's engine URL, gateway_token_file, and [swarm.nodes.HOSTNAME] "
                         "gateway = HOST:PORT, fingerprint = what that node's gateway printed); docs/swarm.md")
    _add_exec(commands)
    _add_ci(commands)
    _add_service(commands)
    _add_audit(commands)
    _add_kube(commands)
    commands.add_parser("down", help="remove the appliance, its sandbox service and every sandbox it made")
    commands.add_parser("status", help="show the appliance, whether it answers, and its egress")
    egress = commands.add_parser("egress", help="change the appliance's egress live, or show its decisions",
                                 description="Without options: show the allow-list.")
    action = egress.add_mutually_exclusive_group()
    action.add_argument("--allow", action="append", default=[], metavar="HOST[:PORT]",
                        help="replace the allow-list with these rules (repeatable); new connections at once")
    action.add_argument("--deny-all", action="store_true",
                        help="deny every new connection and close the open ones at once")
    action.add_argument("--log", action="store_true", help="print the recent decisions, one a line")
    egress.add_argument("--follow", action="store_true", help="with --log: keep printing them as they come")
    egress.add_argument("--lines", type=int, default=50, help="with --log: how many recent decisions (default 50)")
    for verb, sub in commands.choices.items():
        if verb not in ("ci", "serve", "audit", "gateway"):  # a CI job's sandbox is its own; the others name it themselves
            _add_name(sub)
    return parser


def _add_config_options(verb: argparse.ArgumentParser) -> None:
    """The options of a sandbox's configuration: ``up``'s, which ``kube-manifest`` takes too."""
    verb.add_argument("--root", action="append", default=[], metavar="PATH[:rw]",
                      help="a directory to mount at the same path (read-only unless :rw); repeatable; without "
                           "any, a default workspace (printed) is mounted read-write")
    verb.add_argument("--image", default=None, help="default: protolink/sandbox:latest, built from this checkout")
    verb.add_argument("--memory-mib", type=int, default=1024)
    verb.add_argument("--pids", type=int, default=512)
    verb.add_argument("--cpus", type=float, default=1.0,
                      help="a whole number: that many of the engine's CPUs (a cpuset); a fraction: a CFS quota")
    verb.add_argument("--disk-mib", type=int, default=1024, help="largest file a command may write")
    verb.add_argument("--runtime", default=None, help='e.g. "runsc" (gVisor), where installed')
    verb.add_argument("--tcp", default=None, metavar="HOST:PORT",
                      help="publish over TCP with a token (for remote engines) instead of a Unix socket")
    verb.add_argument("--allow", action="append", default=[], metavar="HOST[:PORT]",
                      help="let commands reach HOST (ports 80 and 443, or PORT; *.suffix matches names under suffix; "
                           "CIDR[:PORT] for addresses) through a host-side proxy; repeatable. Without: no network")


def _add_kube(commands: Any) -> None:
    kube = commands.add_parser("kube-manifest", help="print the Kubernetes NetworkPolicy and Pod of the appliance `up` "
                                                     "would start (docs/kubernetes.md); nothing is started")
    _add_config_options(kube)
    kube.add_argument("--channel-dir", default=None, metavar="PATH",
                      help="the node's directory for the server's socket (or token), which only the host user may "
                           "open; default /var/lib/protolink/NAME")
    kube.add_argument("--node", default=None, help="the node that has the roots and the directory (default: any)")
    kube.add_argument("--seccomp-profile", default=None, metavar="PATH",
                      help="the seccomp profile below the kubelet's seccomp root (default protolink-seccomp.json)")
    kube.add_argument("--runtime-class", default=None, help="the RuntimeClass of --runtime (default: its name)")
    kube.add_argument("--json", action="store_true", help="a JSON List instead of YAML documents")
    kube.add_argument("--secrets-dir", default=None, metavar="PATH",
                      help="with --tcp: make the server's token, certificate and key in this new directory, for "
                           "the node's --channel-dir, and print the fingerprint clients pin")


def _kube_manifest(args: argparse.Namespace) -> int:
    """Print the manifests of ``kube-manifest``; 1 with the reason when the options make no sandbox."""
    import json
    from dataclasses import replace
    import yaml

    from protolink.wire.roots import Root

    from .appliance import appliance_config
    from .egress.policy import parse_policy
    from .placements.kubernetes import ClusterFacts, NodeFacts, manifests
    from .images import DEFAULT_IMAGE

    try:
        config = appliance_config(args.name, roots=[Root.parse(text) for text in args.root],
                                  image=args.image or DEFAULT_IMAGE, memory=args.memory_mib << 20, pids=args.pids,
                                  cpus=args.cpus, disk_bytes=args.disk_mib << 20, runtime=args.runtime, tcp=args.tcp,
                                  egress=parse_policy(args.allow) if args.allow else None)
        cluster = ClusterFacts(runtime_class=args.runtime_class, gvisor=args.runtime == "runsc")
        if args.seccomp_profile:
            cluster = replace(cluster, seccomp_profile=args.seccomp_profile)
        node = NodeFacts(Path(args.channel_dir or f"/var/lib/protolink/{args.name}"), int(time.time()), args.node)
        documents = manifests(config, cluster, node)
        if args.secrets_dir:
            _write_kube_secrets(Path(args.secrets_dir), args.name, args.tcp, node.channel_dir)
    except (ValueError, OSError) as error:
        _say(str(error))
        return 1
    if args.json:
        print(json.dumps({"apiVersion": "v1", "kind": "List", "items": documents}, indent=2))
    else:
        print(yaml.safe_dump_all(documents, sort_keys=False), end="")
    return 0


def _write_kube_secrets(directory: Path, name: str, tcp: str | None, channel_dir: Path) -> None:
    """Make a TCP-mode Pod's secrets in ``directory`` (new, mode 0700) and say where they go and
    what clients pin; they are never written over."""
    import secrets

    from .placements.server import SECRET_FILES, write_secrets

    if tcp is None:
        raise ValueError("--secrets-dir is for TCP mode (--tcp): a Unix socket needs no token or certificate")
    try:
        directory.mkdir(mode=0o700)
    except FileExistsError:
        raise ValueError(f"{directory} exists: secrets go into a new directory, never over others") from None
    fingerprint = write_secrets(directory, secrets.token_urlsafe(32), f"protolink sandbox {name}")
    _say(f"wrote {', '.join(SECRET_FILES.values())} to {directory}: place them in {channel_dir} on the node "
         "(the server reads them once and deletes them)")
    _say(f"tls: {fingerprint} (the fingerprint of its certificate, which clients pin)")
    _say(_snippet(f"tcp://NODE:{tcp.rsplit(':', 1)[-1]}", str(directory / SECRET_FILES["--token-file"]), fingerprint))


def _exec_parser() -> argparse.ArgumentParser:
    """The parser of ``exec`` alone: building every verb's arguments would cost it 2-5 ms
    (argparse formats and translates each one)."""
    parser, commands = _verbs()
    _add_name(_add_exec(commands))
    return parser


class _Verbs(argparse._SubParsersAction):  # type: ignore[type-arg]
    """Verbs whose own ``--help`` opens with the line the verb list shows, unless given one."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        kwargs.setdefault("description", kwargs.get("help"))
        return super().add_parser(name, **kwargs)


def _verbs() -> tuple[argparse.ArgumentParser, Any]:
    parser = argparse.ArgumentParser(
        prog="protolink-sandbox",
        description="A long-running sandbox appliance and its sandbox service, and a CI runner.")
    return parser, parser.add_subparsers(dest="verb", required=True, action=_Verbs)


def _add_exec(commands: Any) -> argparse.ArgumentParser:
    execute: argparse.ArgumentParser = commands.add_parser("exec", help="run one command in the appliance")
    execute.add_argument("-w", "--workdir", "--cwd", dest="cwd", default="/tmp", metavar="DIR",
                         help="the command's working directory, as docker exec -w (default /tmp)")
    execute.add_argument("-e", "--env", action="append", default=[], metavar="NAME[=VALUE]",
                         help="set a variable for the command (repeatable); a bare NAME passes this host's value. "
                              f"The command also gets {', '.join(f'{k}={v}' for k, v in COMMAND_ENV.items())} "
                              "unless set here")
    execute.add_argument("-i", "--interactive", action="store_true",
                         help="pass this process's standard input to the command until its end, as docker exec -i "
                              "does; without it the command's standard input is empty")
    execute.add_argument("--timeout", type=float, default=EXEC_TIMEOUT_SECONDS,
                         help=f"seconds before the command's group is killed (exit 124; default {EXEC_TIMEOUT_SECONDS:g})")
    execute.add_argument("--max-output-bytes", type=int, default=EXEC_OUTPUT_BYTES,
                         help="bytes of output passed through, both channels together; the rest is dropped "
                              "(default: the appliance's limit, 1 GiB)")
    execute.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARG...]")
    return execute


def _add_ci(commands: Any) -> None:
    from .ci.command import add_arguments

    add_arguments(commands.add_parser("ci", usage="%(prog)s REPO [options] -- TEST_CMD [ARG...]",
                                      help="run an untrusted repository's setup and tests in a sandbox of its own, "
                                           "with a report", description=_CI_DESCRIPTION))


def _add_service(commands: Any) -> None:
    from .service.daemon import add_arguments

    add_arguments(commands.add_parser("serve", help="run the sandbox service in the foreground"))
    commands.add_parser("service", help="show the sandbox service and the default token's sandboxes")
    token = commands.add_parser("token", help="add a token of the sandbox service (printed once)")
    token.add_argument("action", choices=["add"])
    token.add_argument("token_name", metavar="NAME")
    token.add_argument("--sandboxes", type=int, default=None, help="most sandboxes at once (default: no bound)")
    token.add_argument("--memory-mib", type=int, default=None, help="most memory in all its sandboxes")
    token.add_argument("--cpus", type=float, default=None, help="most CPUs in all its sandboxes")
    from .gateway import add_arguments as gateway_arguments

    gateway_arguments(commands.add_parser("gateway", help="run a Swarm node's gateway to its sandboxes "
                                                          "(as root on the node; docs/swarm.md)"))


def _add_audit(commands: Any) -> None:
    audit = commands.add_parser("audit", help="check the service's audit log").add_subparsers(dest="action",
                                                                                            required=True,
                                                                                            action=_Verbs)
    verify = audit.add_parser("verify", help="check every record's hash and link; exit 1 with a line per problem")
    verify.add_argument("path", nargs="?", default=None,
                        help="default: the audit log of the service --name (NAME.service.audit.jsonl in the "
                             "runtime directory, PROTOLINK_RUNTIME_DIR)")
    verify.add_argument("--head", default=None, metavar="sha256:HEX",
                        help="a head printed earlier and kept elsewhere: it must still be in the file (finds the "
                             "last records removed, or the file rewritten)")
    _add_name(verify)


def _audit(args: argparse.Namespace) -> int:
    """``audit verify``: the count and head hash of an intact log, or a line per problem."""
    from .service.audit import verify
    from .service.files import ServiceFiles

    try:
        report = verify(args.path or ServiceFiles.named(args.name).audit, kept_head=args.head)
    except (SandboxError, ValueError) as error:  # no log there, no runtime directory, not a head
        _say(str(error))
        return 1
    if report.intact:
        print(f"{report.path}: intact, {report.count} records, head sha256:{report.head}")
        return 0
    for problem in report.problems:
        print(f"{report.path}: {problem}")
    return 1


def _add_name(verb: argparse.ArgumentParser) -> None:
    verb.add_argument("--name", default=DEFAULT_NAME, type=_name)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    test: list[str] = []
    if argv[:1] == ["ci"]:
        from .ci.command import split_test

        argv, test = split_test(argv)
    parser = _exec_parser() if argv[:1] == ["exec"] else _parser()
    args = parser.parse_args(argv)
    if args.verb == "ci":
        args.test = test
    if args.verb == "exec":
        args.command = args.command[1:] if args.command[:1] == ["--"] else args.command
        if not args.command:
            parser.error("exec needs a command: protolink-sandbox exec -- COMMAND [ARG...]")
        try:
            args.env = command_env(args.env, os.environ)
        except ValueError as error:
            parser.error(str(error))
    if args.verb == "egress" and args.follow and not args.log:
        parser.error("--follow goes with --log")
    if args.verb == "audit":
        return _audit(args)
    if args.verb == "kube-manifest":
        return _kube_manifest(args)
    if args.verb == "ci":
        import logging

        from .ci.command import run as run_ci

        logging.basicConfig(format="protolink-sandbox: %(message)s", level=logging.WARNING)
        with engine_errors("run a CI job"):
            return run_ci(args)
    if args.verb == "serve":
        from .service.daemon import run as serve

        return serve(args)
    if args.verb == "gateway":
        from .gateway import run as gateway

        return gateway(args)
    try:
        with engine_errors(f"{args.verb} appliance {args.name}"):
            if args.verb == "token":
                return _token(args)
            if args.verb == "exec":  # no event loop, no logging set up: it is timed (see _exec)
                return _exec(args)
            import asyncio
            import logging

            logging.basicConfig(format="protolink-sandbox: %(message)s", level=logging.WARNING)
            verb = {"up": _up, "down": _down, "status": _status, "egress": _egress, "service": _service}[args.verb]
            return asyncio.run(verb(args))
    except (SandboxError, ValueError) as error:
        _say(str(error))
        return 1
    except BrokenPipeError:  # what reads the output went away (`status | head -1`)
        return _reader_gone()
    except KeyboardInterrupt:  # how `egress --log --follow` ends
        return 130


def run() -> NoReturn:
    """The ``protolink-sandbox`` command: :func:`main`, then the process ends at once.

    Everything is closed by then; the interpreter's teardown of what the verb loaded (gRPC and
    protobuf add 50-80 ms, measured) would be paid by ``exec`` too, which is timed against
    ``docker exec``.
    """
    code = main()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError:  # a closed pipe: the output could not be written
        code = code or 1
    os._exit(code)


if __name__ == "__main__":
    run()
