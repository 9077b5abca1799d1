"""The vllm kind (`rackai.rackspace.com/v1alpha1`): LoRAAdapter in SeaweedFS, Model, ModelDeployment."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from functions.resources.kinds import RACKAI_GROUP as GROUP
from functions.resources.kinds import VERSION
from functions.resources.meta import Condition, ObjectMeta, Quantity
from functions.resources.wire import WireModel

API_VERSION = f"{GROUP}/{VERSION}"

Phase = Literal["Pending", "Processing", "Ready", "Failed"]


class Integrity(WireModel):
    md5: dict[str, str] | None = None


class LoRAAdapterSpec(WireModel):
    model: str = Field(min_length=1)
    dataset: str | None = None
    description: str | None = Field(default=None, max_length=1024)
    display_name: str | None = Field(default=None, max_length=128)
    integrity: Integrity | None = None
    source_fine_tuning_job: str | None = None
    tags: list[str] | None = None


class FileInfo(WireModel):
    path: str
    size: int


class FileStatus(WireModel):
    md5: str | None = None
    size: int | None = None
    version: str | None = None
    """For a file storage listed without an MD5: what changes whenever its bytes do (stat)."""


class IntegrityStatus(WireModel):
    files: dict[str, FileStatus] | None = None


class StorageRef(WireModel):
    path: str | None = None


class ServedRecord(WireModel):
    """One pod and the verified file set it was loaded from (load, reload and unload keep these;
    verify drops those of a set it has just frozen, which the pod read from elsewhere)."""

    pod: str
    file_set: str
    residency: Literal["resident", "reloadable"] | None = None
    """Whether the pod's engine keeps the weights resident or reads them again on demand."""


class FrozenSet(WireModel):
    """A verified file set copied where only loraflow writes; the engines load it from `path`."""

    file_set: str
    path: str
    """The storage directory of the frozen copy (`/loraflow-frozen/{ns}/{model}/{name}/{digest}/`)."""
    size: int
    """Bytes it takes in storage."""
    frozen_at: str
    retired_at: str | None = None
    """When it stopped being the verified set: it is deleted once no pod serves it and the
    grace period (LORAFLOW_FROZEN_GRACE) has passed."""


class LoRAAdapterStatus(WireModel):
    conditions: list[Condition] | None = None
    file_set: str | None = None
    """The file set verify last accepted (a digest of the declared path -> MD5 pairs)."""
    files: list[FileInfo] | None = None
    frozen: list[FrozenSet] | None = None
    """The frozen copies of verified file sets: the current one, then retired ones not yet deleted."""
    integrity: IntegrityStatus | None = None
    observed_generation: int | None = None
    phase: Phase | None = None
    ready: bool | None = None
    served: list[ServedRecord] | None = None
    size: Quantity | None = None
    storage_ref: StorageRef | None = None
    upload_complete: bool | None = None
    used_by: list[str] | None = None


class LoRAAdapter(WireModel):
    api_version: str = API_VERSION
    kind: str = "LoRAAdapter"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: LoRAAdapterSpec
    status: LoRAAdapterStatus | None = None

    def declared_md5s(self) -> dict[str, str]:
        """spec.integrity.md5: each declared file's expected MD5 (none declared: empty)."""
        integrity = self.spec.integrity
        return dict(integrity.md5 or {}) if integrity is not None else {}

    def recorded_files(self) -> dict[str, FileStatus]:
        """status.integrity.files: what stat last observed of each file."""
        integrity = self.status.integrity if self.status is not None else None
        return dict(integrity.files or {}) if integrity is not None else {}


class ModelSpec(WireModel):
    display_name: str | None = None
    description: str | None = None
    source: str | None = None
    tags: list[str] | None = None


class Model(WireModel):
    api_version: str = API_VERSION
    kind: str = "Model"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: ModelSpec = Field(default_factory=ModelSpec)


class ModelDeploymentSpec(WireModel):
    model: str = Field(min_length=1)
    replicas: int | None = Field(default=None, ge=0)
    lora_adapters: list[str] | None = None
    engine_args: list[str] | None = None


class WorkloadStatus(WireModel):
    ready_replicas: int | None = None


class ModelDeployment(WireModel):
    api_version: str = API_VERSION
    kind: str = "ModelDeployment"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: ModelDeploymentSpec
    status: WorkloadStatus | None = None
