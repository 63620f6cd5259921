"""``protolink-sandbox exec``'s own client (:mod:`protolink.sandbox.exec_client`): the same
messages as the generated code, the same checks as the grpcio client against a server that
lies, and a clean refusal of what is not HTTP/2, or not the gRPC it should be."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import hpack
import pytest

from protolink.errors import (
    SandboxNotReachedError,
    SandboxProtocolError,
    SandboxUnavailableError,
    ToolExecutionError,
)
from protolink.execution.process_types import ProcessSpec
from protolink.sandbox import client, exec_client, grpc_call, hpack_codec, process_stream, records
from protolink.sandbox.exec_client import Command, execute
from protolink.wire import convert
from protolink.wire._pb import errors_pb2, process_pb2
from tests.unit.sandbox import test_untrusted_answers
from tests.unit.sandbox.test_untrusted_answers import Script, finished, output, serving, started

COMMAND = Command(argv=("/bin/echo", "ünï", ""), cwd="/ws", env={"PATH": "/bin", "LANG": "C.UTF-8"},
                  timeout_seconds=2.5, max_output_bytes=100)


# The messages are the generated code's -------------------------------------------------------


def test_the_request_is_the_one_the_grpcio_client_sends():
    spec = ProcessSpec(tuple(COMMAND.argv), COMMAND.cwd, COMMAND.env, COMMAND.timeout_seconds,
                       COMMAND.max_output_bytes)
    expected = convert.execute_request(spec)
    expected.id = 1
    assert process_pb2.ExecuteRequest.FromString(exec_client.execute_request(COMMAND)) == expected
    negative = process_pb2.ExecuteRequest.FromString(exec_client.execute_request(COMMAND._replace(max_output_bytes=-1)))
    assert negative.max_output_bytes == -1  # refused by the server, as the grpcio client's is


def test_the_requests_of_standard_input_are_the_generated_codes():
    spec = ProcessSpec(tuple(COMMAND.argv), COMMAND.cwd, COMMAND.env, COMMAND.timeout_seconds,
                       COMMAND.max_output_bytes)
    expected = convert.execute_request(spec)
    expected.id, expected.stdin = 1, True
    assert process_pb2.ExecuteRequest.FromString(exec_client.execute_request(COMMAND, stdin=True)) == expected
    for data, close in [(bytes(range(256)), False), (b"last", True), (b"", True), (b"", False)]:
        generated = process_pb2.ExecuteRequest(id=1, input=process_pb2.Input(data=data, close=close))
        assert exec_client.input_request(data, close=close) == generated.SerializeToString()


def test_text_that_cannot_be_sent_is_a_value_error():
    with pytest.raises(ValueError, match="cannot send this request"):
        exec_client.execute_request(COMMAND._replace(argv=("/bin/echo", "\udcff")))


@pytest.mark.parametrize("event", [
    process_pb2.ExecuteEvent(id=1, started=process_pb2.Started()),
    process_pb2.ExecuteEvent(id=1, keepalive=process_pb2.Keepalive()),
    process_pb2.ExecuteEvent(id=1, output=process_pb2.Output(channel=2, data=bytes(range(256)))),
    process_pb2.ExecuteEvent(id=1, output=process_pb2.Output(channel=1, data=b"")),
    process_pb2.ExecuteEvent(id=1, finished=process_pb2.Finished(exit_code=-9, timed_out=True, duration_seconds=1.5)),
    process_pb2.ExecuteEvent(id=1, finished=process_pb2.Finished(truncated=True)),
    process_pb2.ExecuteEvent(id=1, finished=process_pb2.Finished(exit_code=0)),
    process_pb2.ExecuteEvent(id=1, error=errors_pb2.Error(kind=11, message="could not start", errno=2)),
], ids=["started", "keepalive", "output", "empty-output", "killed", "no-exit-code", "exit-0", "error"])
def test_events_read_as_the_generated_code_reads_them(event):
    kind, body = exec_client.parse_event(event.SerializeToString())
    assert kind == event.WhichOneof("event")
    if kind == "output":
        assert exec_client.parse_output(body) == (event.output.channel, event.output.data)
    elif kind == "finished":
        facts = convert.finished_facts(event.finished)
        assert exec_client.parse_finished(body) == (facts["exit_code"], facts["truncated"], facts["timed_out"])
    elif kind == "error":
        assert errors_pb2.Error.FromString(body) == event.error


@pytest.mark.parametrize("facts", [{"exit_code": 256}, {"exit_code": -256}, {"duration_seconds": math.nan},
                                   {"duration_seconds": -1.0}, {"duration_seconds": math.inf}])
def test_a_finished_event_is_refused_where_the_grpcio_client_refuses_it(facts):
    message = process_pb2.Finished(**facts)
    with pytest.raises(ValueError):
        convert.finished_facts(message)
    with pytest.raises(SandboxProtocolError, match="invalid answer"):
        exec_client.parse_finished(message.SerializeToString())


@pytest.mark.parametrize("data", [b"\x0a\x05ab", b"\x28", b"\x0b", b"\x00\x01", b"\x2a\x01x"],
                         ids=["short-field", "short-varint", "group", "field-zero", "id-as-bytes"])
def test_an_event_that_does_not_parse_is_refused(data):
    with pytest.raises(SandboxProtocolError, match="does not parse"):
        exec_client.parse_event(data)


def test_the_bounds_and_numbers_are_those_of_the_grpcio_client_and_the_schema():
    assert exec_client.IDLE_SECONDS == process_stream.IDLE_SECONDS
    assert exec_client.GRACE_SECONDS == client.EXECUTE_GRACE_SECONDS
    assert exec_client.EXIT_CODES == convert.EXIT_CODES
    assert (exec_client.STDOUT, exec_client.STDERR) == (process_pb2.CHANNEL_STDOUT, process_pb2.CHANNEL_STDERR)
    oneof = process_pb2.ExecuteEvent.DESCRIPTOR.oneofs_by_name["event"]
    assert exec_client.EVENT_KINDS == {field.number: field.name for field in oneof.fields}
    assert process_pb2.ExecuteEvent.DESCRIPTOR.fields_by_name["id"].number == 5


# HPACK -------------------------------------------------------------------------------------


def test_the_static_table_is_rfc_7541s():
    assert hpack_codec.STATIC_TABLE == tuple(hpack.table.HeaderTable.STATIC_TABLE)


def test_header_blocks_decode_as_hpack_encodes_them_huffman_and_dynamic_table_included():
    encoder = hpack.Encoder()
    decoder = hpack_codec.Decoder(1 << 16)
    blocks = [[(b":status", b"200"), (b"content-type", b"application/grpc"), (b"grpc-accept-encoding", b"gzip")],
              [(b"grpc-status", b"5"), (b"grpc-message", b"not%20found \xc3\xa9"), (b"x-bin", b"AAEC")],
              [(b"content-type", b"application/grpc"), (b"grpc-accept-encoding", b"gzip")]]
    for huffman in (True, False):
        for headers in blocks:
            assert decoder.decode(encoder.encode(headers, huffman=huffman)) == headers
    assert hpack.Decoder().decode(hpack_codec.encode(blocks[1]), raw=True) == blocks[1]


@pytest.mark.parametrize("block", [b"\x80", b"\xff\x00", b"\x10\x7f", b"\x10\x03ab", b"\x3f\xe2\x1f",
                                   b"\x1f\xff\xff\xff\xff\xff"],
                         ids=["index-0", "index-past-tables", "long-string", "short-string", "table-too-large",
                              "huge-integer"])
def test_a_header_block_that_does_not_decode_is_refused(block):
    with pytest.raises(hpack_codec.HeaderError):
        hpack_codec.Decoder(1 << 16).decode(block)


def test_a_header_list_past_its_bound_is_refused():
    block = hpack.Encoder().encode([(b"x-big", b"y" * 200)], huffman=False)
    with pytest.raises(hpack_codec.HeaderError, match="exceeds 100 bytes"):
        hpack_codec.Decoder(100).decode(block)


# Against a gRPC server that lies (grpcio's, scripted) ----------------------------------------


def run(address: str, tmp_path: Path, command: Command = COMMAND) -> tuple[exec_client.Outcome, bytes, bytes]:
    """``command`` through the exec client, its output written to two files, read back."""
    paths = tmp_path / "out", tmp_path / "err"
    fds = [os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600) for path in paths]
    try:
        outcome = execute(address, None, command, outputs={1: fds[0], 2: fds[1]})
    finally:
        for fd in fds:
            os.close(fd)
    return outcome, paths[0].read_bytes(), paths[1].read_bytes()


@pytest.fixture
async def fake(tmp_path: Path) -> Iterator[tuple[Script, str]]:
    script, address = Script(), f"unix://{tmp_path / 'fake.sock'}"
    async with serving(script, address):
        yield script, address


async def test_output_is_passed_through_and_cut_at_the_cap_whatever_the_server_claims(fake, tmp_path):
    script, address = fake
    script.events = [started(), output("x" * 60), output("é" * 30, 2), output("z" * 60), finished(exit_code=3)]
    outcome, stdout, stderr = await asyncio.to_thread(run, address, tmp_path)
    assert outcome == exec_client.Outcome(exit_code=3, timed_out=False, truncated=True)
    assert (stdout, stderr) == (b"x" * 60, "é".encode() * 20)


#: The event streams the grpcio client refuses (its test's cases): this client refuses them too.
REFUSED = next(mark for mark in test_untrusted_answers.test_a_malformed_event_stream_is_a_protocol_error.pytestmark
               if mark.name == "parametrize")


@pytest.mark.parametrize(*REFUSED.args, **REFUSED.kwargs)
async def test_events_out_of_order_or_shape_are_a_protocol_error(fake, tmp_path, events):
    script, address = fake
    script.events = events
    with pytest.raises(SandboxProtocolError):
        await asyncio.to_thread(run, address, tmp_path)


async def test_an_event_larger_than_the_cap_allows_is_refused(fake, tmp_path):
    script, address = fake
    script.events = [started(), output("x" * (COMMAND.max_output_bytes + exec_client.EVENT_OVERHEAD_BYTES))]
    with pytest.raises(SandboxProtocolError, match="message of"):
        await asyncio.to_thread(run, address, tmp_path)


async def test_an_error_event_raises_the_servers_error_as_its_own_type(fake, tmp_path):
    script, address = fake
    script.events = [process_pb2.ExecuteEvent(error=errors_pb2.Error(kind=11, message="could not start 'x'"))]
    with pytest.raises(ToolExecutionError, match="could not start 'x'"):
        await asyncio.to_thread(run, address, tmp_path)


async def test_a_failed_call_is_the_status_the_server_sent_never_a_call_to_repeat(fake, tmp_path):
    script, address = fake
    script.unsent = 1  # answers UNAVAILABLE as if the call had never been sent: this client did send it
    with pytest.raises(SandboxUnavailableError, match="UNAVAILABLE") as raised:
        await asyncio.to_thread(run, address, tmp_path)
    assert not isinstance(raised.value, SandboxNotReachedError)


async def test_a_server_that_goes_silent_is_given_up(fake, tmp_path, monkeypatch):
    script, address = fake
    script.events, script.then_silence = [started()], True
    monkeypatch.setattr(exec_client, "IDLE_SECONDS", 0.5)
    with pytest.raises(SandboxUnavailableError, match="sent nothing for 0.5 seconds"):
        await asyncio.to_thread(run, address, tmp_path)


def test_nothing_listening_is_not_reached(tmp_path):
    with pytest.raises(SandboxNotReachedError):
        run(f"unix://{tmp_path / 'none.sock'}", tmp_path)


# Against a server that is not HTTP/2, or breaks it (a raw socket) ----------------------------


def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream.to_bytes(4, "big") + payload


ANSWER = frame(4, 0, 0, b"") + frame(1, 4, 1, hpack_codec.encode([(b":status", b"200"),
                                                                   (b"content-type", b"application/grpc")]))


def message(data: bytes) -> bytes:
    return b"\0" + struct.pack(">I", len(data)) + data


@contextlib.contextmanager
def one_connection(path: Path, serve: Callable[[socket.socket], None]) -> Iterator[str]:
    """The address of a Unix socket at ``path`` whose one connection ``serve`` answers, in a thread."""
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen()

    def accept() -> None:
        connection, _ = listener.accept()
        with connection:
            serve(connection)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"unix://{path}"
    finally:
        listener.close()
        thread.join(timeout=30)


@pytest.fixture
def raw_server(tmp_path: Path) -> Iterator[tuple[str, list[bytes]]]:
    """A Unix socket that answers one connection with the bytes the test puts in its list."""
    answer: list[bytes] = []

    def serve(connection: socket.socket) -> None:
        connection.recv(1 << 16)
        connection.sendall(b"".join(answer))
        connection.shutdown(socket.SHUT_WR)
        while connection.recv(1 << 16):
            pass

    with one_connection(tmp_path / "raw.sock", serve) as address:
        yield address, answer


@pytest.mark.parametrize(("answer", "problem"), [
    (b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n", "frame of"),
    (b"\x20\x00\x00" + b"\x00\x00" + b"\x00\x00\x00\x01", "frame of 2097152 bytes"),
    (frame(0x20, 0, 0, b"??"), "unexpected type 32"),
    (frame(5, 4, 1, b"\x00\x00\x00\x02"), "unexpected type 5"),
    (frame(1, 4, 1, hpack_codec.encode([(b":status", b"404")])), "HTTP status '404'"),
    (frame(1, 4, 1, b"\xff\x00"), "do not decode"),
    (ANSWER + frame(0, 0, 1, b"\0" + struct.pack(">I", 1 << 30)), "message of 1073741824 bytes"),
    (ANSWER + frame(0, 0, 1, b"\1" + struct.pack(">I", 1) + b"x"), "compressed"),
    (ANSWER + frame(0, 0, 1, message(b"\xff\xff")), "does not parse"),
    (ANSWER + frame(0, 0, 1, message(b"\x28\x01\x32\x02\xff\xff")), "malformed Error"),
    (ANSWER + frame(0, 1, 1, b"\0\0"), "inside a message"),
    (ANSWER + frame(0, 0, 3, message(b"")), "outside its answer"),
    (ANSWER + frame(1, 5, 1, hpack_codec.encode([(b"grpc-status", b"x")])), "without a valid status"),
    (frame(4, 0, 0, b"\x00\x04\xff\xff\xff\xff"), "invalid window size"),
    (frame(6, 0, 0, b"short"), "malformed PING"),
], ids=["http-1", "oversized-frame", "unknown-type", "push", "not-200", "bad-hpack", "oversized-message",
        "compressed", "garbled-event", "garbled-error", "cut-message", "other-stream", "bad-status", "bad-window", "bad-ping"])
def test_what_is_not_the_grpc_it_should_be_is_refused_cleanly(raw_server, tmp_path, answer, problem):
    address, answers = raw_server
    answers.append(answer)
    with pytest.raises(SandboxProtocolError, match=problem):
        run(address, tmp_path)


@pytest.mark.parametrize("answer", [b"", ANSWER, ANSWER + frame(7, 0, 0, struct.pack(">II", 0, 2)),
                                    ANSWER + frame(3, 0, 1, struct.pack(">I", 8))],
                         ids=["closed", "closed-mid-answer", "goaway", "reset"])
def test_a_connection_that_ends_or_is_reset_is_unavailable(raw_server, tmp_path, answer):
    address, answers = raw_server
    answers.append(answer)
    with pytest.raises(SandboxUnavailableError):
        run(address, tmp_path)


def test_a_well_formed_answer_over_raw_frames_pings_and_settings_included(raw_server, tmp_path):
    address, answers = raw_server
    events = [process_pb2.ExecuteEvent(id=1, output=process_pb2.Output(channel=1, data=b"\0\xffbin")),
              process_pb2.ExecuteEvent(id=1, finished=process_pb2.Finished(exit_code=0))]
    body = b"".join(message(event.SerializeToString()) for event in events)
    answers.append(ANSWER + frame(6, 0, 0, b"12345678") + frame(0, 8, 1, b"\x02" + body[:7] + b"pp")
                   + frame(0, 0, 1, body[7:]) + frame(1, 5, 1, hpack_codec.encode([(b"grpc-status", b"0")])))
    outcome, stdout, _ = run(address, tmp_path)
    assert (outcome.exit_code, stdout) == (0, b"\0\xffbin")


def test_many_events_in_one_frame_are_each_read(raw_server, tmp_path):
    address, answers = raw_server
    events = [process_pb2.ExecuteEvent(id=1, output=process_pb2.Output(channel=1, data=b"%04d" % n))
              for n in range(20_000)] + [process_pb2.ExecuteEvent(id=1, finished=process_pb2.Finished(exit_code=5))]
    body = b"".join(message(event.SerializeToString()) for event in events)
    assert len(body) > COMMAND.max_output_bytes + exec_client.EVENT_OVERHEAD_BYTES  # more than one message may be
    answers.append(ANSWER + frame(0, 0, 1, body))
    outcome, stdout, _ = run(address, tmp_path)
    assert outcome == exec_client.Outcome(exit_code=5, timed_out=False, truncated=True)
    assert stdout == b"".join(b"%04d" % n for n in range(25))



def test_megabytes_in_frames_of_the_largest_size_arrive_exactly(raw_server, tmp_path):
    address, answers = raw_server
    chunks = [os.urandom(size) for size in (1 << 20, 70_000, (1 << 20) - 3, 5)]
    events = [process_pb2.ExecuteEvent(id=1, output=process_pb2.Output(channel=1 + n % 2, data=chunk))
              for n, chunk in enumerate(chunks)] + [process_pb2.ExecuteEvent(id=1, finished=process_pb2.Finished())]
    body = b"".join(message(event.SerializeToString()) for event in events)
    pieces = [body[at:at + grpc_call.MAX_FRAME_BYTES] for at in range(0, len(body), grpc_call.MAX_FRAME_BYTES)]
    answers.append(ANSWER + frame(6, 0, 0, b"12345678").join(frame(0, 0, 1, piece) for piece in pieces)
                   + frame(1, 5, 1, hpack_codec.encode([(b"grpc-status", b"0")])))
    command = COMMAND._replace(max_output_bytes=sum(map(len, chunks)))
    outcome, stdout, stderr = run(address, tmp_path, command)
    assert (outcome.exit_code, stdout, stderr) == (None, chunks[0] + chunks[2], chunks[1] + chunks[3])

def test_standard_input_goes_out_within_the_window_the_server_grants(tmp_path):
    """A server that grants nothing past HTTP/2's first window (65,535 bytes) gets no more of
    the megabyte on the client's stdin, and the call ends when the command's does."""
    received: list[int] = []

    def serve(connection: socket.socket) -> None:
        connection.settimeout(30)
        stream = connection.makefile("rb")
        assert stream.read(len(grpc_call.PREFACE)) == grpc_call.PREFACE
        data = answered = 0
        while header := stream.read(9):
            payload = stream.read(int.from_bytes(header[:3], "big"))
            data += len(payload) if header[3] == grpc_call.DATA else 0
            if data == grpc_call.DEFAULT_WINDOW_BYTES and not answered:
                answered = 1
                finished = process_pb2.ExecuteEvent(id=1, finished=process_pb2.Finished(exit_code=0))
                connection.sendall(ANSWER + frame(0, 0, 1, message(finished.SerializeToString())))
        received.append(data)

    (tmp_path / "in").write_bytes(os.urandom(1 << 20))
    with (one_connection(tmp_path / "raw.sock", serve) as address, open(tmp_path / "in", "rb") as stdin,
          open(os.devnull, "wb") as out):
        outcome = execute(address, None, COMMAND, outputs={1: out.fileno(), 2: out.fileno()}, stdin=stdin.fileno())
    assert outcome.exit_code == 0 and received == [grpc_call.DEFAULT_WINDOW_BYTES]


# Through the command line --------------------------------------------------------------------

#: Runs the command line, then says which of these modules it loaded.
WITH_MODULES = ("import sys\nfrom protolink.sandbox import cli\ncode = cli.main(sys.argv[1:])\n"
                "print(sorted(m for m in ('asyncio', 'grpc', 'google.protobuf', 'docker') if m in sys.modules), "
                "file=sys.stderr)\nsys.exit(code)")


def exec_through_cli(tmp_path: Path, address: str, monkeypatch: pytest.MonkeyPatch) -> subprocess.CompletedProcess[str]:
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("PROTOLINK_RUNTIME_DIR", str(runtime))
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")  # any question to it would fail
    records.save(records.Record("unit-appliance", "0123456789ab", address), None)
    return subprocess.run([sys.executable, "-c", WITH_MODULES, "exec", "--name", "unit-appliance", "--",
                           "/bin/sh", "-c", "printf 'a\\0b'; exit 3"], capture_output=True, text=True, timeout=120)


async def test_the_command_line_loads_no_grpc_protobuf_or_event_loop(fake, tmp_path, monkeypatch):
    script, address = fake
    script.events = [started(), output("a\0b"), finished(exit_code=3)]
    done = await asyncio.to_thread(exec_through_cli, tmp_path, address, monkeypatch)
    assert (done.returncode, done.stdout, done.stderr) == (3, "a\0b", "[]\n")


def test_the_command_line_refuses_a_garbled_answer_in_one_line(raw_server, tmp_path, monkeypatch):
    address, answers = raw_server
    answers.append(ANSWER + frame(0, 0, 1, message(b"\xff\xff")))
    done = exec_through_cli(tmp_path, address, monkeypatch)
    assert (done.returncode, done.stdout) == (125, "")  # the sandbox's failure, not the command's
    assert done.stderr == "protolink-sandbox: the sandbox sent an answer that does not parse\n[]\n"


@pytest.mark.parametrize("argv", [["exec", "--", "true"], ["exec", "--name", "x", "--cwd", "/ws", "--timeout", "2",
                                                          "--max-output-bytes", "9", "--", "sh", "-c", "exit 1"],
                                  ["exec", "--name", "bad name", "--", "true"], ["exec", "--timeout", "soon", "true"]])
def test_execs_own_parser_reads_the_command_line_as_the_whole_one_does(argv, capsys):
    from protolink.sandbox.cli import _exec_parser, _parser

    answers = []
    for parser in (_exec_parser(), _parser()):
        try:
            answers.append(vars(parser.parse_args(argv)))
        except SystemExit as exit:
            answers.append(exit.code)
            answers.append(capsys.readouterr().err.splitlines()[-1])
    assert answers[:len(answers) // 2] == answers[len(answers) // 2:]
