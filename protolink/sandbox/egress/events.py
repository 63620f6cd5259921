"""What an egress proxy reports: one :class:`EgressEvent` per decision and per closed connection."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Literal

EventKind = Literal["allowed", "denied", "closed"]


@dataclass(frozen=True)
class EgressEvent:
    """One decision (``allowed`` / ``denied``) or the end of an allowed connection (``closed``).

    ``host`` and ``port`` are the requested target as the client wrote it after normalization
    (lower case; an IP literal in its canonical form), empty and 0 when the connection was refused
    before its request was read (limits). ``address`` is the validated address connected to (or
    chosen), None when there is none. ``reason`` says why it was denied or why it closed:
    ``"eof"`` for a normal end, ``"deny-all"``, ``"policy changed: <why>"``, ``"byte budget"``,
    ``"idle"``, ``"proxy closed"``, ``"cancelled"``, ``"connect failed: ..."``, ``"error: ..."``;
    a denial's reason is the refusal's text, also sent to the client. Byte counts are
    payload relayed (client to server: ``bytes_up``; back: ``bytes_down``); decisions carry 0.
    """

    sandbox: str
    kind: EventKind
    host: str
    port: int
    address: str | None
    bytes_up: int
    bytes_down: int
    duration_seconds: float
    reason: str
    method: str
    timestamp: float = field(default_factory=time.time)
