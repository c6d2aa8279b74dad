from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LedgerMetadata(_message.Message):
    __slots__ = ("ensemble_size", "write_quorum", "ack_quorum", "state", "last_entry_id", "length", "digest_type", "ctime_ms", "custom_metadata", "fragments", "master_key")
    class State(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        OPEN: _ClassVar[LedgerMetadata.State]
        IN_RECOVERY: _ClassVar[LedgerMetadata.State]
        CLOSED: _ClassVar[LedgerMetadata.State]
    OPEN: LedgerMetadata.State
    IN_RECOVERY: LedgerMetadata.State
    CLOSED: LedgerMetadata.State
    class DigestType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        CRC32C: _ClassVar[LedgerMetadata.DigestType]
    CRC32C: LedgerMetadata.DigestType
    class Fragment(_message.Message):
        __slots__ = ("first_entry_id", "bookies")
        FIRST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
        BOOKIES_FIELD_NUMBER: _ClassVar[int]
        first_entry_id: int
        bookies: _containers.RepeatedScalarFieldContainer[str]
        def __init__(self, first_entry_id: _Optional[int] = ..., bookies: _Optional[_Iterable[str]] = ...) -> None: ...
    class CustomMetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    ENSEMBLE_SIZE_FIELD_NUMBER: _ClassVar[int]
    WRITE_QUORUM_FIELD_NUMBER: _ClassVar[int]
    ACK_QUORUM_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LAST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    DIGEST_TYPE_FIELD_NUMBER: _ClassVar[int]
    CTIME_MS_FIELD_NUMBER: _ClassVar[int]
    CUSTOM_METADATA_FIELD_NUMBER: _ClassVar[int]
    FRAGMENTS_FIELD_NUMBER: _ClassVar[int]
    MASTER_KEY_FIELD_NUMBER: _ClassVar[int]
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    state: LedgerMetadata.State
    last_entry_id: int
    length: int
    digest_type: LedgerMetadata.DigestType
    ctime_ms: int
    custom_metadata: _containers.ScalarMap[str, bytes]
    fragments: _containers.RepeatedCompositeFieldContainer[LedgerMetadata.Fragment]
    master_key: bytes
    def __init__(self, ensemble_size: _Optional[int] = ..., write_quorum: _Optional[int] = ..., ack_quorum: _Optional[int] = ..., state: _Optional[_Union[LedgerMetadata.State, str]] = ..., last_entry_id: _Optional[int] = ..., length: _Optional[int] = ..., digest_type: _Optional[_Union[LedgerMetadata.DigestType, str]] = ..., ctime_ms: _Optional[int] = ..., custom_metadata: _Optional[_Mapping[str, bytes]] = ..., fragments: _Optional[_Iterable[_Union[LedgerMetadata.Fragment, _Mapping]]] = ..., master_key: _Optional[bytes] = ...) -> None: ...
