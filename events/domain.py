"""Payloads of the CloudEvents loraflow emits: the public contract pipelines compose from.

Each type is versioned in its name; a breaking change is a new `.v2` type, never an edit.
The payloads are pydantic models, importable without anything of the functions:

    from events.domain import ADAPTER_READY, AdapterReady

    ready = AdapterReady.model_validate(event.data)       # or model_validate_json(body)
    data = ready.model_dump(mode="json", exclude_none=True)  # the wire form our steps send
    schema = AdapterReady.model_json_schema()              # = events/schemas/<type>.json
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field
from pydantic.alias_generators import to_camel

from events.base import Model

PREFIX = "io.loraflow"

FILE_CHANGED = f"{PREFIX}.file.changed.v1"
ADAPTER_ADMITTED = f"{PREFIX}.adapter.admitted.v1"
ADAPTER_STAT_COMPLETED = f"{PREFIX}.adapter.statcompleted.v1"
ADAPTER_READY = f"{PREFIX}.adapter.ready.v1"
ADAPTER_FAILED = f"{PREFIX}.adapter.failed.v1"
ADAPTER_DELETING = f"{PREFIX}.adapter.deleting.v1"
ADAPTER_LOADED = f"{PREFIX}.adapter.loaded.v1"
"""Deprecated: emitted beside `ADAPTER_LOADED_V2` (which says which file set is served) until 0.3."""
ADAPTER_LOADED_V2 = f"{PREFIX}.adapter.loaded.v2"
ADAPTER_UNLOADED = f"{PREFIX}.adapter.unloaded.v1"
POD_RELOADED = f"{PREFIX}.pod.reloaded.v1"
ADAPTER_DRIFTED = f"{PREFIX}.adapter.drifted.v1"
RESYNC_SHARD = f"{PREFIX}.resync.shard.v1"

# Extension attribute carried by `adapter.drifted` so that Triggers can route a nudge to the
# one step that repairs it (CloudEvents extension names: lowercase alphanumerics, <= 20 chars).
STEP_EXTENSION = "loraflowstep"
DriftStep = Literal["admit", "stat", "load", "unload"]

NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


class Payload(Model):
    """Base of every payload: an immutable value (hashable when its fields are), camelCase on the
    wire (Python names accepted too), JSON's types taken strictly ("1" is not 1, 1 is not true,
    1.0 is not 1), and an unknown key is an error (a typo must not pass as an optional field)."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        strict=True,
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        # Validators are built on a model's first use, not at import: a step's cold start pays
        # only for the payloads its events carry.
        defer_build=True,
    )


class AdapterRef(Payload):
    """Which LoRAAdapter an event is about; the handler re-reads it (the event is a nudge)."""

    api_version: Literal["rackai.rackspace.com/v1alpha1", "inference.rackai.rackspace.com/v1alpha1"]
    namespace: str = Field(pattern=LABEL_PATTERN, max_length=63)
    name: str = Field(pattern=NAME_PATTERN, max_length=253)


class FileChanged(Payload):
    """A file under /loraadapters/ was created, updated, deleted or renamed in storage."""

    path: str = Field(pattern=r"^/loraadapters/", max_length=4096)
    event_type: Literal["create", "update", "delete", "rename"]
    new_path: str | None = Field(default=None, max_length=4096)
    size: int | None = Field(default=None, ge=0)
    md5: str | None = Field(default=None, pattern=r"^[0-9a-f]{32}$")


class AdapterAdmitted(Payload):
    adapter: AdapterRef
    generation: int = Field(ge=0)


class AdapterStatCompleted(Payload):
    adapter: AdapterRef
    files: int = Field(ge=0)
    size: str


class AdapterReady(Payload):
    adapter: AdapterRef


class AdapterFailed(Payload):
    adapter: AdapterRef
    reason: str
    message: str


class AdapterDeleting(Payload):
    """The adapter's deletion was requested and our finalizer holds it until every copy is
    unloaded from the engines."""

    adapter: AdapterRef


class PodFailure(Payload):
    pod: str
    reason: str
    message: str


class AdapterLoaded(Payload):
    adapter: AdapterRef
    pods: list[str]
    failed: list[PodFailure] = Field(default_factory=list)


class AdapterLoadedV2(Payload):
    """v1 plus the file set the listed pods now serve: for a vllm adapter the digest of the MD5s
    verify accepted (status.fileSet), for an sglang adapter its spec.path. A retrained adapter
    under the same name gets a new file set, so a pipeline can tell old weights from new."""

    adapter: AdapterRef
    file_set: str = Field(min_length=1, max_length=4096)
    pods: list[str]
    failed: list[PodFailure] = Field(default_factory=list)


class AdapterUnloaded(Payload):
    adapter: AdapterRef
    pods: list[str]
    finalized: bool


class PodReloaded(Payload):
    namespace: str
    pod: str
    adapters: list[str]
    failed: list[PodFailure] = Field(default_factory=list)


class AdapterDrifted(Payload):
    adapter: AdapterRef
    step: DriftStep
    reason: str


MAX_SHARD_NAMESPACES = 1000
"""Namespaces in one resync shard event: ~64 KiB of names at most (a broker's event size limit,
e.g. Kafka's 1 MB default, is far off); a tick over more namespaces publishes more shards."""

Namespace = Annotated[str, Field(pattern=LABEL_PATTERN, max_length=63)]


class ResyncShard(Payload):
    """One part of a resync tick: the namespaces one instance judges. The tick's resync lists the
    namespaces and publishes one shard per part (LORAFLOW_RESYNC_SHARDS), so that the parts are
    judged side by side; `full` and `reason` are the tick's."""

    namespaces: list[Namespace] = Field(min_length=1, max_length=MAX_SHARD_NAMESPACES)
    shard: int = Field(ge=0)
    shards: int = Field(ge=1)
    full: bool = False
    reason: str | None = Field(default=None, max_length=1024)
