"""What the service keeps of its forwarded calls: those in flight to one target
(:class:`InFlight`, which a deleted or lost sandbox ends at once) and the commands of one Execute
call (:class:`Commands`, whose start and end become events)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.message import DecodeError

from protolink.wire._pb import process_pb2
from protolink.wire.output_events import read_output_event

from .events import Events


#: The error of a command whose Execute call ended before it did.
CALL_ENDED = "its call ended before it did: the command was killed"


class InFlight:
    """The forwarded calls in flight to one target; :meth:`end` ends them all at once."""

    def __init__(self) -> None:
        self._calls: set[Any] = set()
        self.ended: Exception | None = None

    def __len__(self) -> int:
        return len(self._calls)

    def add(self, call: Any) -> None:
        """Count ``call`` in; it is canceled at once when the calls have ended already."""
        self._calls.add(call)
        if self.ended is not None:
            call.cancel()

    def discard(self, call: Any) -> None:
        self._calls.discard(call)

    def end(self, error: Exception) -> None:
        """Cancel every call in flight, and every one added later: each ends its caller's call
        with ``error`` (a typed one: the target was deleted, say)."""
        self.ended = error
        for call in list(self._calls):
            call.cancel()


@dataclass
class _Running:
    argv: list[str]
    cwd: str
    started: float = field(default_factory=time.monotonic)
    output_bytes: int = 0
    open_pipes: int = 0  # its output's pipes still being passed on (:meth:`Commands.piping`)
    ended: dict[str, Any] | None = None  # what its end says, once it has ended with pipes open


class Commands:
    """The processes of one forwarded Execute call, followed from their requests to their end.

    Each is followed from the moment its request is seen; its events are ``command.started`` and
    ``command.ended``, which :meth:`call_ended` gives the ones still running when the call ends
    (the sandbox kills them then). A process whose output pipes are passed on ends once they
    have been (its output counted whole)."""

    def __init__(self, events: Events, tenant: str, sandbox: str) -> None:
        self.events, self.tenant, self.sandbox = events, tenant, sandbox
        self.running: dict[int, _Running] = {}
        self._piping: dict[int, _Running] = {}  # ended, its pipes still being passed on

    @property
    def busy(self) -> bool:
        """Whether a process runs, or an ended one's output is still passed on."""
        return bool(self.running or self._piping)

    def request(self, data: bytes) -> None:
        try:
            request = process_pb2.ExecuteRequest.FromString(data)
        except DecodeError:
            return
        self.started(request)

    def started(self, request: process_pb2.ExecuteRequest) -> None:
        if request.cancel or request.HasField("input"):  # no command starts
            return
        self.running[request.id] = _Running(list(request.argv), request.cwd)
        self._emit("command.started", id=request.id, argv=list(request.argv), cwd=request.cwd)

    def piping(self, request_id: int, pipes: int) -> None:
        """``pipes`` of the process's output pipes are being passed on: it ends once each has
        been (:meth:`piped`)."""
        if (running := self.running.get(request_id)) is not None:
            running.open_pipes += pipes

    def output(self, request_id: int, size: int) -> None:
        """``size`` bytes of the process's output went on through a pipe."""
        if (running := self.running.get(request_id) or self._piping.get(request_id)) is not None:
            running.output_bytes += size

    def piped(self, request_id: int) -> None:
        """One of the process's pipes has been passed on to its end."""
        running = self.running.get(request_id) or self._piping.get(request_id)
        if running is None:
            return
        running.open_pipes -= 1
        if running.open_pipes == 0 and running.ended is not None:
            del self._piping[request_id]
            self._ended(request_id, running, **running.ended)

    def event(self, data: bytes) -> None:
        if (output := read_output_event(data)) is not None:  # counted without copying its bytes
            if (running := self.running.get(output.id)) is not None:
                running.output_bytes += len(output.data)
            return
        try:
            event = process_pb2.ExecuteEvent.FromString(data)
        except DecodeError:
            return
        running = self.running.get(event.id)
        if running is None:
            return
        which = event.WhichOneof("event")
        if which == "output":
            running.output_bytes += len(event.output.data)
        elif which in ("finished", "error"):
            del self.running[event.id]
            finished = event.finished
            exited = which == "finished" and finished.HasField("exit_code")
            ended = {"exit_code": finished.exit_code if exited else None,
                     "duration_seconds": time.monotonic() - running.started, "timed_out": finished.timed_out,
                     "error": event.error.message if which == "error" else None}
            if running.open_pipes:
                running.ended = ended
                self._piping[event.id] = running
            else:
                self._ended(event.id, running, **ended)

    def call_ended(self) -> None:
        """The call has ended (its caller gone, its sandbox deleted or lost): each command still
        running ends with it, killed by the sandbox, and is reported so."""
        for request_id, running in self.running.items():
            self._ended(request_id, running, exit_code=None, duration_seconds=time.monotonic() - running.started,
                        timed_out=False, error=CALL_ENDED)
        self.running.clear()

    def _ended(self, request_id: int, running: _Running, **fields: Any) -> None:
        self._emit("command.ended", id=request_id, argv=running.argv, cwd=running.cwd,
                   output_bytes=running.output_bytes, **fields)

    def _emit(self, kind: str, **fields: Any) -> None:
        self.events.emit(kind, self.tenant, self.sandbox, **fields)
