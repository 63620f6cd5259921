from protolink.wire._pb import documents_pb2 as _documents_pb2
from protolink.wire._pb import process_pb2 as _process_pb2
from protolink.wire._pb import transfer_pb2 as _transfer_pb2
from protolink.wire._pb import workspace_pb2 as _workspace_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class InfoResponse(_message.Message):
    __slots__ = ("boundary", "server_version", "limits", "roots")
    BOUNDARY_FIELD_NUMBER: _ClassVar[int]
    SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    ROOTS_FIELD_NUMBER: _ClassVar[int]
    boundary: str
    server_version: str
    limits: Limits
    roots: _containers.RepeatedCompositeFieldContainer[Root]
    def __init__(self, boundary: _Optional[str] = ..., server_version: _Optional[str] = ..., limits: _Optional[_Union[Limits, _Mapping]] = ..., roots: _Optional[_Iterable[_Union[Root, _Mapping]]] = ...) -> None: ...

class Limits(_message.Message):
    __slots__ = ("max_message_bytes", "max_concurrency", "max_document_seconds", "max_document_memory_bytes", "max_output_bytes", "max_operation_seconds")
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    MAX_DOCUMENT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MAX_DOCUMENT_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_OUTPUT_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_OPERATION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    max_message_bytes: int
    max_concurrency: int
    max_document_seconds: float
    max_document_memory_bytes: int
    max_output_bytes: int
    max_operation_seconds: float
    def __init__(self, max_message_bytes: _Optional[int] = ..., max_concurrency: _Optional[int] = ..., max_document_seconds: _Optional[float] = ..., max_document_memory_bytes: _Optional[int] = ..., max_output_bytes: _Optional[int] = ..., max_operation_seconds: _Optional[float] = ...) -> None: ...

class Root(_message.Message):
    __slots__ = ("path", "writable")
    PATH_FIELD_NUMBER: _ClassVar[int]
    WRITABLE_FIELD_NUMBER: _ClassVar[int]
    path: str
    writable: bool
    def __init__(self, path: _Optional[str] = ..., writable: _Optional[bool] = ...) -> None: ...
