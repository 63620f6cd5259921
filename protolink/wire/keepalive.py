"""The keepalives a server of the contract sends and accepts.

Clients of the contract (:class:`~protolink.sandbox.client.SandboxBackend`) ping every 2 s while
a call runs, to find a frozen or vanished peer; gRPC's default server refuses pings more often
than every 5 minutes without data and ends the connection ("too many pings") after two. The
sandbox's server and the sandbox service, which forwards those clients' calls, both accept them.
"""

from __future__ import annotations

#: The server's own pings (to find a vanished client), and the clients' pings it accepts.
SERVER_KEEPALIVE_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 1_000),
    ("grpc.http2.max_ping_strikes", 0),
)
