"""The pipe connection as both sides speak it: a command's output pipes passed to the host.

The host connects to :data:`SOCKET_NAME` beside the server's Unix socket (a ``SOCK_SEQPACKET``
socket: each message arrives whole). The server greets each connection with its key
(:data:`KEY_BYTES` random bytes) and, attached (``SCM_RIGHTS``), the read end of a pipe of its
own: the proof that the kernel passes its descriptors to this host (gVisor's cannot). An Execute
request that names the key (``pipe_connection``) may then have its process's output passed
there: one :data:`HANDOFF` message, the request's id, with the read ends of its stdout and stderr
pipes attached in that order. The process's ``Finished`` says whether they were
(``output_passed``); its exit status and every other event still come over gRPC.
"""

from __future__ import annotations

import struct

#: The pipe connection's socket in the server's socket directory.
SOCKET_NAME = "pipes.sock"
#: The length of a connection's key.
KEY_BYTES = 16
#: A hand-off: the id of the request whose stdout and stderr read ends are attached.
HANDOFF = struct.Struct("!Q")
#: Descriptors a hand-off carries: stdout's read end, then stderr's.
HANDED_FDS = 2
