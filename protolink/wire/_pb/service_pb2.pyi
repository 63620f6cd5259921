from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CreateRequest(_message.Message):
    __slots__ = ("template", "image", "memory_bytes", "cpus", "pids", "allow", "egress", "ttl_seconds", "idle_seconds", "labels", "roots", "managed_workspace")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    CPUS_FIELD_NUMBER: _ClassVar[int]
    PIDS_FIELD_NUMBER: _ClassVar[int]
    ALLOW_FIELD_NUMBER: _ClassVar[int]
    EGRESS_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    IDLE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    ROOTS_FIELD_NUMBER: _ClassVar[int]
    MANAGED_WORKSPACE_FIELD_NUMBER: _ClassVar[int]
    template: str
    image: str
    memory_bytes: int
    cpus: float
    pids: int
    allow: _containers.RepeatedScalarFieldContainer[str]
    egress: bool
    ttl_seconds: float
    idle_seconds: float
    labels: _containers.ScalarMap[str, str]
    roots: _containers.RepeatedCompositeFieldContainer[HostRoot]
    managed_workspace: bool
    def __init__(self, template: _Optional[str] = ..., image: _Optional[str] = ..., memory_bytes: _Optional[int] = ..., cpus: _Optional[float] = ..., pids: _Optional[int] = ..., allow: _Optional[_Iterable[str]] = ..., egress: _Optional[bool] = ..., ttl_seconds: _Optional[float] = ..., idle_seconds: _Optional[float] = ..., labels: _Optional[_Mapping[str, str]] = ..., roots: _Optional[_Iterable[_Union[HostRoot, _Mapping]]] = ..., managed_workspace: _Optional[bool] = ...) -> None: ...

class HostRoot(_message.Message):
    __slots__ = ("path", "writable")
    PATH_FIELD_NUMBER: _ClassVar[int]
    WRITABLE_FIELD_NUMBER: _ClassVar[int]
    path: str
    writable: bool
    def __init__(self, path: _Optional[str] = ..., writable: _Optional[bool] = ...) -> None: ...

class SandboxStatus(_message.Message):
    __slots__ = ("id", "template", "image", "memory_bytes", "cpus", "pids", "labels", "created", "expires", "idle_expires", "workspace", "pooled", "state", "info")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    CPUS_FIELD_NUMBER: _ClassVar[int]
    PIDS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_FIELD_NUMBER: _ClassVar[int]
    IDLE_EXPIRES_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_FIELD_NUMBER: _ClassVar[int]
    POOLED_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    id: str
    template: str
    image: str
    memory_bytes: int
    cpus: float
    pids: int
    labels: _containers.ScalarMap[str, str]
    created: float
    expires: float
    idle_expires: float
    workspace: str
    pooled: bool
    state: str
    info: bytes
    def __init__(self, id: _Optional[str] = ..., template: _Optional[str] = ..., image: _Optional[str] = ..., memory_bytes: _Optional[int] = ..., cpus: _Optional[float] = ..., pids: _Optional[int] = ..., labels: _Optional[_Mapping[str, str]] = ..., created: _Optional[float] = ..., expires: _Optional[float] = ..., idle_expires: _Optional[float] = ..., workspace: _Optional[str] = ..., pooled: _Optional[bool] = ..., state: _Optional[str] = ..., info: _Optional[bytes] = ...) -> None: ...

class ListRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListResponse(_message.Message):
    __slots__ = ("sandboxes", "pool_ready")
    class PoolReadyEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    SANDBOXES_FIELD_NUMBER: _ClassVar[int]
    POOL_READY_FIELD_NUMBER: _ClassVar[int]
    sandboxes: _containers.RepeatedCompositeFieldContainer[SandboxStatus]
    pool_ready: _containers.ScalarMap[str, int]
    def __init__(self, sandboxes: _Optional[_Iterable[_Union[SandboxStatus, _Mapping]]] = ..., pool_ready: _Optional[_Mapping[str, int]] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class RenewRequest(_message.Message):
    __slots__ = ("id", "ttl_seconds")
    ID_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    id: str
    ttl_seconds: float
    def __init__(self, id: _Optional[str] = ..., ttl_seconds: _Optional[float] = ...) -> None: ...

class DeleteRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class DeleteResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
