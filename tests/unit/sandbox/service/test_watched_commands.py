"""What the service reports of a forwarded Execute call's commands (:class:`~protolink.sandbox.service.watched.Commands`):
a request that feeds a running command's standard input starts no command, and the command it
feeds is reported once, as it ran."""

from __future__ import annotations

from protolink.sandbox.service.events import Events, ServiceEvent
from protolink.sandbox.service.watched import Commands
from protolink.wire._pb import process_pb2
from protolink.wire.output_events import output_event


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


def test_a_commands_output_bytes_are_counted_in_every_layout_of_its_events():
    recorded = Recorded()
    commands = Commands(Events([recorded]), "tenant", "sandbox")
    commands.request(process_pb2.ExecuteRequest(id=4, argv=["/bin/sh"], cwd="/ws").SerializeToString())
    commands.event(output_event(4, 1, b"x" * 300_000))  # as a sandbox writes it
    commands.event(process_pb2.ExecuteEvent(id=4, output=process_pb2.Output(channel=2, data=b"yz")).SerializeToString())
    commands.event(output_event(5, 1, b"not this command's"))
    commands.event(process_pb2.ExecuteEvent(id=4, finished=process_pb2.Finished(exit_code=0)).SerializeToString())
    assert recorded.events[-1].fields["output_bytes"] == 300_002
