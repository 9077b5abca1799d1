"""Shared fixtures for the stand-in tests: a started Kubernetes API stand-in and its clients."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from devstack.standins.kube import KubeServer

REPO = Path(__file__).resolve().parents[2]
# The vendored copy (tests/manifests/test_vendored_copies.py keeps it equal to ../shared/seeds).
SEED = REPO / "tests" / "manifests" / "seeds" / "rackai-loraadapter-openapi.json"
REAL_CRDS = REPO / "knative" / "crds"
REAL_RBAC = REPO / "knative" / "rbac"
FUNCTIONS_SA = "system:serviceaccount:loraflow:loraflow-functions"
GROUP, VERSION, PLURAL = "rackai.rackspace.com", "v1alpha1", "loraadapters"


def _strip(schema: Any) -> Any:
    """The seed's component schema as a structural CRD schema (no example/readOnly)."""
    if isinstance(schema, dict):
        return {k: _strip(v) for k, v in schema.items() if k not in ("example", "readOnly")}
    if isinstance(schema, list):
        return [_strip(v) for v in schema]
    return schema


def seed_crd() -> dict[str, Any]:
    """A LoRAAdapter CRD built from the seed's schema (tests' own fixture)."""
    schema = _strip(json.loads(SEED.read_text())["components"]["schemas"]["LoRAAdapter"])
    columns = [
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        {"name": "Model", "type": "string", "jsonPath": ".spec.model"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": "LoRAAdapter",
                "plural": PLURAL,
                "singular": "loraadapter",
                "listKind": "LoRAAdapterList",
                "shortNames": ["lora"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }


def gadget_crd() -> dict[str, Any]:
    """A small CRD exercising defaults, enum, int-or-string, sets and preserved fields."""
    spec_schema = {
        "type": "object",
        "required": ["size"],
        "properties": {
            "size": {
                "x-kubernetes-int-or-string": True,
                "anyOf": [{"type": "integer"}, {"type": "string"}],
                "pattern": "^[0-9]+(Mi|Gi)$",
            },
            "color": {"type": "string", "enum": ["red", "blue"], "default": "red"},
            "replicas": {"type": "integer", "minimum": 0, "maximum": 5, "default": 1},
            "tags": {"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "set"},
            "labels": {"type": "object", "additionalProperties": {"type": "string", "maxLength": 3}},
            "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            "note": {"type": "string", "nullable": True},
            "at": {"type": "string", "format": "date-time"},
            "serial": {
                "type": "string",
                "x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "serial is immutable"}],
            },
            "even": {
                "type": "integer",
                "x-kubernetes-validations": [
                    {"rule": "self % 2 == 0", "messageExpression": "'odd: ' + string(self)"}
                ],
            },
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "gadgets.test.loraflow.io"},
        "spec": {
            "group": "test.loraflow.io",
            "scope": "Namespaced",
            "names": {"kind": "Gadget", "plural": "gadgets", "singular": "gadget"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": spec_schema,
                                "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                            },
                        }
                    },
                }
            ],
        },
    }


FIXTURE_ROLES = [
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "reader"},
        "rules": [
            {"apiGroups": [GROUP], "resources": [PLURAL], "verbs": ["get", "list", "watch"]},
            {"apiGroups": [GROUP], "resources": [f"{PLURAL}/status"], "verbs": ["patch"]},
        ],
    },
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "loraflow-functions", "namespace": "loraflow"}],
    },
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "pod-writer", "namespace": "default"},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create"], "resourceNames": []}],
    },
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "pod-writer", "namespace": "default"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-writer"},
        "subjects": [{"kind": "ServiceAccount", "name": "loraflow-functions", "namespace": "loraflow"}],
    },
]


@pytest.fixture
def fixture_dirs(tmp_path: Path) -> tuple[Path, Path]:
    crd_dir, rbac_dir = tmp_path / "crds", tmp_path / "rbac"
    crd_dir.mkdir()
    rbac_dir.mkdir()
    (crd_dir / "loraadapters.yaml").write_text(yaml.safe_dump(seed_crd()))
    (crd_dir / "gadgets.yaml").write_text(yaml.safe_dump(gadget_crd()))
    (crd_dir / "kustomization.yaml").write_text("resources: [loraadapters.yaml]\n")
    (rbac_dir / "roles.yaml").write_text(yaml.safe_dump_all(FIXTURE_ROLES))
    return crd_dir, rbac_dir


@pytest.fixture
def kube_server(fixture_dirs: tuple[Path, Path]) -> Iterator[KubeServer]:
    """A started stand-in with the tests' own fixture CRDs and roles."""
    server = KubeServer(crd_dir=fixture_dirs[0], rbac_dir=fixture_dirs[1])
    server.start()
    yield server
    server.stop()


@pytest.fixture
def real_kube_server() -> Iterator[KubeServer]:
    """A started stand-in loaded with the project's CRDs and RBAC from knative/."""
    assert any(REAL_CRDS.glob("*.yaml")), "knative/crds holds no CRD"
    server = KubeServer(crd_dir=REAL_CRDS, rbac_dir=REAL_RBAC)
    server.start()
    yield server
    server.stop()


def api_client(server: KubeServer, token: str | None = None) -> client.ApiClient:
    """A kubernetes.client.ApiClient for the stand-in (bearer token auth)."""
    return client.ApiClient(server.client_configuration(token))


@pytest.fixture
def make_client() -> Callable[[KubeServer, str | None], client.ApiClient]:
    """Factory: make_client(server, token) -> kubernetes ApiClient."""
    return api_client


@pytest.fixture
def custom(kube_server: KubeServer) -> Iterator[client.CustomObjectsApi]:
    with api_client(kube_server) as api:
        yield client.CustomObjectsApi(api)


@pytest.fixture
def core(kube_server: KubeServer) -> Iterator[client.CoreV1Api]:
    with api_client(kube_server) as api:
        yield client.CoreV1Api(api)


@pytest.fixture
def make_adapter() -> Callable[..., dict[str, Any]]:
    """Factory: make_adapter(name, model=..., **spec) -> a LoRAAdapter manifest (the vllm kind)."""
    return adapter


def adapter(name: str, model: str = "llama3-8b-base", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "LoRAAdapter",
        "metadata": {"name": name},
        "spec": {"model": model, **spec},
    }
