"""The egress link as both sides speak it: the host dials the relay's Unix socket
(:data:`SOCKET_NAME` in the channel directory) and waits; the relay writes :data:`HANDOVER`
when it gives the host something on that connection. Attached to it (``SCM_RIGHTS``): the
relay's loopback listeners, which the host then accepts from itself, or one command's
connection. With nothing attached (where the kernel cannot pass sockets: gVisor), the
command's bytes follow on that connection unchanged both ways."""

from __future__ import annotations

#: The relay's Unix socket in the channel directory, beside the server's.
SOCKET_NAME = "egress.sock"
#: What the relay writes on a standby connection when it hands the host its listeners or a command's connection.
HANDOVER = b"\x01"
