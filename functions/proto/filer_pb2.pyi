from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Entry(_message.Message):
    __slots__ = ("name", "is_directory", "attributes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    IS_DIRECTORY_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    name: str
    is_directory: bool
    attributes: FuseAttributes
    def __init__(self, name: _Optional[str] = ..., is_directory: _Optional[bool] = ..., attributes: _Optional[_Union[FuseAttributes, _Mapping]] = ...) -> None: ...

class EventNotification(_message.Message):
    __slots__ = ("old_entry", "new_entry", "delete_chunks", "new_parent_path", "is_from_other_cluster", "signatures")
    OLD_ENTRY_FIELD_NUMBER: _ClassVar[int]
    NEW_ENTRY_FIELD_NUMBER: _ClassVar[int]
    DELETE_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    NEW_PARENT_PATH_FIELD_NUMBER: _ClassVar[int]
    IS_FROM_OTHER_CLUSTER_FIELD_NUMBER: _ClassVar[int]
    SIGNATURES_FIELD_NUMBER: _ClassVar[int]
    old_entry: Entry
    new_entry: Entry
    delete_chunks: bool
    new_parent_path: str
    is_from_other_cluster: bool
    signatures: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, old_entry: _Optional[_Union[Entry, _Mapping]] = ..., new_entry: _Optional[_Union[Entry, _Mapping]] = ..., delete_chunks: _Optional[bool] = ..., new_parent_path: _Optional[str] = ..., is_from_other_cluster: _Optional[bool] = ..., signatures: _Optional[_Iterable[int]] = ...) -> None: ...

class FuseAttributes(_message.Message):
    __slots__ = ("file_size", "mtime", "file_mode", "crtime", "mime", "md5")
    FILE_SIZE_FIELD_NUMBER: _ClassVar[int]
    MTIME_FIELD_NUMBER: _ClassVar[int]
    FILE_MODE_FIELD_NUMBER: _ClassVar[int]
    CRTIME_FIELD_NUMBER: _ClassVar[int]
    MIME_FIELD_NUMBER: _ClassVar[int]
    MD5_FIELD_NUMBER: _ClassVar[int]
    file_size: int
    mtime: int
    file_mode: int
    crtime: int
    mime: str
    md5: bytes
    def __init__(self, file_size: _Optional[int] = ..., mtime: _Optional[int] = ..., file_mode: _Optional[int] = ..., crtime: _Optional[int] = ..., mime: _Optional[str] = ..., md5: _Optional[bytes] = ...) -> None: ...

class GetFilerConfigurationRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetFilerConfigurationResponse(_message.Message):
    __slots__ = ("dir_buckets", "signature", "version")
    DIR_BUCKETS_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    dir_buckets: str
    signature: int
    version: str
    def __init__(self, dir_buckets: _Optional[str] = ..., signature: _Optional[int] = ..., version: _Optional[str] = ...) -> None: ...

class LogEntry(_message.Message):
    __slots__ = ("ts_ns",)
    TS_NS_FIELD_NUMBER: _ClassVar[int]
    ts_ns: int
    def __init__(self, ts_ns: _Optional[int] = ...) -> None: ...

class SubscribeMetadataRequest(_message.Message):
    __slots__ = ("client_name", "path_prefix", "since_ns", "signature", "path_prefixes", "client_id", "until_ns", "client_epoch", "directories", "client_supports_batching", "client_supports_metadata_chunks", "client_supports_idle_heartbeat")
    CLIENT_NAME_FIELD_NUMBER: _ClassVar[int]
    PATH_PREFIX_FIELD_NUMBER: _ClassVar[int]
    SINCE_NS_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    PATH_PREFIXES_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    UNTIL_NS_FIELD_NUMBER: _ClassVar[int]
    CLIENT_EPOCH_FIELD_NUMBER: _ClassVar[int]
    DIRECTORIES_FIELD_NUMBER: _ClassVar[int]
    CLIENT_SUPPORTS_BATCHING_FIELD_NUMBER: _ClassVar[int]
    CLIENT_SUPPORTS_METADATA_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    CLIENT_SUPPORTS_IDLE_HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    client_name: str
    path_prefix: str
    since_ns: int
    signature: int
    path_prefixes: _containers.RepeatedScalarFieldContainer[str]
    client_id: int
    until_ns: int
    client_epoch: int
    directories: _containers.RepeatedScalarFieldContainer[str]
    client_supports_batching: bool
    client_supports_metadata_chunks: bool
    client_supports_idle_heartbeat: bool
    def __init__(self, client_name: _Optional[str] = ..., path_prefix: _Optional[str] = ..., since_ns: _Optional[int] = ..., signature: _Optional[int] = ..., path_prefixes: _Optional[_Iterable[str]] = ..., client_id: _Optional[int] = ..., until_ns: _Optional[int] = ..., client_epoch: _Optional[int] = ..., directories: _Optional[_Iterable[str]] = ..., client_supports_batching: _Optional[bool] = ..., client_supports_metadata_chunks: _Optional[bool] = ..., client_supports_idle_heartbeat: _Optional[bool] = ...) -> None: ...

class SubscribeMetadataResponse(_message.Message):
    __slots__ = ("directory", "event_notification", "ts_ns", "events", "flushed_ts_ns")
    DIRECTORY_FIELD_NUMBER: _ClassVar[int]
    EVENT_NOTIFICATION_FIELD_NUMBER: _ClassVar[int]
    TS_NS_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    FLUSHED_TS_NS_FIELD_NUMBER: _ClassVar[int]
    directory: str
    event_notification: EventNotification
    ts_ns: int
    events: _containers.RepeatedCompositeFieldContainer[SubscribeMetadataResponse]
    flushed_ts_ns: int
    def __init__(self, directory: _Optional[str] = ..., event_notification: _Optional[_Union[EventNotification, _Mapping]] = ..., ts_ns: _Optional[int] = ..., events: _Optional[_Iterable[_Union[SubscribeMetadataResponse, _Mapping]]] = ..., flushed_ts_ns: _Optional[int] = ...) -> None: ...
