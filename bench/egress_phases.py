"""Where one ``CONNECT`` through the egress daemon's code spends its time, on the host alone.

No container: the real relay (:class:`protolink_sandboxd.egress_relay.EgressRelay`, in this
process) hands its loopback listener to the daemon's real
:class:`~protolink.sandbox.egress.service.EgressService` (its dialer accepts from it, its proxy
decides and splices, every event goes to a real :class:`~.eventlog.EventLog`), and a client in
another process opens connections one after another through it to a loopback server. As root
(the relay binds its socket as the directory's owner)::

    python bench/egress_phases.py [--connections 200] [--name localhost] [--nice 0]

The client stamps its side (connect, ``CONNECT`` answered, first byte), the daemon's code is
stamped where its steps end (accepted, handled, head read, resolved, decided, upstream connected,
answer written and tunnel open, ``allowed`` event written); both use the same monotonic clock. Printed: the median of each step, from the
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
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from protolink_sandboxd.egress_relay import EgressRelay  # noqa: E402

from protolink.net.addresses import IPAddress  # noqa: E402
from protolink.net.network import SystemNetwork, use_network  # noqa: E402
from protolink.sandbox.egress import proxy as proxy_module  # noqa: E402
from protolink.sandbox.egress.eventlog import EventLog  # noqa: E402
from protolink.sandbox.egress.policy import EGRESS_ADDRESS_RULES, EgressLimits, EgressPolicy  # noqa: E402
from protolink.sandbox.egress.service import EgressService  # noqa: E402
from protolink.net.tunnel import Tunnel  # noqa: E402
from protolink.wire.egress import SOCKET_NAME  # noqa: E402

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

    async def connect_tcp(self, address: IPAddress, port: int) -> socket.socket:
        stamp("connect called")
        sock = await super().connect_tcp(address, port)
        stamp("upstream connected")
        return sock


def instrument() -> None:
    """Stamp the daemon's steps by wrapping them (the bench's own process only)."""
    from protolink.sandbox.egress.dialer import RelayDialer

    serve, handle, decide, open_tunnel = RelayDialer._serve, proxy_module.EgressProxy.handle, \
        proxy_module.EgressProxy._decide, Tunnel.open
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

    async def timed_open(self, **kwargs):  # type: ignore[no-untyped-def]
        await open_tunnel(self, **kwargs)  # the answer is its first write
        stamp("answer written, tunnel open")

    RelayDialer._serve = timed_serve  # type: ignore[method-assign]
    proxy_module.EgressProxy.handle = timed_handle  # type: ignore[method-assign]
    proxy_module.EgressProxy._decide = timed_decide  # type: ignore[method-assign]
    proxy_module.read_request = timed_read  # type: ignore[assignment]
    Tunnel.open = timed_open  # type: ignore[method-assign]


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
    relay = EgressRelay(0, str(scratch / SOCKET_NAME), command_uid=65534)
    await relay.start()
    events = EventLog(scratch / "events.jsonl")
    write = events.write

    def timed_write(event):  # type: ignore[no-untyped-def]
        if event.kind == "allowed":
            stamp("allowed: writing")
        write(event)
        if event.kind == "allowed":
            stamp("allowed: written")

    events.write = timed_write  # type: ignore[method-assign]
    try:
        with use_network(TimedNetwork()):
            service = await EgressService.start(scratch, policy, sandbox="phases", on_event=events.write)
        try:
            while not relay.handed_over:  # the host accepts the commands' connections itself
                await asyncio.sleep(0.01)
            process = await asyncio.create_subprocess_exec(
                "nice", "-n", str(args.nice), sys.executable, __file__, "client", host, str(server_port),
                str(relay.port), str(args.connections), stdout=subprocess.PIPE)
            out, _ = await process.communicate()
        finally:
            await service.aclose()
    finally:
        await relay.aclose()
        events.close()
    report(json.loads(out))


def report(client_stamps: list[list[float]]) -> None:
    count = len(client_stamps)
    steps = [step for step in ("accepted", "handled", "head read", "resolved", "decided", "connect called",
                               "upstream connected", "answer written, tunnel open", "allowed: writing",
                               "allowed: written") if len(stamps.get(step, ())) == count]
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
