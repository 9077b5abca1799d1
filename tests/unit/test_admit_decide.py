"""admit.decide_vllm / decide_sglang: whole resulting status, no mocks."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from functions.admit import decide_sglang, decide_vllm
from functions.logic.facts import file_set
from functions.resources.inference import InferenceService, SGLangAdapter
from functions.resources.rackai import LoRAAdapter

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
T_NOW = "2026-03-01T12:00:00Z"
T_OLD = "2026-01-01T00:00:00Z"
DIR = "/loraadapters/ns/llama/a/"


def vllm(
    spec: dict[str, Any] | None = None, status: dict[str, Any] | None = None, gen: int = 2
) -> LoRAAdapter:
    body: dict[str, Any] = {
        "apiVersion": "rackai.rackspace.com/v1alpha1",
        "kind": "LoRAAdapter",
        "metadata": {"name": "a", "namespace": "ns", "generation": gen},
        "spec": {"model": "llama", **(spec or {})},
    }
    if status is not None:
        body["status"] = status
    return LoRAAdapter.model_validate(body)


def ready(status: str, reason: str, message: str, t: str = T_NOW, gen: int = 2) -> dict[str, Any]:
    return {
        "type": "Ready",
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": t,
        "observedGeneration": gen,
    }


ADMITTED_MSG = "Spec accepted; waiting for the storage observation and the integrity check"
FILES = {"files": [{"path": DIR + "w", "size": 4}], "size": "4"}


@pytest.mark.parametrize(
    ("adapter", "model_exists", "expected"),
    [
        pytest.param(
            vllm(),
            True,
            {
                "conditions": [ready("Unknown", "Admitted", ADMITTED_MSG)],
                "storageRef": {"path": DIR},
                "observedGeneration": 2,
                "phase": "Pending",
                "ready": False,
            },
            id="first-admission",
        ),
        pytest.param(
            vllm(),
            False,
            {
                "conditions": [ready("False", "ModelNotFound", "Model 'llama' not found in namespace 'ns'")],
                "storageRef": {"path": DIR},
                "observedGeneration": 2,
                "phase": "Failed",
                "ready": False,
            },
            id="model-not-found",
        ),
        pytest.param(
            vllm({"model": "Not_A_Name"}),
            True,
            {
                "conditions": [
                    ready("False", "ModelNotFound", "Model 'Not_A_Name' not found in namespace 'ns'")
                ],
                "observedGeneration": 2,
                "phase": "Failed",
                "ready": False,
            },
            id="model-name-cannot-exist",
        ),
        pytest.param(
            vllm({"integrity": {"md5": {DIR + "ok": "0" * 32, "/loraadapters/ns/llama/b/x": "1" * 32}}}),
            True,
            {
                "conditions": [
                    ready(
                        "False",
                        "IntegrityPathOutsideAdapter",
                        f"spec.integrity.md5 keys must lie under {DIR}: /loraadapters/ns/llama/b/x",
                    )
                ],
                "storageRef": {"path": DIR},
                "observedGeneration": 2,
                "phase": "Failed",
                "ready": False,
            },
            id="integrity-key-outside",
        ),
        pytest.param(
            vllm({"integrity": {"md5": {DIR + "../b/x": "1" * 32}}}),
            True,
            {
                "conditions": [
                    ready(
                        "False",
                        "IntegrityPathOutsideAdapter",
                        f"spec.integrity.md5 keys must lie under {DIR}: {DIR}../b/x",
                    )
                ],
                "storageRef": {"path": DIR},
                "observedGeneration": 2,
                "phase": "Failed",
                "ready": False,
            },
            id="integrity-key-traversal",
        ),
        pytest.param(
            vllm(
                status={
                    "conditions": [ready("True", "IntegrityVerified", "ok", T_OLD, 1)],
                    "observedGeneration": 1,
                    "uploadComplete": True,
                    "usedBy": ["dep"],
                    **FILES,
                }
            ),
            True,
            {
                "conditions": [ready("True", "IntegrityVerified", "ok", T_OLD, 1)],
                "storageRef": {"path": DIR},
                "observedGeneration": 2,
                "uploadComplete": True,
                "usedBy": ["dep"],
                "phase": "Ready",
                "ready": True,
                **FILES,
            },
            id="new-generation-keeps-verify-verdict-and-other-fields",
        ),
        pytest.param(
            vllm(
                status={
                    "conditions": [ready("False", "ModelNotFound", "gone", T_OLD)],
                    "storageRef": {"path": DIR},
                    "observedGeneration": 2,
                    **FILES,
                }
            ),
            True,
            {
                "conditions": [ready("Unknown", "Admitted", ADMITTED_MSG)],
                "storageRef": {"path": DIR},
                "observedGeneration": 2,
                "phase": "Processing",
                "ready": False,
                **FILES,
            },
            id="model-appeared-clears-failure",
        ),
        pytest.param(
            vllm(
                status={
                    "conditions": [
                        ready("False", "ModelNotFound", "Model 'llama' not found in namespace 'ns'", T_OLD)
                    ],
                    "storageRef": {"path": DIR},
                    "observedGeneration": 2,
                    "phase": "Failed",
                    "ready": False,
                }
            ),
            False,
            {
                "conditions": [
                    ready("False", "ModelNotFound", "Model 'llama' not found in namespace 'ns'", T_OLD)
                ],
                "storageRef": {"path": DIR},
                "observedGeneration": 2,
                "phase": "Failed",
                "ready": False,
            },
            id="repeat-is-identical",
        ),
        pytest.param(
            vllm(
                spec={"integrity": {"md5": {DIR + "w": "b" * 32}}},
                status={
                    "conditions": [ready("True", "IntegrityVerified", "ok", T_OLD, 1)],
                    "fileSet": file_set({DIR + "w": "a" * 32}),
                    "observedGeneration": 1,
                    **FILES,
                },
            ),
            True,
            {
                "conditions": [
                    ready(
                        "Unknown",
                        "AwaitingVerification",
                        "spec.integrity.md5 changed; waiting for the integrity check",
                    )
                ],
                "fileSet": file_set({DIR + "w": "a" * 32}),
                "storageRef": {"path": DIR},
                "observedGeneration": 2,
                "phase": "Processing",
                "ready": False,
                **FILES,
            },
            id="new-md5s-take-ready-back-until-verify-rules",
        ),
        pytest.param(
            vllm(
                spec={"integrity": {"md5": {DIR + "w": "a" * 32}}, "description": "edited"},
                status={
                    "conditions": [ready("True", "IntegrityVerified", "ok", T_OLD, 1)],
                    "fileSet": file_set({DIR + "w": "a" * 32}),
                    "observedGeneration": 1,
                    **FILES,
                },
            ),
            True,
            {
                "conditions": [ready("True", "IntegrityVerified", "ok", T_OLD, 1)],
                "fileSet": file_set({DIR + "w": "a" * 32}),
                "storageRef": {"path": DIR},
                "observedGeneration": 2,
                "phase": "Ready",
                "ready": True,
                **FILES,
            },
            id="another-spec-edit-keeps-ready",
        ),
    ],
)
def test_decide_vllm(adapter: LoRAAdapter, model_exists: bool, expected: dict[str, Any]) -> None:
    assert decide_vllm(adapter, model_exists, NOW).to_wire() == expected


def sglang(status: dict[str, Any] | None = None, ref_ns: str | None = None) -> SGLangAdapter:
    ref: dict[str, Any] = {"name": "isvc"}
    if ref_ns:
        ref["namespace"] = ref_ns
    body: dict[str, Any] = {
        "apiVersion": "inference.rackai.rackspace.com/v1alpha1",
        "kind": "LoRAAdapter",
        "metadata": {"name": "s", "namespace": "ns", "generation": 1},
        "spec": {"inferenceServiceRef": ref, "name": "handle", "path": "/models/x"},
    }
    if status is not None:
        body["status"] = status
    return SGLangAdapter.model_validate(body)


def isvc(runtime: str) -> InferenceService:
    return InferenceService.model_validate(
        {"metadata": {"name": "isvc", "namespace": "ns"}, "spec": {"runtime": runtime}}
    )


def cond(type_: str, status: str, reason: str, message: str, t: str = T_NOW) -> dict[str, Any]:
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": t,
        "observedGeneration": 1,
    }


OK = "InferenceService ns/isvc runs sglang"
NO_ERR = "No reconcile step reports an error"
MISMATCH = "InferenceService ns/isvc runs runtime 'vllm'; this adapter kind needs 'sglang'"
LOADED = cond("Loaded", "True", "Loaded", "loaded", T_OLD)


@pytest.mark.parametrize(
    ("adapter", "target", "expected"),
    [
        pytest.param(
            sglang(),
            isvc("sglang"),
            {
                "conditions": [
                    cond("Available", "True", "InferenceServiceReady", OK),
                    cond("Error", "False", "NoError", NO_ERR),
                ]
            },
            id="available",
        ),
        pytest.param(
            sglang(ref_ns="other"),
            None,
            {
                "conditions": [
                    cond(
                        "Available",
                        "False",
                        "InferenceServiceNotFound",
                        "InferenceService other/isvc not found",
                    ),
                    cond(
                        "Error", "True", "InferenceServiceNotFound", "InferenceService other/isvc not found"
                    ),
                ]
            },
            id="not-found-other-namespace",
        ),
        pytest.param(
            sglang(),
            isvc("vllm"),
            {
                "conditions": [
                    cond("Available", "False", "RuntimeMismatch", MISMATCH),
                    cond("Error", "True", "RuntimeMismatch", MISMATCH),
                ]
            },
            id="runtime-mismatch",
        ),
        pytest.param(
            sglang(
                {
                    "conditions": [
                        cond("Available", "False", "RuntimeMismatch", MISMATCH, T_OLD),
                        cond("Error", "True", "RuntimeMismatch", MISMATCH, T_OLD),
                        LOADED,
                    ],
                    "loadedPath": "/models/x",
                }
            ),
            isvc("sglang"),
            {
                "conditions": [
                    cond("Available", "True", "InferenceServiceReady", OK),
                    cond("Error", "False", "NoError", NO_ERR),
                    LOADED,
                ],
                "loadedPath": "/models/x",
            },
            id="mismatch-fixed-keeps-loaded",
        ),
        pytest.param(
            sglang(
                {
                    "conditions": [
                        cond("Available", "True", "InferenceServiceReady", OK, T_OLD),
                        cond("Error", "True", "LoadFailed", "HTTP 500", T_OLD),
                    ]
                }
            ),
            isvc("sglang"),
            {
                "conditions": [
                    cond("Available", "True", "InferenceServiceReady", OK, T_OLD),
                    cond("Error", "True", "LoadFailed", "HTTP 500", T_OLD),
                ]
            },
            id="keeps-other-steps-error",
        ),
    ],
)
def test_decide_sglang(
    adapter: SGLangAdapter, target: InferenceService | None, expected: dict[str, Any]
) -> None:
    assert decide_sglang(adapter, target, NOW).to_wire() == expected


def foreign_isvc(accepts: str | None) -> InferenceService:
    annotations = {"loraflow.io/accept-adapters-from": accepts} if accepts else {}
    return InferenceService.model_validate(
        {
            "metadata": {"name": "isvc", "namespace": "team-b", "annotations": annotations},
            "spec": {"runtime": "sglang"},
        }
    )


@pytest.mark.parametrize(
    ("target", "path", "roots", "reason"),
    [
        pytest.param(foreign_isvc(None), "/models/x", ("/",), "ReferenceNotPermitted", id="no-consent"),
        pytest.param(
            foreign_isvc("team-c"), "/models/x", ("/",), "ReferenceNotPermitted", id="others-accepted"
        ),
        pytest.param(foreign_isvc("team-c, ns"), "/models/x", ("/",), "InferenceServiceReady", id="accepted"),
        pytest.param(foreign_isvc("*"), "/models/x", ("/",), "InferenceServiceReady", id="accepts-any"),
        pytest.param(foreign_isvc("*"), "/sg/../loraadapters/b/m/x", ("/",), "PathNotAllowed", id="dotdot"),
        pytest.param(foreign_isvc("*"), "/tmp/x", ("/models",), "PathNotAllowed", id="outside-the-roots"),
        pytest.param(
            foreign_isvc("*"), "/models/x", ("/models",), "InferenceServiceReady", id="inside-the-roots"
        ),
    ],
)
def test_consent_and_paths(target: InferenceService, path: str, roots: tuple[str, ...], reason: str) -> None:
    adapter = sglang(ref_ns="team-b").model_copy(
        update={"spec": sglang(ref_ns="team-b").spec.model_copy(update={"path": path})}
    )
    status = decide_sglang(adapter, target, NOW, roots)
    available = next(c for c in status.conditions or [] if c.type == "Available")
    error = next(c for c in status.conditions or [] if c.type == "Error")
    assert available.reason == reason
    assert (available.status == "True") is (reason == "InferenceServiceReady")
    assert error.status == ("False" if reason == "InferenceServiceReady" else "True")
