"""Where one ``CONNECT`` through the egress daemon's code spends its time, on the host alone.

No container: a stand-in relay hands a loopback listener to the daemon's real
:class:`~protolink.sandbox.egress.service.EgressService` (its dialer accepts from it, its proxy
decides and splices, every event goes to a real :class:`~.eventlog.EventLog`), and a client in
another process opens connections one after another through it to a loopback server::

    python bench/egress_phases.py [--connections 200] [--name localhost] [--nice 0]

The client stamps its side (connect, ``CONNECT`` answered, first byte), the daemon's code is
stamped where its steps end (accepted, handled, head read, resolved, decided, upstream connected,
answer written); both use the same monotonic clock. Printed: the median of each step, from the
client's connect. ``--name`` asks for a name (resolved by the proxy) instead of the address.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import types
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from protolink.net.addresses import IPAddress  # noqa: E402
from protolink.net.network import Streams, SystemNetwork, use_network  # noqa: E402
from protolink.sandbox.egress import proxy as proxy_module  # noqa: E402
from protolink.sandbox.egress.eventlog import EventLog  # noqa: E402
from protolink.sandbox.egress.policy import EGRESS_ADDRESS_RULES, EgressLimits, EgressPolicy  # noqa: E402
from protolink.sandbox.egress.service import EgressService  # noqa: E402
from protolink.wire.egress import HANDOVER, SOCKET_NAME  # noqa: E402

EGRESS_BENCH = Path(__file__).with_name("egress.py")

#: Stamps of the daemon's code, one list per step, in the order connections came.
stamps: dict[str, list[float]] = {}


def stamp(step: str) -> None:
    stamps.setdefault(step, []).append(time.perf_counter())


class TimedNetwork(SystemNetwork):
    """The system's network, stamped where a lookup and a connection end."""

    async def resolve(self, host: str, port: int) -> Sequence[str]:
        answer = await super().resolve(host, port)
        stamp("resolved")
        return answer

    async def connect(self, address: IPAddress, port: int, *, server_name: str | None) -> Streams:
        streams = await super().connect(address, port, server_name=server_name)
        stamp("upstream connected")
        return streams


def instrument() -> None:
    """Stamp the daemon's steps by wrapping them (the bench's own process only)."""
    from protolink.net.join import Join
    from protolink.sandbox.egress.dialer import RelayDialer

    serve, handle, decide, run = RelayDialer._serve, proxy_module.EgressProxy.handle, \
        proxy_module.EgressProxy._decide, Join.run
    read_request = proxy_module.read_request

    def timed_serve(self, sock):  # type: ignore[no-untyped-def]
        stamp("accepted")
        return serve(self, sock)

    async def timed_handle(self, *args):  # type: ignore[no-untyped-def]
        stamp("handled")
        return await handle(self, *args)

    async def timed_read(*args):  # type: ignore[no-untyped-def]
        request = await read_request(*args)
        stamp("head read")
        return request

    async def timed_decide(self, request):  # type: ignore[no-untyped-def]
        addresses = await decide(self, request)
        stamp("decided")
        return addresses

    @types.coroutine
    def timed_run(self, **kwargs):  # type: ignore[no-untyped-def]
        steps = run(self, **kwargs).__await__()
        try:
            value = next(steps)  # its first step writes the answer
        except StopIteration as stop:
            stamp("answer written")
            return stop.value
        stamp("answer written")
        while True:
            try:
                try:
                    sent = yield value
                except BaseException as error:  # noqa: BLE001 (passed on to the join)
                    value = steps.throw(error)
                else:
                    value = steps.send(sent)
            except StopIteration as stop:
                return stop.value

    from protolink.net import network as network_module
    connected = network_module._connected

    async def timed_connected(*args):  # type: ignore[no-untyped-def]
        stamp("connect called")
        sock = await connected(*args)
        stamp("upstream socket connected")
        return sock

    network_module._connected = timed_connected  # type: ignore[assignment]
    RelayDialer._serve = timed_serve  # type: ignore[method-assign]
    proxy_module.EgressProxy.handle = timed_handle  # type: ignore[method-assign]
    proxy_module.EgressProxy._decide = timed_decide  # type: ignore[method-assign]
    proxy_module.read_request = timed_read  # type: ignore[assignment]
    Join.run = timed_run  # type: ignore[method-assign]


def stand_in_relay(path: Path, listener: socket.socket) -> threading.Thread:
    """Accept standby connections at ``path``; hand ``listener`` over on the first, keep the others."""
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind(str(path))
    unix.listen(16)
    kept: list[socket.socket] = []

    def relay() -> None:
        import array
        while True:
            try:
                standby, _ = unix.accept()
            except OSError:
                return
            if not kept:
                standby.sendmsg([HANDOVER], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                              array.array("i", [listener.fileno()]))])
            kept.append(standby)

    thread = threading.Thread(target=relay, daemon=True)
    thread.start()
    return thread


def client(host: str, port: int, proxy_port: int, count: int) -> None:
    """``count`` connections one after another: absolute stamps of each (start, connected, CONNECT
    answered, first byte), as JSON."""
    found = []
    for _ in range(count):
        started = time.perf_counter()
        sock = socket.create_connection(("127.0.0.1", proxy_port))
        connected = time.perf_counter()
        sock.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            data = sock.recv(4096)
            if not data:
                sys.exit(f"the proxy closed the tunnel: {head!r}")
            head += data
        if not head.startswith(b"HTTP/1.1 200"):
            sys.exit(f"refused: {head!r}")
        answered = time.perf_counter()
        sock.sendall(f"GET /bytes/1 HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n".encode())
        sock.recv(4096)
        first = time.perf_counter()
        while sock.recv(4096):
            pass
        sock.close()
        found.append([started, connected, answered, first])
        time.sleep(0.005)  # the pace of a client doing something between connections
    print(json.dumps(found))


async def measure(args: argparse.Namespace, server_port: int, scratch: Path) -> None:
    host = args.name or "127.0.0.1"
    rule = f"{host}:{server_port}" if args.name else f"127.0.0.1/32:{server_port}"
    policy = EgressPolicy.parse([rule], addresses=EGRESS_ADDRESS_RULES.allowing("127.0.0.0/8", "::1/128"),
                                limits=EgressLimits(max_connections_per_second=1000.0))
    listener = socket.create_server(("127.0.0.1", 0), backlog=1024)
    stand_in_relay(scratch / SOCKET_NAME, listener)
    events = EventLog(scratch / "events.jsonl")
    write = events.write

    def timed_write(event):  # type: ignore[no-untyped-def]
        if event.kind == "allowed":
            stamp("allowed: writing")
        write(event)
        if event.kind == "allowed":
            stamp("allowed: written")

    events.write = timed_write  # type: ignore[method-assign]
    with use_network(TimedNetwork()):
        service = await EgressService.start(scratch, policy, sandbox="phases", on_event=events.write)
    try:
        await asyncio.sleep(0.2)  # the listener handed over
        process = await asyncio.create_subprocess_exec(
            "nice", "-n", str(args.nice), sys.executable, __file__, "client", host, str(server_port),
            str(listener.getsockname()[1]), str(args.connections), stdout=subprocess.PIPE)
        out, _ = await process.communicate()
    finally:
        await service.aclose()
        events.close()
    report(json.loads(out))


def report(client_stamps: list[list[float]]) -> None:
    count = len(client_stamps)
    steps = [step for step in ("accepted", "handled", "head read", "resolved", "decided", "allowed: writing", "allowed: written", "connect called",
                               "upstream socket connected", "upstream connected",
                               "answer written") if len(stamps.get(step, ())) == count]
    load = os.getloadavg()
    print(f"{count} connections, load {load[0]:.2f}; medians from the client's connect call, ms:")
    rows = [("client: connected", [c[1] - c[0] for c in client_stamps])]
    rows += [(f"daemon: {step}", [stamps[step][i] - c[0] for i, c in enumerate(client_stamps)]) for step in steps]
    rows += [("client: CONNECT answered", [c[2] - c[0] for c in client_stamps]),
             ("client: first byte", [c[3] - c[0] for c in client_stamps])]
    previous = 0.0
    for label, values in rows:
        median = statistics.median(values) * 1e3
        print(f"  {label:<32}{median:8.3f}  (+{median - previous:.3f})")
        previous = median


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=200)
    parser.add_argument("--name", help="CONNECT to this name (resolved by the proxy), e.g. localhost")
    parser.add_argument("--nice", type=int, default=0, help="the client's nice level (the sandbox's: 19)")
    args = parser.parse_args()
    instrument()
    server = subprocess.Popen([sys.executable, str(EGRESS_BENCH), "serve"], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        with tempfile.TemporaryDirectory(prefix="protolink-bench-phases-") as scratch:
            asyncio.run(measure(args, port, Path(scratch)))
    finally:
        server.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(5)


if __name__ == "__main__":
    if sys.argv[1:2] == ["client"]:
        client(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    else:
        main()
