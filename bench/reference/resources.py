"""The vllm LoRAAdapter and the engine listing as they were read before pydantic (the
reference of bench/models.py; see the package docstring)."""

from __future__ import annotations

import json
from typing import ClassVar, Literal

from bench.reference.records import Record, field, to_camel


class WireModel(Record):
    extra = "allow"
    wire_names = to_camel
    omit_empty = True


class ObjectMeta(WireModel):
    name: str | None = None
    namespace: str | None = None
    uid: str | None = None
    resource_version: str | None = None
    generation: int | None = None
    creation_timestamp: str | None = None
    deletion_timestamp: str | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    finalizers: list[str] | None = None


class Condition(WireModel):
    always_emit: ClassVar[frozenset[str]] = frozenset({"message"})

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str = field(min_length=1, max_length=1024)
    message: str = field(default="", max_length=32768)
    last_transition_time: str
    observed_generation: int | None = None


class Integrity(WireModel):
    md5: dict[str, str] | None = None


class LoRAAdapterSpec(WireModel):
    model: str = field(min_length=1)
    dataset: str | None = None
    description: str | None = field(default=None, max_length=1024)
    display_name: str | None = field(default=None, max_length=128)
    integrity: Integrity | None = None
    source_fine_tuning_job: str | None = None
    tags: list[str] | None = None


class FileInfo(WireModel):
    path: str
    size: int


class FileStatus(WireModel):
    md5: str | None = None
    size: int | None = None


class IntegrityStatus(WireModel):
    files: dict[str, FileStatus] | None = None


class StorageRef(WireModel):
    path: str | None = None


class LoRAAdapterStatus(WireModel):
    conditions: list[Condition] | None = None
    files: list[FileInfo] | None = None
    integrity: IntegrityStatus | None = None
    observed_generation: int | None = None
    phase: Literal["Pending", "Processing", "Ready", "Failed"] | None = None
    ready: bool | None = None
    size: int | str | None = None
    storage_ref: StorageRef | None = None
    upload_complete: bool | None = None
    used_by: list[str] | None = None


class LoRAAdapter(WireModel):
    api_version: str = "rackai.rackspace.com/v1alpha1"
    kind: str = "LoRAAdapter"
    metadata: ObjectMeta = field(default_factory=ObjectMeta)
    spec: LoRAAdapterSpec
    status: LoRAAdapterStatus | None = None

    # the two readers production's model has since (stat.decide calls them), as stat then
    # wrote them inline: the same work on both sides
    def declared_md5s(self) -> dict[str, str]:
        return dict((self.spec.integrity.md5 if self.spec.integrity else None) or {})

    def recorded_files(self) -> dict[str, FileStatus]:
        integrity = self.status.integrity if self.status else None
        return dict((integrity.files if integrity else None) or {})


def adapters_listed(body: bytes) -> dict[str, str]:
    cards = json.loads(body).get("data") or []
    return {str(c["id"]): str(c.get("root") or "") for c in cards if isinstance(c, dict) and c.get("parent")}
