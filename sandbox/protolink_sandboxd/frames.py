"""The pipe protocol between the server and its worker processes.

A request is a header (method name length, payload length, CPU seconds), the method name and
the request message. A reply is a header (status, payload length) and either the response
message (``OK``) or an ``Error`` message (``ERROR``). A transfer process
(:mod:`protolink_sandboxd.transfer_worker`) also exchanges ``DATA`` frames, each one message of
its stream. Lengths are checked before anything is read into memory.
"""

from __future__ import annotations

import struct

REQUEST = struct.Struct("!BId")
REPLY = struct.Struct("!BI")
OK = 0
ERROR = 1
DATA = 2


def request_frame(method: str, payload: bytes, cpu_seconds: float) -> bytes:
    name = method.encode("ascii")
    return REQUEST.pack(len(name), len(payload), cpu_seconds) + name + payload


def reply_frame(status: int, payload: bytes) -> bytes:
    return REPLY.pack(status, len(payload)) + payload
