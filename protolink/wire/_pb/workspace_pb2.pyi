from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EntryType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ENTRY_TYPE_UNSPECIFIED: _ClassVar[EntryType]
    ENTRY_TYPE_FILE: _ClassVar[EntryType]
    ENTRY_TYPE_DIRECTORY: _ClassVar[EntryType]
    ENTRY_TYPE_OTHER: _ClassVar[EntryType]
ENTRY_TYPE_UNSPECIFIED: EntryType
ENTRY_TYPE_FILE: EntryType
ENTRY_TYPE_DIRECTORY: EntryType
ENTRY_TYPE_OTHER: EntryType

class ReadTextRequest(_message.Message):
    __slots__ = ("path", "roots", "offset", "max_chars", "max_file_bytes")
    PATH_FIELD_NUMBER: _ClassVar[int]
    ROOTS_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_CHARS_FIELD_NUMBER: _ClassVar[int]
    MAX_FILE_BYTES_FIELD_NUMBER: _ClassVar[int]
    path: str
    roots: _containers.RepeatedScalarFieldContainer[str]
    offset: int
    max_chars: int
    max_file_bytes: int
    def __init__(self, path: _Optional[str] = ..., roots: _Optional[_Iterable[str]] = ..., offset: _Optional[int] = ..., max_chars: _Optional[int] = ..., max_file_bytes: _Optional[int] = ...) -> None: ...

class ReadTextResponse(_message.Message):
    __slots__ = ("path", "content", "next_offset")
    PATH_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    path: str
    content: str
    next_offset: int
    def __init__(self, path: _Optional[str] = ..., content: _Optional[str] = ..., next_offset: _Optional[int] = ...) -> None: ...

class ListFilesRequest(_message.Message):
    __slots__ = ("path", "roots", "pattern", "recursive", "max_results")
    PATH_FIELD_NUMBER: _ClassVar[int]
    ROOTS_FIELD_NUMBER: _ClassVar[int]
    PATTERN_FIELD_NUMBER: _ClassVar[int]
    RECURSIVE_FIELD_NUMBER: _ClassVar[int]
    MAX_RESULTS_FIELD_NUMBER: _ClassVar[int]
    path: str
    roots: _containers.RepeatedScalarFieldContainer[str]
    pattern: str
    recursive: bool
    max_results: int
    def __init__(self, path: _Optional[str] = ..., roots: _Optional[_Iterable[str]] = ..., pattern: _Optional[str] = ..., recursive: _Optional[bool] = ..., max_results: _Optional[int] = ...) -> None: ...

class FileEntry(_message.Message):
    __slots__ = ("path", "type", "size")
    PATH_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    path: str
    type: EntryType
    size: int
    def __init__(self, path: _Optional[str] = ..., type: _Optional[_Union[EntryType, str]] = ..., size: _Optional[int] = ...) -> None: ...

class ListFilesResponse(_message.Message):
    __slots__ = ("items", "scanned", "skipped", "truncated")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    SCANNED_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[FileEntry]
    scanned: int
    skipped: int
    truncated: bool
    def __init__(self, items: _Optional[_Iterable[_Union[FileEntry, _Mapping]]] = ..., scanned: _Optional[int] = ..., skipped: _Optional[int] = ..., truncated: _Optional[bool] = ...) -> None: ...

class SearchFilesRequest(_message.Message):
    __slots__ = ("path", "roots", "query", "pattern", "case_sensitive", "max_results", "max_file_bytes")
    PATH_FIELD_NUMBER: _ClassVar[int]
    ROOTS_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    PATTERN_FIELD_NUMBER: _ClassVar[int]
    CASE_SENSITIVE_FIELD_NUMBER: _ClassVar[int]
    MAX_RESULTS_FIELD_NUMBER: _ClassVar[int]
    MAX_FILE_BYTES_FIELD_NUMBER: _ClassVar[int]
    path: str
    roots: _containers.RepeatedScalarFieldContainer[str]
    query: str
    pattern: str
    case_sensitive: bool
    max_results: int
    max_file_bytes: int
    def __init__(self, path: _Optional[str] = ..., roots: _Optional[_Iterable[str]] = ..., query: _Optional[str] = ..., pattern: _Optional[str] = ..., case_sensitive: _Optional[bool] = ..., max_results: _Optional[int] = ..., max_file_bytes: _Optional[int] = ...) -> None: ...

class SearchMatch(_message.Message):
    __slots__ = ("path", "line", "text", "text_truncated")
    PATH_FIELD_NUMBER: _ClassVar[int]
    LINE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TEXT_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    path: str
    line: int
    text: str
    text_truncated: bool
    def __init__(self, path: _Optional[str] = ..., line: _Optional[int] = ..., text: _Optional[str] = ..., text_truncated: _Optional[bool] = ...) -> None: ...

class SearchFilesResponse(_message.Message):
    __slots__ = ("items", "scanned", "skipped", "truncated")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    SCANNED_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[SearchMatch]
    scanned: int
    skipped: int
    truncated: bool
    def __init__(self, items: _Optional[_Iterable[_Union[SearchMatch, _Mapping]]] = ..., scanned: _Optional[int] = ..., skipped: _Optional[int] = ..., truncated: _Optional[bool] = ...) -> None: ...

class Identity(_message.Message):
    __slots__ = ("device", "inode")
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    device: int
    inode: int
    def __init__(self, device: _Optional[int] = ..., inode: _Optional[int] = ...) -> None: ...

class Revision(_message.Message):
    __slots__ = ("resource_id", "exists", "size", "sha256", "mode", "identity", "parent_identity")
    RESOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    EXISTS_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    PARENT_IDENTITY_FIELD_NUMBER: _ClassVar[int]
    resource_id: str
    exists: bool
    size: int
    sha256: str
    mode: int
    identity: Identity
    parent_identity: Identity
    def __init__(self, resource_id: _Optional[str] = ..., exists: _Optional[bool] = ..., size: _Optional[int] = ..., sha256: _Optional[str] = ..., mode: _Optional[int] = ..., identity: _Optional[_Union[Identity, _Mapping]] = ..., parent_identity: _Optional[_Union[Identity, _Mapping]] = ...) -> None: ...

class SnapshotFileRequest(_message.Message):
    __slots__ = ("path", "roots", "max_file_bytes")
    PATH_FIELD_NUMBER: _ClassVar[int]
    ROOTS_FIELD_NUMBER: _ClassVar[int]
    MAX_FILE_BYTES_FIELD_NUMBER: _ClassVar[int]
    path: str
    roots: _containers.RepeatedScalarFieldContainer[str]
    max_file_bytes: int
    def __init__(self, path: _Optional[str] = ..., roots: _Optional[_Iterable[str]] = ..., max_file_bytes: _Optional[int] = ...) -> None: ...

class SnapshotFileResponse(_message.Message):
    __slots__ = ("revision", "data")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    revision: Revision
    data: bytes
    def __init__(self, revision: _Optional[_Union[Revision, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class ReplaceFileRequest(_message.Message):
    __slots__ = ("expected", "data", "mode", "roots")
    EXPECTED_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    ROOTS_FIELD_NUMBER: _ClassVar[int]
    expected: Revision
    data: bytes
    mode: int
    roots: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, expected: _Optional[_Union[Revision, _Mapping]] = ..., data: _Optional[bytes] = ..., mode: _Optional[int] = ..., roots: _Optional[_Iterable[str]] = ...) -> None: ...

class ReplaceFileResponse(_message.Message):
    __slots__ = ("revision",)
    REVISION_FIELD_NUMBER: _ClassVar[int]
    revision: Revision
    def __init__(self, revision: _Optional[_Union[Revision, _Mapping]] = ...) -> None: ...
