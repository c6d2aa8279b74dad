from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OK: _ClassVar[Status]
    NO_SUCH_LEDGER: _ClassVar[Status]
    NO_SUCH_ENTRY: _ClassVar[Status]
    FENCED: _ClassVar[Status]
    READ_ONLY: _ClassVar[Status]
    BAD_REQUEST: _ClassVar[Status]
    DIGEST_MISMATCH: _ClassVar[Status]
    TOO_LARGE: _ClassVar[Status]
    TIMEOUT: _ClassVar[Status]
    DISK_FULL: _ClassVar[Status]
    INTERNAL: _ClassVar[Status]
    UNAUTHORIZED: _ClassVar[Status]
    WIPED: _ClassVar[Status]
OK: Status
NO_SUCH_LEDGER: Status
NO_SUCH_ENTRY: Status
FENCED: Status
READ_ONLY: Status
BAD_REQUEST: Status
DIGEST_MISMATCH: Status
TOO_LARGE: Status
TIMEOUT: Status
DISK_FULL: Status
INTERNAL: Status
UNAUTHORIZED: Status
WIPED: Status

class AddOp(_message.Message):
    __slots__ = ("tag", "ledger_id", "entry_id", "entry", "recovery", "master_key")
    TAG_FIELD_NUMBER: _ClassVar[int]
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_FIELD_NUMBER: _ClassVar[int]
    RECOVERY_FIELD_NUMBER: _ClassVar[int]
    MASTER_KEY_FIELD_NUMBER: _ClassVar[int]
    tag: int
    ledger_id: int
    entry_id: int
    entry: bytes
    recovery: bool
    master_key: bytes
    def __init__(self, tag: _Optional[int] = ..., ledger_id: _Optional[int] = ..., entry_id: _Optional[int] = ..., entry: _Optional[bytes] = ..., recovery: _Optional[bool] = ..., master_key: _Optional[bytes] = ...) -> None: ...

class AddRequest(_message.Message):
    __slots__ = ("ops",)
    OPS_FIELD_NUMBER: _ClassVar[int]
    ops: _containers.RepeatedCompositeFieldContainer[AddOp]
    def __init__(self, ops: _Optional[_Iterable[_Union[AddOp, _Mapping]]] = ...) -> None: ...

class AddResult(_message.Message):
    __slots__ = ("tag", "ledger_id", "entry_id", "status", "message")
    TAG_FIELD_NUMBER: _ClassVar[int]
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    tag: int
    ledger_id: int
    entry_id: int
    status: Status
    message: str
    def __init__(self, tag: _Optional[int] = ..., ledger_id: _Optional[int] = ..., entry_id: _Optional[int] = ..., status: _Optional[_Union[Status, str]] = ..., message: _Optional[str] = ...) -> None: ...

class AddResponse(_message.Message):
    __slots__ = ("results", "ok_tags")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    OK_TAGS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[AddResult]
    ok_tags: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, results: _Optional[_Iterable[_Union[AddResult, _Mapping]]] = ..., ok_tags: _Optional[_Iterable[int]] = ...) -> None: ...

class ReadRequest(_message.Message):
    __slots__ = ("ledger_id", "entry_id", "fence")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    entry_id: int
    fence: bool
    def __init__(self, ledger_id: _Optional[int] = ..., entry_id: _Optional[int] = ..., fence: _Optional[bool] = ...) -> None: ...

class ReadResponse(_message.Message):
    __slots__ = ("status", "message", "ledger_id", "entry_id", "entry")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_FIELD_NUMBER: _ClassVar[int]
    status: Status
    message: str
    ledger_id: int
    entry_id: int
    entry: bytes
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., message: _Optional[str] = ..., ledger_id: _Optional[int] = ..., entry_id: _Optional[int] = ..., entry: _Optional[bytes] = ...) -> None: ...

class ReadRangeRequest(_message.Message):
    __slots__ = ("ledger_id", "first_entry_id", "max_count", "max_bytes")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_COUNT_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    first_entry_id: int
    max_count: int
    max_bytes: int
    def __init__(self, ledger_id: _Optional[int] = ..., first_entry_id: _Optional[int] = ..., max_count: _Optional[int] = ..., max_bytes: _Optional[int] = ...) -> None: ...

class ReadRangeResponse(_message.Message):
    __slots__ = ("status", "message", "ledger_id", "first_entry_id", "entries")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    status: Status
    message: str
    ledger_id: int
    first_entry_id: int
    entries: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., message: _Optional[str] = ..., ledger_id: _Optional[int] = ..., first_entry_id: _Optional[int] = ..., entries: _Optional[_Iterable[bytes]] = ...) -> None: ...

class ReadLacRequest(_message.Message):
    __slots__ = ("ledger_id", "previous_lac", "timeout_ms")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_LAC_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    previous_lac: int
    timeout_ms: int
    def __init__(self, ledger_id: _Optional[int] = ..., previous_lac: _Optional[int] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class ReadLacResponse(_message.Message):
    __slots__ = ("status", "message", "lac", "last_entry_id")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LAC_FIELD_NUMBER: _ClassVar[int]
    LAST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    status: Status
    message: str
    lac: int
    last_entry_id: int
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., message: _Optional[str] = ..., lac: _Optional[int] = ..., last_entry_id: _Optional[int] = ...) -> None: ...

class FenceRequest(_message.Message):
    __slots__ = ("ledger_id",)
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    def __init__(self, ledger_id: _Optional[int] = ...) -> None: ...

class FenceResponse(_message.Message):
    __slots__ = ("status", "message", "lac", "last_entry_id")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LAC_FIELD_NUMBER: _ClassVar[int]
    LAST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    status: Status
    message: str
    lac: int
    last_entry_id: int
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., message: _Optional[str] = ..., lac: _Optional[int] = ..., last_entry_id: _Optional[int] = ...) -> None: ...

class DeleteLedgerRequest(_message.Message):
    __slots__ = ("ledger_id",)
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    def __init__(self, ledger_id: _Optional[int] = ...) -> None: ...

class DeleteLedgerResponse(_message.Message):
    __slots__ = ("status", "message")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    status: Status
    message: str
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., message: _Optional[str] = ...) -> None: ...

class BookieInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class BookieInfoResponse(_message.Message):
    __slots__ = ("address", "read_only", "free_bytes", "total_bytes", "disk_usage", "max_entry_size")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    READ_ONLY_FIELD_NUMBER: _ClassVar[int]
    FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    DISK_USAGE_FIELD_NUMBER: _ClassVar[int]
    MAX_ENTRY_SIZE_FIELD_NUMBER: _ClassVar[int]
    address: str
    read_only: bool
    free_bytes: int
    total_bytes: int
    disk_usage: float
    max_entry_size: int
    def __init__(self, address: _Optional[str] = ..., read_only: _Optional[bool] = ..., free_bytes: _Optional[int] = ..., total_bytes: _Optional[int] = ..., disk_usage: _Optional[float] = ..., max_entry_size: _Optional[int] = ...) -> None: ...
