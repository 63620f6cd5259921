from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DocumentLimits(_message.Message):
    __slots__ = ("max_file_bytes", "max_output_chars", "max_sections", "max_archive_bytes", "timeout_seconds")
    MAX_FILE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_OUTPUT_CHARS_FIELD_NUMBER: _ClassVar[int]
    MAX_SECTIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_ARCHIVE_BYTES_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    max_file_bytes: int
    max_output_chars: int
    max_sections: int
    max_archive_bytes: int
    timeout_seconds: float
    def __init__(self, max_file_bytes: _Optional[int] = ..., max_output_chars: _Optional[int] = ..., max_sections: _Optional[int] = ..., max_archive_bytes: _Optional[int] = ..., timeout_seconds: _Optional[float] = ...) -> None: ...

class LocationPart(_message.Message):
    __slots__ = ("name", "number", "text")
    NAME_FIELD_NUMBER: _ClassVar[int]
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    name: str
    number: int
    text: str
    def __init__(self, name: _Optional[str] = ..., number: _Optional[int] = ..., text: _Optional[str] = ...) -> None: ...

class Cells(_message.Message):
    __slots__ = ("cells",)
    CELLS_FIELD_NUMBER: _ClassVar[int]
    cells: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, cells: _Optional[_Iterable[str]] = ...) -> None: ...

class DocumentSection(_message.Message):
    __slots__ = ("location", "text", "row")
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    ROW_FIELD_NUMBER: _ClassVar[int]
    location: _containers.RepeatedCompositeFieldContainer[LocationPart]
    text: str
    row: Cells
    def __init__(self, location: _Optional[_Iterable[_Union[LocationPart, _Mapping]]] = ..., text: _Optional[str] = ..., row: _Optional[_Union[Cells, _Mapping]] = ...) -> None: ...

class DocumentMetadata(_message.Message):
    __slots__ = ("path", "format", "input_bytes")
    PATH_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    INPUT_BYTES_FIELD_NUMBER: _ClassVar[int]
    path: str
    format: str
    input_bytes: int
    def __init__(self, path: _Optional[str] = ..., format: _Optional[str] = ..., input_bytes: _Optional[int] = ...) -> None: ...

class ReadDocumentRequest(_message.Message):
    __slots__ = ("path", "roots", "limits")
    PATH_FIELD_NUMBER: _ClassVar[int]
    ROOTS_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    path: str
    roots: _containers.RepeatedScalarFieldContainer[str]
    limits: DocumentLimits
    def __init__(self, path: _Optional[str] = ..., roots: _Optional[_Iterable[str]] = ..., limits: _Optional[_Union[DocumentLimits, _Mapping]] = ...) -> None: ...

class ReadDocumentResponse(_message.Message):
    __slots__ = ("metadata", "sections", "truncated")
    METADATA_FIELD_NUMBER: _ClassVar[int]
    SECTIONS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    metadata: DocumentMetadata
    sections: _containers.RepeatedCompositeFieldContainer[DocumentSection]
    truncated: bool
    def __init__(self, metadata: _Optional[_Union[DocumentMetadata, _Mapping]] = ..., sections: _Optional[_Iterable[_Union[DocumentSection, _Mapping]]] = ..., truncated: _Optional[bool] = ...) -> None: ...

class SearchDocumentRequest(_message.Message):
    __slots__ = ("path", "query", "roots", "limits", "max_results")
    PATH_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    ROOTS_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    MAX_RESULTS_FIELD_NUMBER: _ClassVar[int]
    path: str
    query: str
    roots: _containers.RepeatedScalarFieldContainer[str]
    limits: DocumentLimits
    max_results: int
    def __init__(self, path: _Optional[str] = ..., query: _Optional[str] = ..., roots: _Optional[_Iterable[str]] = ..., limits: _Optional[_Union[DocumentLimits, _Mapping]] = ..., max_results: _Optional[int] = ...) -> None: ...

class DocumentMatch(_message.Message):
    __slots__ = ("location", "snippet")
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    SNIPPET_FIELD_NUMBER: _ClassVar[int]
    location: _containers.RepeatedCompositeFieldContainer[LocationPart]
    snippet: str
    def __init__(self, location: _Optional[_Iterable[_Union[LocationPart, _Mapping]]] = ..., snippet: _Optional[str] = ...) -> None: ...

class SearchDocumentResponse(_message.Message):
    __slots__ = ("metadata", "query", "matches", "truncated")
    METADATA_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    MATCHES_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    metadata: DocumentMetadata
    query: str
    matches: _containers.RepeatedCompositeFieldContainer[DocumentMatch]
    truncated: bool
    def __init__(self, metadata: _Optional[_Union[DocumentMetadata, _Mapping]] = ..., query: _Optional[str] = ..., matches: _Optional[_Iterable[_Union[DocumentMatch, _Mapping]]] = ..., truncated: _Optional[bool] = ...) -> None: ...
