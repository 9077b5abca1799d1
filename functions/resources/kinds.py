"""Where each kind lives in the Kubernetes API, and the labels and finalizer we rely on."""

from __future__ import annotations

from typing import NamedTuple

from functions.resources import inference, rackai

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


VLLM_ADAPTER = Kind(rackai.GROUP, rackai.VERSION, "loraadapters", "LoRAAdapter")
MODEL = Kind(rackai.GROUP, rackai.VERSION, "models", "Model")
MODEL_DEPLOYMENT = Kind(rackai.GROUP, rackai.VERSION, "modeldeployments", "ModelDeployment")
SGLANG_ADAPTER = Kind(inference.GROUP, inference.VERSION, "loraadapters", "LoRAAdapter")
INFERENCE_SERVICE = Kind(inference.GROUP, inference.VERSION, "inferenceservices", "InferenceService")
POD = Kind("", "v1", "pods", "Pod")

ADAPTER_KINDS = {VLLM_ADAPTER.api_version: VLLM_ADAPTER, SGLANG_ADAPTER.api_version: SGLANG_ADAPTER}


def by_api_version_and_kind(api_version: str, kind: str) -> Kind | None:
    for known in (VLLM_ADAPTER, MODEL, MODEL_DEPLOYMENT, SGLANG_ADAPTER, INFERENCE_SERVICE, POD):
        if known.api_version == api_version and known.kind == kind:
            return known
    return None
