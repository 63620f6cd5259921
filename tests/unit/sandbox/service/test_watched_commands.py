"""What the service reports of a forwarded Execute call's commands (:class:`~protolink.sandbox.service.watched.Commands`):
a request that feeds a running command's standard input starts no command, and the command it
feeds is reported once, as it ran."""

from __future__ import annotations

from protolink.sandbox.service.events import Events, ServiceEvent
from protolink.sandbox.service.watched import Commands
from protolink.wire._pb import process_pb2


class Recorded:
    def __init__(self) -> None:
        self.events: list[ServiceEvent] = []

    def record(self, event: ServiceEvent) -> None:
        self.events.append(event)


def test_input_for_a_running_command_starts_none():
    recorded = Recorded()
    commands = Commands(Events([recorded]), "tenant", "sandbox")
    commands.request(process_pb2.ExecuteRequest(id=1, argv=["/bin/cat"], cwd="/ws", stdin=True).SerializeToString())
    commands.request(process_pb2.ExecuteRequest(id=1, input=process_pb2.Input(data=b"x", close=True)).SerializeToString())
    commands.event(process_pb2.ExecuteEvent(id=1, finished=process_pb2.Finished(exit_code=0)).SerializeToString())
    assert [(event.kind, event.fields["argv"]) for event in recorded.events] == [
        ("command.started", ["/bin/cat"]), ("command.ended", ["/bin/cat"])]
