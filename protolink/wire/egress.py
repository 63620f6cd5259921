"""The egress link as both sides speak it: the host dials the relay's Unix socket
(:data:`SOCKET_NAME` in the channel directory) and waits; the relay writes :data:`HANDOVER`
when it gives that connection a command's, whose bytes follow unchanged both ways."""

from __future__ import annotations

#: The relay's Unix socket in the channel directory, beside the server's.
SOCKET_NAME = "egress.sock"
#: What the relay writes on a standby connection when it hands it a command's connection.
HANDOVER = b"\x01"
