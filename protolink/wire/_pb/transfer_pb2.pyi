from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TransferKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRANSFER_KIND_UNSPECIFIED: _ClassVar[TransferKind]
    TRANSFER_KIND_FILE: _ClassVar[TransferKind]
    TRANSFER_KIND_TAR: _ClassVar[TransferKind]
TRANSFER_KIND_UNSPECIFIED: TransferKind
TRANSFER_KIND_FILE: TransferKind
TRANSFER_KIND_TAR: TransferKind

class TransferLimits(_message.Message):
    __slots__ = ("max_total_bytes", "max_file_bytes", "max_entries", "max_path_chars", "max_depth")
    MAX_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_FILE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    MAX_PATH_CHARS_FIELD_NUMBER: _ClassVar[int]
    MAX_DEPTH_FIELD_NUMBER: _ClassVar[int]
    max_total_bytes: int
    max_file_bytes: int
    max_entries: int
    max_path_chars: int
    max_depth: int
    def __init__(self, max_total_bytes: _Optional[int] = ..., max_file_bytes: _Optional[int] = ..., max_entries: _Optional[int] = ..., max_path_chars: _Optional[int] = ..., max_depth: _Optional[int] = ...) -> None: ...

class UploadStart(_message.Message):
    __slots__ = ("destination", "roots", "kind", "overwrite", "mode", "keep_outside_symlinks", "limits")
    DESTINATION_FIELD_NUMBER: _ClassVar[int]
    ROOTS_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    OVERWRITE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    KEEP_OUTSIDE_SYMLINKS_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    destination: str
    roots: _containers.RepeatedScalarFieldContainer[str]
    kind: TransferKind
    overwrite: bool
    mode: int
    keep_outside_symlinks: bool
    limits: TransferLimits
    def __init__(self, destination: _Optional[str] = ..., roots: _Optional[_Iterable[str]] = ..., kind: _Optional[_Union[TransferKind, str]] = ..., overwrite: _Optional[bool] = ..., mode: _Optional[int] = ..., keep_outside_symlinks: _Optional[bool] = ..., limits: _Optional[_Union[TransferLimits, _Mapping]] = ...) -> None: ...

class UploadEnd(_message.Message):
    __slots__ = ("bytes",)
    BYTES_FIELD_NUMBER: _ClassVar[int]
    bytes: int
    def __init__(self, bytes: _Optional[int] = ...) -> None: ...

class UploadChunk(_message.Message):
    __slots__ = ("start", "data", "end")
    START_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    start: UploadStart
    data: bytes
    end: UploadEnd
    def __init__(self, start: _Optional[_Union[UploadStart, _Mapping]] = ..., data: _Optional[bytes] = ..., end: _Optional[_Union[UploadEnd, _Mapping]] = ...) -> None: ...

class TransferSummary(_message.Message):
    __slots__ = ("path", "kind", "files", "directories", "symlinks", "bytes", "skipped")
    PATH_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    DIRECTORIES_FIELD_NUMBER: _ClassVar[int]
    SYMLINKS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    path: str
    kind: TransferKind
    files: int
    directories: int
    symlinks: int
    bytes: int
    skipped: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, path: _Optional[str] = ..., kind: _Optional[_Union[TransferKind, str]] = ..., files: _Optional[int] = ..., directories: _Optional[int] = ..., symlinks: _Optional[int] = ..., bytes: _Optional[int] = ..., skipped: _Optional[_Iterable[str]] = ...) -> None: ...

class DownloadRequest(_message.Message):
    __slots__ = ("path", "roots", "limits")
    PATH_FIELD_NUMBER: _ClassVar[int]
    ROOTS_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    path: str
    roots: _containers.RepeatedScalarFieldContainer[str]
    limits: TransferLimits
    def __init__(self, path: _Optional[str] = ..., roots: _Optional[_Iterable[str]] = ..., limits: _Optional[_Union[TransferLimits, _Mapping]] = ...) -> None: ...

class DownloadChunk(_message.Message):
    __slots__ = ("kind", "data", "summary")
    KIND_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    kind: TransferKind
    data: bytes
    summary: TransferSummary
    def __init__(self, kind: _Optional[_Union[TransferKind, str]] = ..., data: _Optional[bytes] = ..., summary: _Optional[_Union[TransferSummary, _Mapping]] = ...) -> None: ...
