"""Resource models round-trip real objects unchanged and follow the omitempty rule.

Fixtures are objects as the apiserver returns them (status with conditions, files,
integrity, a Quantity size, usedBy, managedFields with their empty `{}` markers, a label with
an empty value, a volume with `emptyDir: {}`), the seed's own example and the user-facing
manifests in examples/. Each one must:

- parse into its model and serialise back equal (json.dumps(sort_keys=True)): nothing invented,
  nothing dropped, no empty field emitted;
- validate against its CRD schema (structural schema converted to JSON Schema: `nullable`,
  int-or-string, and pruning turned into `additionalProperties: false` so that a fixture with a
  field the CRD does not know fails).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from functions.resources import inference, meta, rackai
from functions.resources.wire import WireModel
from tests.support.schemas import to_json_schema

ROOT = Path(__file__).resolve().parents[2]
CRDS = ROOT / "knative" / "crds"
EXAMPLES = ROOT / "examples"
SEED_DIRS = (ROOT.parent / "shared" / "seeds", ROOT / "tests" / "manifests" / "seeds")

Obj = dict[str, Any]

MODELS: dict[tuple[str, str], tuple[type[WireModel], str]] = {
    ("rackai.rackspace.com/v1alpha1", "LoRAAdapter"): (
        rackai.LoRAAdapter,
        "rackai.rackspace.com_loraadapters.yaml",
    ),
    ("rackai.rackspace.com/v1alpha1", "Model"): (rackai.Model, "rackai.rackspace.com_models.yaml"),
    ("rackai.rackspace.com/v1alpha1", "ModelDeployment"): (
        rackai.ModelDeployment,
        "rackai.rackspace.com_modeldeployments.yaml",
    ),
    ("inference.rackai.rackspace.com/v1alpha1", "LoRAAdapter"): (
        inference.SGLangAdapter,
        "inference.rackai.rackspace.com_loraadapters.yaml",
    ),
    ("inference.rackai.rackspace.com/v1alpha1", "InferenceService"): (
        inference.InferenceService,
        "inference.rackai.rackspace.com_inferenceservices.yaml",
    ),
}

PATH = "/loraadapters/team-a/llama3-8b-base/finance-qa"
MANAGED_FIELDS = [
    {
        "apiVersion": "rackai.rackspace.com/v1alpha1",
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:metadata": {"f:finalizers": {".": {}, 'v:"loraflow.io/unload"': {}}}},
        "manager": "loraflow-admit",
        "operation": "Update",
        "time": "2026-03-01T10:00:00Z",
    }
]


def metadata(name: str, **extra: Any) -> Obj:
    """Metadata as the apiserver returns it."""
    return {
        "name": name,
        "namespace": "team-a",
        "uid": "7f0d3c7e-63a9-4a40-9d1c-2b8f3f3f8e11",
        "resourceVersion": "48213",
        "generation": 2,
        "creationTimestamp": "2026-03-01T09:59:58Z",
        **extra,
    }


def condition(type_: str, status: str, reason: str, message: str) -> Obj:
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "observedGeneration": 2,
        "lastTransitionTime": "2026-03-01T10:00:05Z",
    }


VLLM_FULL: Obj = {
    "apiVersion": "rackai.rackspace.com/v1alpha1",
    "kind": "LoRAAdapter",
    "metadata": metadata(
        "finance-qa",
        finalizers=["loraflow.io/unload"],
        labels={"team": "finance", "loraflow.io/pinned": ""},
        annotations={"rackai.rackspace.com/owner": "alice"},
        managedFields=MANAGED_FIELDS,
    ),
    "spec": {
        "model": "llama3-8b-base",
        "displayName": "Finance Q&A Adapter",
        "description": "Finance Q&A adapter trained on internal Q3 2026 docs.",
        "dataset": "alpaca-train",
        "sourceFineTuningJob": "ftjob-finance-qa-7",
        "tags": ["finance", "qa"],
        "integrity": {"md5": {f"{PATH}/adapter_model.safetensors": "0cc175b9c0f1b6a831c399e269772661"}},
    },
    "status": {
        "conditions": [condition("Ready", "True", "IntegrityVerified", "1 of 1 declared files match")],
        "files": [
            {"path": f"{PATH}/adapter_config.json", "size": 712},
            {"path": f"{PATH}/adapter_model.safetensors", "size": 1610612736},
        ],
        "integrity": {
            "files": {
                f"{PATH}/adapter_config.json": {"size": 712},
                f"{PATH}/adapter_model.safetensors": {
                    "size": 1610612736,
                    "md5": "0cc175b9c0f1b6a831c399e269772661",
                },
            }
        },
        "observedGeneration": 2,
        "phase": "Ready",
        "ready": True,
        "size": "1536Mi",
        "storageRef": {"path": PATH},
        "uploadComplete": True,
        "usedBy": ["llama3-8b", "llama3-8b-canary"],
    },
}

VLLM_FAILED: Obj = {
    **copy.deepcopy(VLLM_FULL),
    "status": {
        "conditions": [condition("Ready", "False", "IntegrityCheckFailed", f"md5 mismatch: {PATH}/a.bin")],
        "observedGeneration": 0,
        "phase": "Failed",
        "ready": False,
        "size": 1024,
        "uploadComplete": False,
    },
}

SGLANG_FULL: Obj = {
    "apiVersion": "inference.rackai.rackspace.com/v1alpha1",
    "kind": "LoRAAdapter",
    "metadata": metadata("qwen-support-tone", finalizers=["loraflow.io/unload"]),
    "spec": {
        "name": "support-tone",
        "path": "/adapters/qwen/support-tone",
        "inferenceServiceRef": {"name": "qwen-chat", "namespace": "serving"},
    },
    "status": {
        "conditions": [
            condition("Available", "True", "InferenceServiceFound", "runtime sglang"),
            condition("Error", "False", "NoError", ""),
            condition("Loaded", "True", "Loaded", "loaded in 2 of 2 pods"),
        ],
        "lastLoadedAt": "2026-03-01T10:00:07Z",
        "loadedPath": "/adapters/qwen/support-tone",
    },
}

MODEL: Obj = {
    "apiVersion": "rackai.rackspace.com/v1alpha1",
    "kind": "Model",
    "metadata": metadata("llama3-8b-base"),
    "spec": {"displayName": "Llama 3 8B", "source": "hf://meta-llama/Meta-Llama-3-8B", "tags": ["base"]},
}

MODEL_DEPLOYMENT: Obj = {
    "apiVersion": "rackai.rackspace.com/v1alpha1",
    "kind": "ModelDeployment",
    "metadata": metadata("llama3-8b"),
    "spec": {"model": "llama3-8b-base", "replicas": 3, "loraAdapters": ["finance-qa"]},
    "status": {"readyReplicas": 0},
}

INFERENCE_SERVICE: Obj = {
    "apiVersion": "inference.rackai.rackspace.com/v1alpha1",
    "kind": "InferenceService",
    "metadata": metadata("qwen-chat", namespace="serving"),
    "spec": {
        "runtime": "sglang",
        "model": "Qwen/Qwen2.5-7B-Instruct",
        "replicas": 2,
        "extraVolumes": [
            {"name": "adapters", "persistentVolumeClaim": {"claimName": "sglang-adapters"}},
            {"name": "scratch", "emptyDir": {}},
        ],
    },
    "status": {"readyReplicas": 2},
}

FIXTURES = {
    "vllm-full": VLLM_FULL,
    "vllm-failed": VLLM_FAILED,
    "sglang-full": SGLANG_FULL,
    "model": MODEL,
    "modeldeployment": MODEL_DEPLOYMENT,
    "inferenceservice": INFERENCE_SERVICE,
}


def vllm_example() -> Obj:
    """The LoRAAdapter the seed's `example` values describe."""
    folder = next(d for d in SEED_DIRS if d.exists())
    openapi = json.loads((folder / "rackai-loraadapter-openapi.json").read_text())
    props = openapi["components"]["schemas"]["LoRAAdapter"]["properties"]
    spec = {k: v["example"] for k, v in props["spec"]["properties"].items() if "example" in v}
    return {
        "apiVersion": props["apiVersion"]["example"],
        "kind": props["kind"]["example"],
        "metadata": props["metadata"]["example"],
        "spec": spec,
    }


def example_objects() -> dict[str, Obj]:
    """The user-facing manifests in examples/ (custom resources only)."""
    found = {}
    for path in sorted(EXAMPLES.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and (doc["apiVersion"], doc["kind"]) in MODELS:
                found[f"examples/{path.name}"] = doc
    return found


ALL_OBJECTS = {**FIXTURES, **example_objects()}


def roundtrip(obj: Obj) -> Obj:
    model_type, _ = MODELS[(obj["apiVersion"], obj["kind"])]
    result: Obj = model_type.model_validate(obj).to_wire()
    return result


def canonical(obj: Obj) -> str:
    return json.dumps(obj, sort_keys=True)


def crd_validator(file_name: str) -> jsonschema.Draft202012Validator:
    crd = yaml.safe_load((CRDS / file_name).read_text())
    (version,) = crd["spec"]["versions"]
    return jsonschema.Draft202012Validator(to_json_schema(version["schema"]["openAPIV3Schema"]))


@pytest.mark.parametrize("name", sorted(ALL_OBJECTS))
def test_roundtrip_is_identity(name: str) -> None:
    obj = ALL_OBJECTS[name]
    assert canonical(roundtrip(obj)) == canonical(obj)


def test_seed_example_roundtrips() -> None:
    obj = vllm_example()
    assert obj["spec"]["model"] == "llama3-8b-base"
    assert canonical(roundtrip(obj)) == canonical(obj)
    crd_validator("rackai.rackspace.com_loraadapters.yaml").validate(obj)


@pytest.mark.parametrize("name", sorted(ALL_OBJECTS))
def test_object_validates_against_crd(name: str) -> None:
    obj = ALL_OBJECTS[name]
    _, crd_file = MODELS[(obj["apiVersion"], obj["kind"])]
    errors = [e.message for e in crd_validator(crd_file).iter_errors(obj)]
    assert errors == []


def test_crd_validation_can_fail() -> None:
    """An invented field, a bad phase and a relative integrity path... (CEL is not run here)."""
    obj = copy.deepcopy(VLLM_FULL)
    obj["spec"]["inventedField"] = "x"
    obj["status"]["phase"] = "Done"
    obj["status"]["size"] = "lots"
    messages = " ".join(
        e.message for e in crd_validator("rackai.rackspace.com_loraadapters.yaml").iter_errors(obj)
    )
    assert "inventedField" in messages
    assert "'Done'" in messages
    assert "'lots'" in messages


def test_empty_fields_are_omitted_zero_values_kept() -> None:
    """The omitempty rule: "", [], {} disappear; false and 0 stay (Go pointers)."""
    obj = copy.deepcopy(VLLM_FULL)
    obj["metadata"]["labels"] = {}
    obj["spec"].update(tags=[], description="", integrity={"md5": {}})
    obj["status"] = {
        "usedBy": [],
        "files": [],
        "ready": False,
        "observedGeneration": 0,
        "uploadComplete": False,
        "size": 0,
    }
    wire = roundtrip(obj)
    assert "labels" not in wire["metadata"]
    for key in ("tags", "description", "integrity"):
        assert key not in wire["spec"], key
    assert wire["status"] == {"ready": False, "observedGeneration": 0, "uploadComplete": False, "size": 0}


def test_condition_keeps_required_empty_message() -> None:
    """metav1.Condition.message is required (no omitempty): "" is sent, else the apiserver 422s."""
    wire = roundtrip(SGLANG_FULL)
    error = next(c for c in wire["status"]["conditions"] if c["type"] == "Error")
    assert error["message"] == ""
    crd_validator("inference.rackai.rackspace.com_loraadapters.yaml").validate(wire)


def test_condition_model_direct() -> None:
    built = meta.Condition(
        type="Loaded", status="False", reason="Pending", last_transition_time="2026-03-01T10:00:05Z"
    )
    assert built.to_wire() == {
        "type": "Loaded",
        "status": "False",
        "reason": "Pending",
        "message": "",
        "lastTransitionTime": "2026-03-01T10:00:05Z",
    }
