"""Payloads of the CloudEvents loraflow emits: the public contract pipelines compose from.

Each type is versioned in its name; a breaking change is a new `.v2` type, never an edit.
"""

from __future__ import annotations

from typing import Literal

from events.records import Record, field

PREFIX = "io.loraflow"

FILE_CHANGED = f"{PREFIX}.file.changed.v1"
ADAPTER_ADMITTED = f"{PREFIX}.adapter.admitted.v1"
ADAPTER_STAT_COMPLETED = f"{PREFIX}.adapter.statcompleted.v1"
ADAPTER_READY = f"{PREFIX}.adapter.ready.v1"
ADAPTER_FAILED = f"{PREFIX}.adapter.failed.v1"
ADAPTER_LOADED = f"{PREFIX}.adapter.loaded.v1"
ADAPTER_UNLOADED = f"{PREFIX}.adapter.unloaded.v1"
POD_RELOADED = f"{PREFIX}.pod.reloaded.v1"
ADAPTER_DRIFTED = f"{PREFIX}.adapter.drifted.v1"

# Extension attribute carried by `adapter.drifted` so that Triggers can route a nudge to the
# one step that repairs it (CloudEvents extension names: lowercase alphanumerics, <= 20 chars).
STEP_EXTENSION = "loraflowstep"
DriftStep = Literal["admit", "stat", "load", "unload"]

NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


class Payload(Record):
    """Immutable; an unknown key is an error (a typo must not pass as an optional field)."""

    hashable = True
    extra = "forbid"


class AdapterRef(Payload):
    """Which LoRAAdapter an event is about; the handler re-reads it (the event is a nudge)."""

    api_version: Literal["rackai.rackspace.com/v1alpha1", "inference.rackai.rackspace.com/v1alpha1"] = field(
        alias="apiVersion"
    )
    namespace: str = field(pattern=LABEL_PATTERN, max_length=63)
    name: str = field(pattern=NAME_PATTERN, max_length=253)


class FileChanged(Payload):
    """A file under /loraadapters/ was created, updated, deleted or renamed in storage."""

    path: str = field(pattern=r"^/loraadapters/", max_length=4096)
    event_type: Literal["create", "update", "delete", "rename"] = field(alias="eventType")
    new_path: str | None = field(default=None, alias="newPath", max_length=4096)
    size: int | None = field(default=None, ge=0)
    md5: str | None = field(default=None, pattern=r"^[0-9a-f]{32}$")


class AdapterAdmitted(Payload):
    adapter: AdapterRef
    generation: int = field(ge=0)


class AdapterStatCompleted(Payload):
    adapter: AdapterRef
    files: int = field(ge=0)
    size: str


class AdapterReady(Payload):
    adapter: AdapterRef


class AdapterFailed(Payload):
    adapter: AdapterRef
    reason: str
    message: str


class PodFailure(Payload):
    pod: str
    reason: str
    message: str


class AdapterLoaded(Payload):
    adapter: AdapterRef
    pods: list[str]
    failed: list[PodFailure] = field(default_factory=list)


class AdapterUnloaded(Payload):
    adapter: AdapterRef
    pods: list[str]
    finalized: bool


class PodReloaded(Payload):
    namespace: str
    pod: str
    adapters: list[str]
    failed: list[PodFailure] = field(default_factory=list)


class AdapterDrifted(Payload):
    adapter: AdapterRef
    step: DriftStep
    reason: str
