"""Discovery, OpenAPI, Table output, the seed's list operation, counters and fault injection."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from devstack.standins.kube import KubeServer

GROUP, VERSION, PLURAL, NS = "rackai.rackspace.com", "v1alpha1", "loraadapters", "default"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
Factory = Callable[..., dict[str, Any]]


def _get(server: KubeServer, path: str, **kwargs: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {server.admin_token}", **kwargs.pop("headers", {})}
    return httpx.get(server.url + path, headers=headers, **kwargs)


def test_discovery_documents(kube_server: KubeServer) -> None:
    assert _get(kube_server, "/version").json()["major"] == "1"
    assert _get(kube_server, "/api").json()["versions"] == ["v1"]
    core = {r["name"]: r for r in _get(kube_server, "/api/v1").json()["resources"]}
    assert {"pods", "pods/status", "namespaces", "events"} <= core.keys()
    assert core["pods"]["namespaced"] and not core["namespaces"]["namespaced"]
    groups = {g["name"] for g in _get(kube_server, "/apis").json()["groups"]}
    assert {GROUP, "test.loraflow.io", "apiextensions.k8s.io"} <= groups
    resources = {r["name"]: r for r in _get(kube_server, f"/apis/{GROUP}/{VERSION}").json()["resources"]}
    assert resources[PLURAL]["kind"] == "LoRAAdapter"
    assert resources[PLURAL]["shortNames"] == ["lora"]
    assert "watch" in resources[PLURAL]["verbs"]
    assert resources[f"{PLURAL}/status"]["verbs"] == ["get", "patch", "update"]
    crds = _get(kube_server, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions").json()
    assert sorted(c["metadata"]["name"] for c in crds["items"]) == [
        "gadgets.test.loraflow.io",
        f"{PLURAL}.{GROUP}",
    ]
    openapi = _get(kube_server, "/openapi/v3").json()["paths"]
    assert f"apis/{GROUP}/{VERSION}" in openapi
    assert _get(kube_server, "/nope").status_code == 404
    assert _get(kube_server, f"/apis/{GROUP}/{VERSION}/namespaces/{NS}/widgets").status_code == 404


def test_table_output_uses_printer_columns(
    kube_server: KubeServer, custom: client.CustomObjectsApi, make_adapter: Factory
) -> None:
    custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, make_adapter("t1"))
    custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, NS, PLURAL, "t1", {"status": {"phase": "Ready"}}
    )
    table = _get(
        kube_server, f"/apis/{GROUP}/{VERSION}/namespaces/{NS}/{PLURAL}", headers={"Accept": TABLE}
    ).json()
    assert (table["kind"], table["apiVersion"]) == ("Table", "meta.k8s.io/v1")
    assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "Phase", "Model", "Age"]
    cells = table["rows"][0]["cells"]
    assert cells[:3] == ["t1", "Ready", "llama3-8b-base"]
    assert cells[3].endswith("s")
    assert table["rows"][0]["object"]["kind"] == "PartialObjectMetadata"


def test_seed_list_operation(
    kube_server: KubeServer, custom: client.CustomObjectsApi, make_adapter: Factory
) -> None:
    """The seed's listNamespacedLoRAAdapter: labelSelector, fieldSelector, limit, continue,
    401 and 403."""
    for name in ("s1", "s2", "s3"):
        body = make_adapter(name)
        body["metadata"]["labels"] = {"app": "x"}
        custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, body)
    path = f"/apis/{GROUP}/{VERSION}/namespaces/{NS}/{PLURAL}"
    page = _get(
        kube_server,
        path,
        params={"labelSelector": "app=x", "limit": "2", "fieldSelector": "metadata.namespace=default"},
    ).json()
    assert page["kind"] == "LoRAAdapterList"
    assert [i["metadata"]["name"] for i in page["items"]] == ["s1", "s2"]
    rest = _get(
        kube_server,
        path,
        params={"labelSelector": "app=x", "limit": "2", "continue": page["metadata"]["continue"]},
    ).json()
    assert [i["metadata"]["name"] for i in rest["items"]] == ["s3"]
    assert httpx.get(kube_server.url + path).status_code == 401
    other = kube_server.issue_token("system:serviceaccount:other:nobody")
    forbidden = httpx.get(kube_server.url + path, headers={"Authorization": f"Bearer {other}"})
    assert forbidden.status_code == 403


def test_counters_and_fault_injection(
    kube_server: KubeServer, custom: client.CustomObjectsApi, make_adapter: Factory
) -> None:
    kube_server.reset_counters()
    custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, make_adapter("f1"))
    custom.list_namespaced_custom_object(GROUP, VERSION, NS, PLURAL)
    assert kube_server.request_count == 2
    assert kube_server.requests[("create", PLURAL)] == 1
    assert kube_server.requests[("list", PLURAL)] == 1
    kube_server.inject(status=500, times=1, verb="list", resource=PLURAL)
    with pytest.raises(ApiException) as caught:
        custom.list_namespaced_custom_object(GROUP, VERSION, NS, PLURAL)
    assert caught.value.status == 500
    assert custom.list_namespaced_custom_object(GROUP, VERSION, NS, PLURAL)["items"]
    kube_server.inject(status=409, times=2, verb="patch", resource=f"{PLURAL}/status")
    for _ in range(2):
        with pytest.raises(ApiException) as caught:
            custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, NS, PLURAL, "f1", {"status": {"phase": "Ready"}}
            )
        assert caught.value.status == 409
    assert custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, NS, PLURAL, "f1", {"status": {"phase": "Ready"}}
    )["status"]
    kube_server.inject(delay_s=0.3, times=None, verb="get")
    started = time.monotonic()
    custom.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "f1")
    assert time.monotonic() - started >= 0.3
    kube_server.clear_faults()
    assert len(kube_server.faults) == 0
    assert kube_server.requests[("patch", f"{PLURAL}/status")] == 3


def test_malformed_requests_are_400(kube_server: KubeServer) -> None:
    path = f"/apis/{GROUP}/{VERSION}/namespaces/{NS}/{PLURAL}"
    assert _get(kube_server, path, params={"limit": "many"}).status_code == 400
    assert _get(kube_server, path, params={"labelSelector": "a in b"}).status_code == 400
    broken = httpx.post(
        kube_server.url + path,
        content=b"{not json",
        headers={"Authorization": f"Bearer {kube_server.admin_token}", "Content-Type": "application/json"},
    )
    assert broken.status_code == 400
    assert broken.json()["reason"] == "BadRequest"
