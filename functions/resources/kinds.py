"""Where each kind lives in the Kubernetes API, the labels and finalizer we rely on, and the one
table of the two LoRAAdapter kinds (`SERVING_KINDS`: each one's runtime, target and pod label).

Nothing here imports the models (functions.resources.rackai, .inference): the steps that read
raw objects (load, reload, unload, resync, ingest) need the kinds, not the models, and each
model class costs its definition at every cold start."""

from __future__ import annotations

from typing import Literal, NamedTuple, cast

RACKAI_GROUP = "rackai.rackspace.com"
"""The vllm kind: LoRAAdapter (vLLM), Model, ModelDeployment."""
INFERENCE_GROUP = "inference.rackai.rackspace.com"
"""The sglang kind: LoRAAdapter (SGLang), InferenceService."""
VERSION = "v1alpha1"

FINALIZER = "loraflow.io/unload"
MODEL_DEPLOYMENT_LABEL = "rackai.rackspace.com/model-deployment"
INFERENCE_SERVICE_LABEL = "inference.rackai.rackspace.com/inference-service"
RUNTIME_LABEL = "loraflow.io/runtime"
SERVING_LABEL = "loraflow.io/serving"


class Kind(NamedTuple):
    group: str
    version: str
    plural: str
    kind: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str, name: str) -> str:
        """The object's API path, as ApiServerSource puts it in `subject`."""
        prefix = f"/apis/{self.api_version}" if self.group else f"/api/{self.version}"
        return f"{prefix}/namespaces/{namespace}/{self.plural}/{name}"


VLLM_ADAPTER = Kind(RACKAI_GROUP, VERSION, "loraadapters", "LoRAAdapter")
MODEL = Kind(RACKAI_GROUP, VERSION, "models", "Model")
MODEL_DEPLOYMENT = Kind(RACKAI_GROUP, VERSION, "modeldeployments", "ModelDeployment")
SGLANG_ADAPTER = Kind(INFERENCE_GROUP, VERSION, "loraadapters", "LoRAAdapter")
INFERENCE_SERVICE = Kind(INFERENCE_GROUP, VERSION, "inferenceservices", "InferenceService")
POD = Kind("", "v1", "pods", "Pod")
NAMESPACE = Kind("", "v1", "namespaces", "Namespace")
LEASE = Kind("coordination.k8s.io", "v1", "leases", "Lease")
"""Where the filer source keeps its cursor (annotations of one Lease in its own namespace)."""

Runtime = Literal["vllm", "sglang"]
TargetKind = Literal["ModelDeployment", "InferenceService"]
AdapterApiVersion = Literal["rackai.rackspace.com/v1alpha1", "inference.rackai.rackspace.com/v1alpha1"]


class ServingKind(NamedTuple):
    """One of the two LoRAAdapter kinds and what serves it. The layers above read these facts
    from `SERVING_KINDS` alone, so that they cannot disagree."""

    runtime: Runtime
    """The adapter's kind in the serving planner (its AdapterKey) and its engine."""
    adapter: Kind
    target: Kind
    """What serves it: a ModelDeployment (vllm) or an InferenceService (sglang)."""
    pod_label: str
    """The label that names the target on each of its Pods."""

    @property
    def api_version(self) -> AdapterApiVersion:
        # a Kind holds plain strings; tests/unit/test_kinds.py holds both rows to these Literals
        return cast(AdapterApiVersion, self.adapter.api_version)

    @property
    def target_kind(self) -> TargetKind:
        return cast(TargetKind, self.target.kind)


SERVING_KINDS = (
    ServingKind("vllm", VLLM_ADAPTER, MODEL_DEPLOYMENT, MODEL_DEPLOYMENT_LABEL),
    ServingKind("sglang", SGLANG_ADAPTER, INFERENCE_SERVICE, INFERENCE_SERVICE_LABEL),
)
SERVING_BY_RUNTIME: dict[str, ServingKind] = {s.runtime: s for s in SERVING_KINDS}
SERVING_BY_TARGET: dict[str, ServingKind] = {s.target.kind: s for s in SERVING_KINDS}
"""By the target's kind name, as a TargetKey holds it."""
SERVING_BY_API_VERSION: dict[str, ServingKind] = {s.adapter.api_version: s for s in SERVING_KINDS}
ADAPTER_KINDS = {s.adapter.api_version: s.adapter for s in SERVING_KINDS}


def by_api_version_and_kind(api_version: str, kind: str) -> Kind | None:
    for known in (VLLM_ADAPTER, MODEL, MODEL_DEPLOYMENT, SGLANG_ADAPTER, INFERENCE_SERVICE, POD):
        if known.api_version == api_version and known.kind == kind:
            return known
    return None
