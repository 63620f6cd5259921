"""The keepalives of the contract: those its clients send, and those its servers send and accept.

Clients of the contract (:class:`~protolink.sandbox.client.SandboxBackend`) ping every
:data:`PING_SECONDS` while a call runs, to find a frozen or vanished peer; gRPC's default server
refuses pings more often than every 5 minutes without data and ends the connection ("too many
pings") after two. The sandbox's server and the sandbox service, which forwards those clients'
calls, both accept them.
"""

from __future__ import annotations

#: How often a client pings while a call is open: the grpcio channel's keepalives, and those of
#: the calls that run on their own stream.
PING_SECONDS = 2.0
#: How long a client waits for a ping's answer while nothing else arrives. A server in a sandbox
#: whose memory is full waits for the kernel's reclaim with its commands, seconds on a busy host:
#: slow is not gone.
PING_TIMEOUT_SECONDS = 6.0

#: A client channel's keepalives: while calls are in flight, a peer that stops answering pings
#: (a frozen or vanished sandbox) fails them within seconds instead of at their deadlines.
CLIENT_KEEPALIVE_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.keepalive_time_ms", int(PING_SECONDS * 1000)),
    ("grpc.keepalive_timeout_ms", int(PING_TIMEOUT_SECONDS * 1000)),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.http2.ping_timeout_ms", int(PING_TIMEOUT_SECONDS * 1000)),
)

#: The server's own pings (to find a vanished client), and the clients' pings it accepts.
SERVER_KEEPALIVE_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 1_000),
    ("grpc.http2.max_ping_strikes", 0),
)
