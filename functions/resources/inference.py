"""The sglang kind (`inference.rackai.rackspace.com/v1alpha1`): LoRAAdapter for SGLang, InferenceService."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from functions.resources.kinds import INFERENCE_GROUP as GROUP
from functions.resources.kinds import VERSION
from functions.resources.meta import Condition, ObjectMeta
from functions.resources.rackai import WorkloadStatus
from functions.resources.wire import WireModel

API_VERSION = f"{GROUP}/{VERSION}"

Runtime = Literal["sglang", "vllm", "tgi", "triton"]
ADAPTER_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"


class InferenceServiceRef(WireModel):
    name: str
    namespace: str | None = None


class SGLangAdapterSpec(WireModel):
    inference_service_ref: InferenceServiceRef
    name: str = Field(min_length=1, max_length=63, pattern=ADAPTER_NAME_PATTERN)
    path: str = Field(min_length=1)


class SGLangServedRecord(WireModel):
    """One pod serving the adapter now, and from which path (load, reload and unload keep these)."""

    pod: str
    path: str
    residency: Literal["resident", "reloadable"] | None = None


class SGLangAdapterStatus(WireModel):
    conditions: list[Condition] | None = None
    last_loaded_at: str | None = None
    loaded_path: str | None = None
    served: list[SGLangServedRecord] | None = None


class SGLangAdapter(WireModel):
    api_version: str = API_VERSION
    kind: str = "LoRAAdapter"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: SGLangAdapterSpec
    status: SGLangAdapterStatus | None = None


class InferenceServiceSpec(WireModel):
    runtime: Runtime
    model: str | None = None
    replicas: int | None = Field(default=None, ge=0)
    extra_volumes: list[dict[str, Any]] | None = None
    engine_args: list[str] | None = None


class InferenceService(WireModel):
    api_version: str = API_VERSION
    kind: str = "InferenceService"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: InferenceServiceSpec
    status: WorkloadStatus | None = None
