"""Bearer-token authentication and RBAC enforcement for ServiceAccount users."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from devstack.standins.kube import KubeServer
from devstack.standins.kube.rbac import AuthorizedRequest

GROUP, VERSION, PLURAL, NS = "rackai.rackspace.com", "v1alpha1", "loraadapters", "default"
SA = "system:serviceaccount:loraflow:loraflow-functions"
Factory = Callable[..., dict[str, Any]]


def test_missing_or_unknown_token_is_401(kube_server: KubeServer) -> None:
    url = f"{kube_server.url}/apis/{GROUP}/{VERSION}/namespaces/{NS}/{PLURAL}"
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic eDp5"}):
        response = httpx.get(url, headers=headers)
        assert response.status_code == 401
        assert response.json() == {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": "Unauthorized",
            "reason": "Unauthorized",
            "code": 401,
        }
    assert httpx.get(f"{kube_server.url}/version").status_code == 401
    with (
        client.ApiClient(kube_server.client_configuration("wrong")) as api,
        pytest.raises(ApiException) as caught,
    ):
        client.CustomObjectsApi(api).list_namespaced_custom_object(GROUP, VERSION, NS, PLURAL)
    assert caught.value.status == 401


def test_rbac_allows_granted_verbs_and_forbids_others(
    kube_server: KubeServer, custom: client.CustomObjectsApi, make_adapter: Factory
) -> None:
    custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, make_adapter("r1"))
    token = kube_server.issue_token(SA)
    with client.ApiClient(kube_server.client_configuration(token)) as api:
        sa = client.CustomObjectsApi(api)
        assert len(sa.list_namespaced_custom_object(GROUP, VERSION, NS, PLURAL)["items"]) == 1
        assert sa.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "r1")
        patched = sa.patch_namespaced_custom_object_status(
            GROUP, VERSION, NS, PLURAL, "r1", {"status": {"phase": "Ready"}}
        )
        assert patched["status"]["phase"] == "Ready"
        with pytest.raises(ApiException) as caught:
            sa.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "r1")
        assert caught.value.status == 403
        body = json.loads(caught.value.body)
        assert body["message"] == (
            'loraadapters.rackai.rackspace.com "r1" is forbidden: User "system:serviceaccount:'
            'loraflow:loraflow-functions" cannot delete resource "loraadapters" in API group '
            '"rackai.rackspace.com" in the namespace "default"'
        )
        assert (body["reason"], body["details"]) == (
            "Forbidden",
            {"name": "r1", "group": GROUP, "kind": PLURAL},
        )
        with pytest.raises(ApiException) as caught:
            sa.patch_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "r1", {"spec": {}})
        assert caught.value.status == 403
        core = client.CoreV1Api(api)
        with pytest.raises(ApiException) as caught:
            core.list_namespaced_pod("kube-system")
        assert caught.value.status == 403
        assert json.loads(caught.value.body)["message"] == (
            f'pods is forbidden: User "{SA}" cannot list resource "pods" in API group "" in the '
            'namespace "kube-system"'
        )
        pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
        assert core.create_namespaced_pod(NS, pod).metadata.name == "p"  # RoleBinding in default
        with pytest.raises(ApiException) as caught:
            core.create_namespaced_pod("kube-system", pod)
        assert caught.value.status == 403
    assert kube_server.authorized_requests == {
        AuthorizedRequest(SA, "list", GROUP, PLURAL, ""),
        AuthorizedRequest(SA, "get", GROUP, PLURAL, ""),
        AuthorizedRequest(SA, "patch", GROUP, PLURAL, "status"),
        AuthorizedRequest(SA, "create", "", "pods", ""),
    }


def test_project_rbac_roles(real_kube_server: KubeServer) -> None:
    """knative/rbac as loaded: resync's account lists everything it reconciles, nothing more."""
    token = real_kube_server.issue_token("system:serviceaccount:loraflow:loraflow-resync")
    with client.ApiClient(real_kube_server.client_configuration(token)) as api:
        sa = client.CustomObjectsApi(api)
        for group, plural in (
            (GROUP, PLURAL),
            (GROUP, "modeldeployments"),
            ("inference.rackai.rackspace.com", PLURAL),
            ("inference.rackai.rackspace.com", "inferenceservices"),
        ):
            assert sa.list_cluster_custom_object(group, VERSION, plural)["items"] == []
        assert client.CoreV1Api(api).list_pod_for_all_namespaces().items == []
        with pytest.raises(ApiException) as caught:
            sa.delete_collection_namespaced_custom_object(GROUP, VERSION, NS, PLURAL)
        assert caught.value.status == 403
        with pytest.raises(ApiException) as caught:  # Models are only ever read by name
            sa.list_cluster_custom_object(GROUP, VERSION, "models")
        assert caught.value.status == 403
    granted = {(r.verb, r.group, r.resource) for r in real_kube_server.authorized_requests}
    assert ("list", "", "pods") in granted
