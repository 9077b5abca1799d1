"""The knative/ tree as kubectl renders it, and the CRD schemas its objects validate against:
what tests/manifests' tree, components and monitoring tests share."""

from __future__ import annotations

import os
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from tests.support.schemas import to_json_schema

ROOT = Path(__file__).resolve().parents[2]
KNATIVE = ROOT / "knative"
MANIFEST_TESTS = ROOT / "tests" / "manifests"
# Vendored CRDs: Knative's, and the prometheus-operator's (the monitoring component).
VENDORED_CRDS = (
    ROOT / "devstack" / "kubernetes" / "knative-crds",
    MANIFEST_TESTS / "prometheus-operator-crds",
)
K8S_VERSION = "1.32"
ROOT_FIELDS = {"apiVersion": "string", "kind": "string", "metadata": "object"}

Obj = dict[str, Any]


def kubectl() -> str:
    found = shutil.which("kubectl")
    assert found, "kubectl is not installed (`make venv` installs it when the machine has none)"
    return found


def render(components: tuple[str, ...], workdir: Path) -> tuple[Obj, ...]:
    """`kubectl kustomize` of an overlay of the core with `components`, as a user writes it in
    `workdir` (kustomize refuses absolute paths: the overlay names them relative to itself)."""
    overlay = workdir / ("+".join(components) or "core")
    overlay.mkdir(parents=True, exist_ok=True)
    relative = os.path.relpath(KNATIVE, overlay)
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [relative],
                "components": [f"{relative}/components/{c}" for c in components],
            }
        )
    )
    done = subprocess.run(
        [kubectl(), "kustomize", str(overlay)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return tuple(d for d in yaml.safe_load_all(done.stdout) if d)


@cache
def crd_schemas() -> dict[tuple[str, str], Obj]:
    """(apiVersion, kind) -> openAPIV3Schema from the vendored CRDs and ours (knative/crds)."""
    found: dict[tuple[str, str], Obj] = {}
    paths = [path for directory in VENDORED_CRDS for path in directory.glob("*.yaml")]
    paths += (KNATIVE / "crds").glob("*.yaml")
    for path in paths:
        for crd in yaml.safe_load_all(path.read_text()):
            if not crd or crd.get("kind") != "CustomResourceDefinition":
                continue
            for version in crd["spec"]["versions"]:
                key = (f"{crd['spec']['group']}/{version['name']}", crd["spec"]["names"]["kind"])
                found[key] = version["schema"]["openAPIV3Schema"]
    return found


def is_custom(obj: Obj) -> bool:
    return (obj["apiVersion"], obj["kind"]) in crd_schemas()


def validator_for(api_version: str, kind: str) -> jsonschema.Draft7Validator:
    schema = to_json_schema(crd_schemas()[(api_version, kind)])
    # The apiserver owns apiVersion, kind and metadata; the CRDs' schemas leave them out.
    schema["properties"] |= {k: {"type": t} for k, t in ROOT_FIELDS.items()}
    return jsonschema.Draft7Validator(schema)


def filter_types(node: Any) -> set[str]:
    """Every `type` value named anywhere in a Trigger's filter expression."""
    if isinstance(node, list):
        return {t for child in node for t in filter_types(child)}
    if not isinstance(node, dict):
        return set()
    found = {node["type"]} if isinstance(node.get("type"), str) else set()
    return found | {t for child in node.values() for t in filter_types(child)}
