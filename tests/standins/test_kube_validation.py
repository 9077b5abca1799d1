"""CRD schema validation: CEL rules, pattern/enum/required, defaults, pruning, sets, formats."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from devstack.standins.kube import KubeServer

GROUP, VERSION, PLURAL, NS = "rackai.rackspace.com", "v1alpha1", "loraadapters", "default"
Factory = Callable[..., dict[str, Any]]


def _invalid(call: Callable[[], Any]) -> dict[str, Any]:
    with pytest.raises(ApiException) as caught:
        call()
    assert caught.value.status == 422
    body: dict[str, Any] = json.loads(caught.value.body)
    assert (body["kind"], body["reason"], body["code"]) == ("Status", "Invalid", 422)
    return body


def _gadget(custom: client.CustomObjectsApi, name: str, **spec: Any) -> dict[str, Any]:
    body = {"apiVersion": "test.loraflow.io/v1", "kind": "Gadget", "metadata": {"name": name}, "spec": spec}
    result: dict[str, Any] = custom.create_namespaced_custom_object(
        "test.loraflow.io", "v1", NS, "gadgets", body
    )
    return result


def test_cel_rule_integrity_keys_must_be_absolute(
    custom: client.CustomObjectsApi, make_adapter: Factory
) -> None:
    bad = make_adapter("cel", integrity={"md5": {"relative/file": "0" * 32}})
    body = _invalid(lambda: custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, bad))
    assert body["message"] == (
        'LoRAAdapter.rackai.rackspace.com "cel" is invalid: spec.integrity: Invalid value: '
        "\"object\": Spec.Integrity.MD5 keys must be absolute storage paths starting with '/'"
    )
    assert body["details"]["causes"] == [
        {
            "reason": "FieldValueInvalid",
            "field": "spec.integrity",
            "message": 'Invalid value: "object": Spec.Integrity.MD5 keys must be absolute storage '
            "paths starting with '/'",
        }
    ]
    assert body["details"]["kind"] == "LoRAAdapter"
    good = make_adapter("cel", integrity={"md5": {"/loraadapters/a": "0" * 32}})
    assert custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, good)
    _invalid(
        lambda: custom.patch_namespaced_custom_object(
            GROUP, VERSION, NS, PLURAL, "cel", {"spec": {"integrity": {"md5": {"x": "y"}}}}
        )
    )


def test_required_enum_pattern_on_spec_and_status(
    custom: client.CustomObjectsApi, make_adapter: Factory
) -> None:
    no_model = make_adapter("req")
    del no_model["spec"]["model"]
    body = _invalid(lambda: custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, no_model))
    assert body["details"]["causes"] == [
        {"reason": "FieldValueRequired", "message": "Required value", "field": "spec.model"}
    ]
    assert body["message"] == (
        'LoRAAdapter.rackai.rackspace.com "req" is invalid: spec.model: Required value'
    )
    empty = make_adapter("req", model="")
    body = _invalid(lambda: custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, empty))
    assert body["details"]["causes"][0]["field"] == "spec.model"
    custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, make_adapter("st"))
    body = _invalid(
        lambda: custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, NS, PLURAL, "st", {"status": {"phase": "Exploded"}}
        )
    )
    cause = body["details"]["causes"][0]
    assert (cause["reason"], cause["field"]) == ("FieldValueNotSupported", "status.phase")
    assert cause["message"] == (
        'Unsupported value: "Exploded": supported values: "Pending", "Processing", "Ready", "Failed"'
    )
    condition = {
        "type": "Ready",
        "status": "True",
        "reason": "not camel!",
        "message": "",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    body = _invalid(
        lambda: custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, NS, PLURAL, "st", {"status": {"conditions": [condition]}}
        )
    )
    cause = body["details"]["causes"][0]
    assert cause["field"] == "status.conditions[0].reason"
    assert "should match" in cause["message"]
    twice = [dict(condition, reason="Ok"), dict(condition, reason="Again")]
    body = _invalid(
        lambda: custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, NS, PLURAL, "st", {"status": {"conditions": twice}}
        )
    )
    cause = body["details"]["causes"][0]
    assert (cause["reason"], cause["field"]) == ("FieldValueDuplicate", "status.conditions[1]")
    assert cause["message"] == 'Duplicate value: map[string]interface {}{"type":"Ready"}'
    bad_time = dict(condition, reason="Ok", lastTransitionTime="yesterday")
    body = _invalid(
        lambda: custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, NS, PLURAL, "st", {"status": {"conditions": [bad_time]}}
        )
    )
    assert body["details"]["causes"][0]["field"] == "status.conditions[0].lastTransitionTime"
    ok = custom.patch_namespaced_custom_object_status(
        GROUP,
        VERSION,
        NS,
        PLURAL,
        "st",
        {"status": {"size": "12Mi", "conditions": [dict(condition, reason="Ok")]}},
    )
    assert ok["status"]["size"] == "12Mi"
    _invalid(
        lambda: custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, NS, PLURAL, "st", {"status": {"size": "twelve"}}
        )
    )
    assert (
        custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, NS, PLURAL, "st", {"status": {"size": 1024}}
        )["status"]["size"]
        == 1024
    )


def test_defaults_pruning_and_structural_rules(custom: client.CustomObjectsApi) -> None:
    created = _gadget(
        custom,
        "g1",
        size="1Gi",
        unknown="dropped",
        note=None,
        color=None,
        extra={"anything": {"goes": 1}},
        labels={"a": "b"},
    )
    # unknown pruned, null of a non-nullable field pruned then defaulted, nullable null kept
    assert created["spec"] == {
        "size": "1Gi",
        "color": "red",
        "replicas": 1,
        "note": None,
        "extra": {"anything": {"goes": 1}},
        "labels": {"a": "b"},
    }
    assert _gadget(custom, "g2", size=3)["spec"]["size"] == 3
    cases: list[tuple[dict[str, Any], str, str]] = [
        ({"size": "1Gi", "color": "green"}, "spec.color", "FieldValueNotSupported"),
        ({"size": "1Gi", "replicas": 9}, "spec.replicas", "FieldValueInvalid"),
        ({"size": "1Gi", "replicas": "two"}, "spec.replicas", "FieldValueInvalid"),
        ({"size": "lots"}, "spec.size", "FieldValueInvalid"),
        ({"size": "1Gi", "tags": ["a", "a"]}, "spec.tags[1]", "FieldValueDuplicate"),
        ({"size": "1Gi", "labels": {"k": "toolong"}}, "spec.labels.k", "FieldValueTooLong"),
        ({"size": "1Gi", "at": "noon"}, "spec.at", "FieldValueInvalid"),
        ({}, "spec.size", "FieldValueRequired"),
    ]
    for index, (spec, field, reason) in enumerate(cases):
        body = _invalid(lambda spec=spec, index=index: _gadget(custom, f"bad-{index}", **spec))
        assert (body["details"]["causes"][0]["field"], body["details"]["causes"][0]["reason"]) == (
            field,
            reason,
        ), spec
    nullable = _gadget(custom, "g3", size="1Gi", at="2026-01-01T00:00:00Z")
    assert nullable["spec"]["at"] == "2026-01-01T00:00:00Z"


def test_cel_transition_rules_message_expression_and_ratcheting(
    custom: client.CustomObjectsApi, kube_server: KubeServer
) -> None:
    _gadget(custom, "imm", size="1Gi", serial="s-1", even=2)
    body = _invalid(
        lambda: custom.patch_namespaced_custom_object(
            "test.loraflow.io", "v1", NS, "gadgets", "imm", {"spec": {"serial": "s-2"}}
        )
    )
    assert body["details"]["causes"] == [
        {
            "reason": "FieldValueInvalid",
            "field": "spec.serial",
            "message": 'Invalid value: "string": serial is immutable',
        }
    ]
    body = _invalid(
        lambda: custom.patch_namespaced_custom_object(
            "test.loraflow.io", "v1", NS, "gadgets", "imm", {"spec": {"even": 3}}
        )
    )
    assert body["details"]["causes"][0]["message"] == 'Invalid value: "integer": odd: 3'
    ok = custom.patch_namespaced_custom_object(
        "test.loraflow.io", "v1", NS, "gadgets", "imm", {"spec": {"replicas": 2}}
    )
    assert ok["metadata"]["generation"] == 2


def test_strict_field_validation_rejects_unknown_fields(
    kube_server: KubeServer, make_adapter: Factory
) -> None:
    import httpx

    url = f"{kube_server.url}/apis/{GROUP}/{VERSION}/namespaces/{NS}/{PLURAL}"
    auth = {"Authorization": f"Bearer {kube_server.admin_token}"}
    body = make_adapter("strict", bogus=True)
    strict = httpx.post(url, json=body, headers=auth, params={"fieldValidation": "Strict"})
    assert strict.status_code == 400
    assert 'unknown field "spec.bogus"' in strict.json()["message"]
    warn = httpx.post(url, json=body, headers=auth)
    assert warn.status_code == 201
    assert "spec.bogus" in warn.headers["Warning"]
    assert "bogus" not in warn.json()["spec"]


def test_real_crds_validate(real_kube_server: KubeServer, make_adapter: Factory) -> None:
    with client.ApiClient(real_kube_server.client_configuration()) as api:
        custom = client.CustomObjectsApi(api)
        bad = make_adapter("cel", integrity={"md5": {"relative": "0" * 32}})
        body = _invalid(lambda: custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, bad))
        assert body["details"]["causes"][0]["field"] == "spec.integrity"
        assert "absolute storage paths" in body["message"]
        created = custom.create_namespaced_custom_object(
            GROUP, VERSION, NS, PLURAL, make_adapter("ok", tags=["t"])
        )
        assert created["spec"]["tags"] == ["t"]
        deployment = custom.create_namespaced_custom_object(
            GROUP,
            VERSION,
            NS,
            "modeldeployments",
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "ModelDeployment",
                "metadata": {"name": "md"},
                "spec": {"model": "m"},
            },
        )
        assert deployment["spec"]["replicas"] == 1  # default applied
        body = _invalid(
            lambda: custom.create_namespaced_custom_object(
                "inference.rackai.rackspace.com",
                VERSION,
                NS,
                "inferenceservices",
                {
                    "apiVersion": f"inference.rackai.rackspace.com/{VERSION}",
                    "kind": "InferenceService",
                    "metadata": {"name": "is"},
                    "spec": {"runtime": "onnx"},
                },
            )
        )
        assert body["details"]["causes"][0]["field"] == "spec.runtime"
