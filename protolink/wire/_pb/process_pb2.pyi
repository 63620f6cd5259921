from protolink.wire._pb import errors_pb2 as _errors_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Channel(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHANNEL_UNSPECIFIED: _ClassVar[Channel]
    CHANNEL_STDOUT: _ClassVar[Channel]
    CHANNEL_STDERR: _ClassVar[Channel]
CHANNEL_UNSPECIFIED: Channel
CHANNEL_STDOUT: Channel
CHANNEL_STDERR: Channel

class ExecuteRequest(_message.Message):
    __slots__ = ("id", "cancel", "argv", "cwd", "env", "timeout_seconds", "max_output_bytes", "resolved_from", "real_executable", "pipe_connection", "stdin", "input")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    ARGV_FIELD_NUMBER: _ClassVar[int]
    CWD_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MAX_OUTPUT_BYTES_FIELD_NUMBER: _ClassVar[int]
    RESOLVED_FROM_FIELD_NUMBER: _ClassVar[int]
    REAL_EXECUTABLE_FIELD_NUMBER: _ClassVar[int]
    PIPE_CONNECTION_FIELD_NUMBER: _ClassVar[int]
    STDIN_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    id: int
    cancel: bool
    argv: _containers.RepeatedScalarFieldContainer[str]
    cwd: str
    env: _containers.ScalarMap[str, str]
    timeout_seconds: float
    max_output_bytes: int
    resolved_from: CommandAsWritten
    real_executable: str
    pipe_connection: bytes
    stdin: bool
    input: Input
    def __init__(self, id: _Optional[int] = ..., cancel: _Optional[bool] = ..., argv: _Optional[_Iterable[str]] = ..., cwd: _Optional[str] = ..., env: _Optional[_Mapping[str, str]] = ..., timeout_seconds: _Optional[float] = ..., max_output_bytes: _Optional[int] = ..., resolved_from: _Optional[_Union[CommandAsWritten, _Mapping]] = ..., real_executable: _Optional[str] = ..., pipe_connection: _Optional[bytes] = ..., stdin: _Optional[bool] = ..., input: _Optional[_Union[Input, _Mapping]] = ...) -> None: ...

class Input(_message.Message):
    __slots__ = ("data", "close")
    DATA_FIELD_NUMBER: _ClassVar[int]
    CLOSE_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    close: bool
    def __init__(self, data: _Optional[bytes] = ..., close: _Optional[bool] = ...) -> None: ...

class CommandAsWritten(_message.Message):
    __slots__ = ("executable", "cwd")
    EXECUTABLE_FIELD_NUMBER: _ClassVar[int]
    CWD_FIELD_NUMBER: _ClassVar[int]
    executable: str
    cwd: str
    def __init__(self, executable: _Optional[str] = ..., cwd: _Optional[str] = ...) -> None: ...

class ExecuteEvent(_message.Message):
    __slots__ = ("id", "started", "output", "finished", "keepalive", "error")
    ID_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    KEEPALIVE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    id: int
    started: Started
    output: Output
    finished: Finished
    keepalive: Keepalive
    error: _errors_pb2.Error
    def __init__(self, id: _Optional[int] = ..., started: _Optional[_Union[Started, _Mapping]] = ..., output: _Optional[_Union[Output, _Mapping]] = ..., finished: _Optional[_Union[Finished, _Mapping]] = ..., keepalive: _Optional[_Union[Keepalive, _Mapping]] = ..., error: _Optional[_Union[_errors_pb2.Error, _Mapping]] = ...) -> None: ...

class Started(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Output(_message.Message):
    __slots__ = ("channel", "data")
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    channel: Channel
    data: bytes
    def __init__(self, channel: _Optional[_Union[Channel, str]] = ..., data: _Optional[bytes] = ...) -> None: ...

class Finished(_message.Message):
    __slots__ = ("exit_code", "truncated", "timed_out", "canceled", "duration_seconds", "output_passed")
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    TIMED_OUT_FIELD_NUMBER: _ClassVar[int]
    CANCELED_FIELD_NUMBER: _ClassVar[int]
    DURATION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_PASSED_FIELD_NUMBER: _ClassVar[int]
    exit_code: int
    truncated: bool
    timed_out: bool
    canceled: bool
    duration_seconds: float
    output_passed: bool
    def __init__(self, exit_code: _Optional[int] = ..., truncated: _Optional[bool] = ..., timed_out: _Optional[bool] = ..., canceled: _Optional[bool] = ..., duration_seconds: _Optional[float] = ..., output_passed: _Optional[bool] = ...) -> None: ...

class Keepalive(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ResolveCommandRequest(_message.Message):
    __slots__ = ("argv", "cwd", "env")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ARGV_FIELD_NUMBER: _ClassVar[int]
    CWD_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    argv: _containers.RepeatedScalarFieldContainer[str]
    cwd: str
    env: _containers.ScalarMap[str, str]
    def __init__(self, argv: _Optional[_Iterable[str]] = ..., cwd: _Optional[str] = ..., env: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ResolveCommandResponse(_message.Message):
    __slots__ = ("argv", "cwd", "real_executable")
    ARGV_FIELD_NUMBER: _ClassVar[int]
    CWD_FIELD_NUMBER: _ClassVar[int]
    REAL_EXECUTABLE_FIELD_NUMBER: _ClassVar[int]
    argv: _containers.RepeatedScalarFieldContainer[str]
    cwd: str
    real_executable: str
    def __init__(self, argv: _Optional[_Iterable[str]] = ..., cwd: _Optional[str] = ..., real_executable: _Optional[str] = ...) -> None: ...
