"""knative/crds as the real kube-apiserver enforces them: the seed's CEL rule, patterns, enums,
required fields, formats, list-map keys, defaults, pruning, and the status subresource with its
generation rules; and the product's guarded status write meeting the server's 409."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from devstack.kubernetes import ControlPlane
from functions.adapters.kube import Kube
from functions.resources.kinds import VLLM_ADAPTER

Factory = Callable[..., dict[str, Any]]
VLLM = "/apis/rackai.rackspace.com/v1alpha1"
SGLANG = "/apis/inference.rackai.rackspace.com/v1alpha1"
MERGE = {"Content-Type": "application/merge-patch+json"}
SKIPPED_RULES = {
    "reason": "FieldValueInvalid",
    "message": "Invalid value: null: some validation rules were not checked because the object was invalid; "
    "correct the existing errors to complete validation",
    "field": "<nil>",
}
"""What the server adds once schema errors kept it from evaluating the CEL rules."""
CONDITION = {
    "type": "Ready",
    "status": "True",
    "reason": "IntegrityVerified",
    "message": "",
    "lastTransitionTime": "2026-01-01T00:00:00Z",
}


def invalid(answer: httpx.Response) -> dict[str, Any]:
    """The 422 Status body of a refused write."""
    assert answer.status_code == 422, answer.text
    body: dict[str, Any] = answer.json()
    assert (body["kind"], body["reason"], body["code"]) == ("Status", "Invalid", 422)
    return body


def causes(answer: httpx.Response) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = invalid(answer)["details"]["causes"]
    return found


def adapters(namespace: str, api: str = VLLM) -> str:
    return f"{api}/namespaces/{namespace}/loraadapters"


def test_the_seeds_cel_rule_refuses_relative_integrity_keys_on_create_and_update(
    api: httpx.Client, namespace: str, vllm_adapter: Factory
) -> None:
    relative = vllm_adapter("cel", integrity={"md5": {"relative/file": "0" * 32}})
    body = invalid(api.post(adapters(namespace), json=relative))
    rule = "Spec.Integrity.MD5 keys must be absolute storage paths starting with '/'"
    assert (
        body["message"]
        == f'LoRAAdapter.rackai.rackspace.com "cel" is invalid: spec.integrity: Invalid value: {rule}'
    )
    assert body["details"]["causes"] == [
        {"reason": "FieldValueInvalid", "message": f"Invalid value: {rule}", "field": "spec.integrity"}
    ]
    absolute = vllm_adapter("cel", integrity={"md5": {"/loraadapters/a": "0" * 32}})
    assert api.post(adapters(namespace), json=absolute).status_code == 201
    patch = {"spec": {"integrity": {"md5": {"x": "y"}}}}
    assert (
        causes(api.patch(f"{adapters(namespace)}/cel", json=patch, headers=MERGE))[0]["field"]
        == "spec.integrity"
    )
    without = vllm_adapter("no-integrity")
    assert api.post(adapters(namespace), json=without).status_code == 201  # `!has(self.md5)` holds


def test_required_and_min_length_of_the_model(
    api: httpx.Client, namespace: str, vllm_adapter: Factory
) -> None:
    no_model = vllm_adapter("req")
    del no_model["spec"]["model"]
    assert causes(api.post(adapters(namespace), json=no_model)) == [
        {"reason": "FieldValueRequired", "message": "Required value", "field": "spec.model"},
        SKIPPED_RULES,
    ]
    assert causes(api.post(adapters(namespace), json=vllm_adapter("empty", model=""))) == [
        {
            "reason": "FieldValueInvalid",
            "message": 'Invalid value: "": spec.model in body should be at least 1 chars long',
            "field": "spec.model",
        }
    ]
    no_spec = {k: v for k, v in vllm_adapter("nospec").items() if k != "spec"}
    assert causes(api.post(adapters(namespace), json=no_spec))[0] == {
        "reason": "FieldValueRequired",
        "message": "Required value",
        "field": "spec",
    }


def test_status_enum_pattern_format_and_list_map_keys(
    api: httpx.Client, namespace: str, vllm_adapter: Factory
) -> None:
    assert api.post(adapters(namespace), json=vllm_adapter("st")).status_code == 201
    status = f"{adapters(namespace)}/st/status"

    def write(fields: dict[str, Any]) -> httpx.Response:
        return api.patch(status, json={"status": fields}, headers=MERGE)

    phase = causes(write({"phase": "Exploded"}))[0]
    assert (phase["reason"], phase["field"]) == ("FieldValueNotSupported", "status.phase")
    assert (
        phase["message"]
        == 'Unsupported value: "Exploded": supported values: "Pending", "Processing", "Ready", "Failed"'
    )
    reason = causes(write({"conditions": [dict(CONDITION, reason="not camel!")]}))[0]
    assert (reason["reason"], reason["field"]) == ("FieldValueInvalid", "status.conditions[0].reason")
    assert "should match" in reason["message"]
    twice = [CONDITION, dict(CONDITION, reason="Again")]
    assert causes(write({"conditions": twice})) == [
        {
            "reason": "FieldValueDuplicate",
            "message": 'Duplicate value: {"type":"Ready"}',
            "field": "status.conditions[1]",
        }
    ]
    stamp = causes(write({"conditions": [dict(CONDITION, lastTransitionTime="yesterday")]}))[0]
    assert (stamp["reason"], stamp["field"]) == (
        "FieldValueTypeInvalid",
        "status.conditions[0].lastTransitionTime",
    )
    served = [{"pod": "p", "fileSet": "a"}, {"pod": "p", "fileSet": "b"}]
    assert causes(write({"served": served}))[0]["reason"] == "FieldValueDuplicate"
    assert causes(write({"served": [{"pod": "p", "fileSet": "a", "residency": "away"}]}))[0]["field"] == (
        "status.served[0].residency"
    )
    assert causes(write({"size": "twelve"}))[0]["field"] == "status.size"
    assert causes(write({"usedBy": ["d1", "d1"]}))[0]["field"] == "status.usedBy[1]"
    written = write({"size": "12Mi", "conditions": [CONDITION], "phase": "Ready", "ready": True})
    assert written.status_code == 200, written.text
    assert written.json()["status"]["size"] == "12Mi"
    assert write({"size": 1024}).json()["status"]["size"] == 1024  # int-or-string: a number too


def test_the_sglang_kind_requires_its_reference_name_and_path(
    api: httpx.Client, namespace: str, sglang_adapter: Factory
) -> None:
    path = adapters(namespace, SGLANG)
    bare = sglang_adapter("bare")
    bare["spec"] = {}
    assert {(c["reason"], c["field"]) for c in causes(api.post(path, json=bare))} >= {
        ("FieldValueRequired", "spec.inferenceServiceRef"),
        ("FieldValueRequired", "spec.name"),
        ("FieldValueRequired", "spec.path"),
    }
    badly_named = sglang_adapter("named", name="-starts-with-a-dash")
    assert causes(api.post(path, json=badly_named))[0]["field"] == "spec.name"
    too_long = sglang_adapter("long", name="a" * 64)
    assert causes(api.post(path, json=too_long))[0]["reason"] == "FieldValueTooLong"
    created = api.post(path, json=sglang_adapter("ok"))
    assert created.status_code == 201, created.text
    condition = dict(CONDITION, type="Available", reason="RuntimeMismatch", status="False")
    written = api.patch(f"{path}/ok/status", json={"status": {"conditions": [condition]}}, headers=MERGE)
    assert written.status_code == 200, written.text


def test_defaults_and_enums_of_the_targets(api: httpx.Client, namespace: str) -> None:
    deployment = {
        "apiVersion": "rackai.rackspace.com/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": "md"},
        "spec": {"model": "m"},
    }
    created = api.post(f"{VLLM}/namespaces/{namespace}/modeldeployments", json=deployment)
    assert created.json()["spec"]["replicas"] == 1
    negative = dict(deployment, metadata={"name": "neg"}, spec={"model": "m", "replicas": -1})
    assert causes(api.post(f"{VLLM}/namespaces/{namespace}/modeldeployments", json=negative))[0]["field"] == (
        "spec.replicas"
    )
    service = {
        "apiVersion": "inference.rackai.rackspace.com/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "is"},
        "spec": {"runtime": "onnx"},
    }
    refused = causes(api.post(f"{SGLANG}/namespaces/{namespace}/inferenceservices", json=service))[0]
    assert (refused["reason"], refused["field"]) == ("FieldValueNotSupported", "spec.runtime")
    service["spec"] = {"runtime": "sglang"}
    answer = api.post(f"{SGLANG}/namespaces/{namespace}/inferenceservices", json=service)
    assert answer.json()["spec"] == {"runtime": "sglang", "replicas": 1}


def test_unknown_fields_are_pruned_or_refused_when_strict(
    api: httpx.Client, namespace: str, vllm_adapter: Factory
) -> None:
    body = vllm_adapter("strict", bogus=True, tags=["t"])
    strict = api.post(adapters(namespace), json=body, params={"fieldValidation": "Strict"})
    assert strict.status_code == 400
    assert 'unknown field "spec.bogus"' in strict.json()["message"]
    warned = api.post(adapters(namespace), json=body)
    assert warned.status_code == 201
    assert 'unknown field \\"spec.bogus\\"' in warned.headers["Warning"]
    assert warned.json()["spec"] == {"model": "llama3-8b-base", "tags": ["t"]}  # tags: ours, beyond the seed


def test_the_status_subresource_and_generation(
    api: httpx.Client, namespace: str, vllm_adapter: Factory
) -> None:
    body = vllm_adapter("gen")
    body["status"] = {"phase": "Ready"}
    created = api.post(adapters(namespace), json=body).json()
    assert created["metadata"]["generation"] == 1
    assert "status" not in created  # a create ignores .status
    path = f"{adapters(namespace)}/gen"
    status = api.patch(
        f"{path}/status",
        json={"status": {"phase": "Processing"}, "spec": {"model": "ignored"}},
        headers=MERGE,
    ).json()
    assert status["status"]["phase"] == "Processing"
    assert status["spec"]["model"] == "llama3-8b-base"  # /status writes nothing else
    assert status["metadata"]["generation"] == 1
    labelled = api.patch(
        path, json={"metadata": {"labels": {"x": "y"}}, "status": {"phase": "Failed"}}, headers=MERGE
    ).json()
    assert labelled["metadata"]["generation"] == 1  # metadata only
    assert labelled["status"]["phase"] == "Processing"  # the main resource ignores .status
    respecified = api.patch(path, json={"spec": {"sourceFineTuningJob": "job-1"}}, headers=MERGE).json()
    assert respecified["metadata"]["generation"] == 2


def test_a_stale_guarded_status_write_is_a_conflict_the_product_rereads(
    api: httpx.Client,
    plane: ControlPlane,
    namespace: str,
    vllm_adapter: Factory,
    tmp_path: Path,
    client_of: Callable[[Path], Kube],
) -> None:
    stale = api.post(adapters(namespace), json=vllm_adapter("race")).json()
    api.patch(f"{adapters(namespace)}/race/status", json={"status": {"phase": "Pending"}}, headers=MERGE)
    guarded = {
        "metadata": {"resourceVersion": stale["metadata"]["resourceVersion"]},
        "status": {"phase": "Ready"},
    }
    conflict = api.patch(f"{adapters(namespace)}/race/status", json=guarded, headers=MERGE)
    assert conflict.status_code == 409
    assert conflict.json()["reason"] == "Conflict"
    assert conflict.json()["message"] == (
        'Operation cannot be fulfilled on loraadapters.rackai.rackspace.com "race": '
        "the object has been modified; please apply your changes to the latest version and try again"
    )
    seen: list[str | None] = []

    def desired(current: dict[str, Any]) -> dict[str, Any]:
        seen.append((current.get("status") or {}).get("phase"))
        return {"phase": "Ready"}

    kube = client_of(plane.write_kubeconfig(tmp_path / "kubeconfig"))
    written = kube.write_status(VLLM_ADAPTER, namespace, "race", desired, current=stale)
    assert written is not None and written.obj["status"]["phase"] == "Ready"
    assert seen == [None, "Pending"]  # recomputed from the re-read after the server's 409


def test_the_observed_files_are_owned_whole_not_file_by_file(
    api: httpx.Client, namespace: str, vllm_adapter: Factory
) -> None:
    """status.integrity.files is an atomic map: the server's managedFields record it as one
    field, not one entry per file (which made a third of a 1,000-file object, and its cost on
    every write); a merge patch still changes it key by key."""
    api.post(adapters(namespace), json=vllm_adapter("many")).raise_for_status()
    directory = f"/loraadapters/{namespace}/m/many/"
    files = {f"{directory}f-{i:04d}.bin": {"size": i, "md5": f"{i:032x}"} for i in range(1000)}
    url = f"{adapters(namespace)}/many/status"
    api.patch(url, json={"status": {"integrity": {"files": files}}}, headers=MERGE).raise_for_status()
    gone, changed = f"{directory}f-0000.bin", f"{directory}f-0001.bin"
    patch = {gone: None, changed: {"size": 7, "md5": "0" * 32}}
    stored = api.patch(url, json={"status": {"integrity": {"files": patch}}}, headers=MERGE).json()
    observed = stored["status"]["integrity"]["files"]
    assert len(observed) == 999 and gone not in observed and observed[changed]["size"] == 7
    (status_owner,) = [m for m in stored["metadata"]["managedFields"] if m.get("subresource") == "status"]
    owned = status_owner["fieldsV1"]["f:status"]["f:integrity"]
    assert owned == {".": {}, "f:files": {}}
    assert len(str(stored["metadata"]["managedFields"])) < 1000


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_an_adapter_outlives_its_deletion_until_the_finalizer_goes(
    api: httpx.Client, namespace: str, vllm_adapter: Factory, sglang_adapter: Factory, kind: str
) -> None:
    body = vllm_adapter("fin") if kind == "vllm" else sglang_adapter("fin")
    body["metadata"]["finalizers"] = ["loraflow.io/unload"]
    path = adapters(namespace, VLLM if kind == "vllm" else SGLANG)
    assert api.post(path, json=body).status_code == 201
    assert api.delete(f"{path}/fin").status_code == 200
    held = api.get(f"{path}/fin").json()
    assert held["metadata"]["deletionTimestamp"]
    status = api.patch(f"{path}/fin/status", json={"status": {}}, headers=MERGE)
    assert status.status_code == 200  # the unload step still writes status while it drains
    released = api.patch(f"{path}/fin", json={"metadata": {"finalizers": None}}, headers=MERGE)
    assert released.status_code == 200
    assert api.get(f"{path}/fin").status_code == 404
