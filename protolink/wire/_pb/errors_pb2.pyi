from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ErrorKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ERROR_KIND_UNSPECIFIED: _ClassVar[ErrorKind]
    ERROR_KIND_INVALID_ARGUMENT: _ClassVar[ErrorKind]
    ERROR_KIND_NOT_FOUND: _ClassVar[ErrorKind]
    ERROR_KIND_ALREADY_EXISTS: _ClassVar[ErrorKind]
    ERROR_KIND_PERMISSION_DENIED: _ClassVar[ErrorKind]
    ERROR_KIND_CONFLICT: _ClassVar[ErrorKind]
    ERROR_KIND_TIMEOUT: _ClassVar[ErrorKind]
    ERROR_KIND_FAILED: _ClassVar[ErrorKind]
    ERROR_KIND_LIMIT_EXCEEDED: _ClassVar[ErrorKind]
    ERROR_KIND_INTERNAL: _ClassVar[ErrorKind]
    ERROR_KIND_OS_ERROR: _ClassVar[ErrorKind]
    ERROR_KIND_TOOL_EXECUTION: _ClassVar[ErrorKind]
    ERROR_KIND_DOCUMENT: _ClassVar[ErrorKind]
    ERROR_KIND_RESOURCE_UNCHANGED: _ClassVar[ErrorKind]
    ERROR_KIND_UNSAFE_ARCHIVE: _ClassVar[ErrorKind]
    ERROR_KIND_TRANSFER_LIMIT: _ClassVar[ErrorKind]
    ERROR_KIND_PROTECTION_MISSING: _ClassVar[ErrorKind]
    ERROR_KIND_SANDBOX_NOT_FOUND: _ClassVar[ErrorKind]
    ERROR_KIND_QUOTA_EXCEEDED: _ClassVar[ErrorKind]
    ERROR_KIND_SANDBOX_PERMISSION_DENIED: _ClassVar[ErrorKind]
    ERROR_KIND_UNAVAILABLE: _ClassVar[ErrorKind]
    ERROR_KIND_UNAUTHENTICATED: _ClassVar[ErrorKind]
    ERROR_KIND_SANDBOX_LOST: _ClassVar[ErrorKind]
    ERROR_KIND_TRANSFER_ABANDONED: _ClassVar[ErrorKind]
    ERROR_KIND_CA_FILE: _ClassVar[ErrorKind]
    ERROR_KIND_ROOT_NOT_WRITABLE: _ClassVar[ErrorKind]
ERROR_KIND_UNSPECIFIED: ErrorKind
ERROR_KIND_INVALID_ARGUMENT: ErrorKind
ERROR_KIND_NOT_FOUND: ErrorKind
ERROR_KIND_ALREADY_EXISTS: ErrorKind
ERROR_KIND_PERMISSION_DENIED: ErrorKind
ERROR_KIND_CONFLICT: ErrorKind
ERROR_KIND_TIMEOUT: ErrorKind
ERROR_KIND_FAILED: ErrorKind
ERROR_KIND_LIMIT_EXCEEDED: ErrorKind
ERROR_KIND_INTERNAL: ErrorKind
ERROR_KIND_OS_ERROR: ErrorKind
ERROR_KIND_TOOL_EXECUTION: ErrorKind
ERROR_KIND_DOCUMENT: ErrorKind
ERROR_KIND_RESOURCE_UNCHANGED: ErrorKind
ERROR_KIND_UNSAFE_ARCHIVE: ErrorKind
ERROR_KIND_TRANSFER_LIMIT: ErrorKind
ERROR_KIND_PROTECTION_MISSING: ErrorKind
ERROR_KIND_SANDBOX_NOT_FOUND: ErrorKind
ERROR_KIND_QUOTA_EXCEEDED: ErrorKind
ERROR_KIND_SANDBOX_PERMISSION_DENIED: ErrorKind
ERROR_KIND_UNAVAILABLE: ErrorKind
ERROR_KIND_UNAUTHENTICATED: ErrorKind
ERROR_KIND_SANDBOX_LOST: ErrorKind
ERROR_KIND_TRANSFER_ABANDONED: ErrorKind
ERROR_KIND_CA_FILE: ErrorKind
ERROR_KIND_ROOT_NOT_WRITABLE: ErrorKind

class Error(_message.Message):
    __slots__ = ("kind", "message", "errno", "missing", "path", "uid", "gid", "fix")
    class MissingEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    KIND_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ERRNO_FIELD_NUMBER: _ClassVar[int]
    MISSING_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    FIX_FIELD_NUMBER: _ClassVar[int]
    kind: ErrorKind
    message: str
    errno: int
    missing: _containers.ScalarMap[str, str]
    path: str
    uid: int
    gid: int
    fix: str
    def __init__(self, kind: _Optional[_Union[ErrorKind, str]] = ..., message: _Optional[str] = ..., errno: _Optional[int] = ..., missing: _Optional[_Mapping[str, str]] = ..., path: _Optional[str] = ..., uid: _Optional[int] = ..., gid: _Optional[int] = ..., fix: _Optional[str] = ...) -> None: ...
