"""knative/components/filer-source: what an overlay that switches it on gets, validated as the
API server would (Knative's CRDs for the ContainerSource, Trigger and EventType; Kubernetes' own
schemas for the Lease and RBAC), and wired to the code it runs."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from events.external import PING
from functions.settings import ENV_PREFIX, Settings
from tests.support.schemas import to_json_schema

ROOT = Path(__file__).resolve().parents[2]
KNATIVE = ROOT / "knative"
COMPONENT = KNATIVE / "components" / "filer-source"
KNATIVE_CRDS = Path(__file__).resolve().parents[2] / "devstack" / "kubernetes" / "knative-crds"
Obj = dict[str, Any]


@cache
def overlay() -> tuple[Obj, ...]:
    """`kubectl kustomize` of an overlay of the core with this component (as a user's would be)."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed")
    with tempfile.TemporaryDirectory(prefix="loraflow-overlay-") as tmp:
        work = Path(tmp)
        (work / "kustomization.yaml").write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kustomize.config.k8s.io/v1beta1",
                    "kind": "Kustomization",
                    "resources": [os.path.relpath(KNATIVE, work)],
                    "components": [os.path.relpath(COMPONENT, work)],
                }
            )
        )
        out = subprocess.run([kubectl, "kustomize", str(work)], check=True, capture_output=True, text=True)
    return tuple(doc for doc in yaml.safe_load_all(out.stdout) if doc)


def component_objects() -> list[Obj]:
    return [
        o
        for o in overlay()
        if (o["metadata"].get("labels") or {}).get("app.kubernetes.io/component") in ("filer-source",)
        or o["metadata"]["name"] == "loraflow-resync-filer-source"
    ]


def one(kind: str, name: str) -> Obj:
    (found,) = [o for o in overlay() if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def test_the_default_apply_does_not_install_it() -> None:
    core = subprocess.run(
        ["kubectl", "kustomize", str(KNATIVE)], check=True, capture_output=True, text=True
    ).stdout
    assert "loraflow-filer-source" not in core


@cache
def schemas() -> dict[tuple[str, str], Obj]:
    found: dict[tuple[str, str], Obj] = {}
    for path in KNATIVE_CRDS.glob("*.yaml"):
        for crd in yaml.safe_load_all(path.read_text()):
            if crd and crd.get("kind") == "CustomResourceDefinition":
                for version in crd["spec"]["versions"]:
                    key = (f"{crd['spec']['group']}/{version['name']}", crd["spec"]["names"]["kind"])
                    found[key] = version["schema"]["openAPIV3Schema"]
    return found


@pytest.mark.parametrize("obj", component_objects(), ids=lambda o: f"{o['kind']}/{o['metadata']['name']}")
def test_each_object_validates(obj: Obj) -> None:
    key = (obj["apiVersion"], obj["kind"])
    if key in schemas():
        schema = to_json_schema(schemas()[key])
        schema["properties"] |= {
            k: {"type": t}
            for k, t in {"apiVersion": "string", "kind": "string", "metadata": "object"}.items()
        }
        errors = [
            f"{list(e.absolute_path)}: {e.message}"
            for e in jsonschema.Draft7Validator(schema).iter_errors(obj)
        ]
        assert errors == []
    else:
        kubernetes_validate.validate(obj, "1.32", strict=True)


def test_the_container_runs_the_source_with_the_functions_configuration() -> None:
    source = one("ContainerSource", "loraflow-filer-source")
    spec = source["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert container["command"] == ["python", "-m", "functions.filer_source"]
    assert (
        container["image"]
        == one("Service", "loraflow-stat")["spec"]["template"]["spec"]["containers"][0]["image"]
    )
    assert container["envFrom"] == [{"configMapRef": {"name": "loraflow-config"}}]
    env = {e["name"]: e.get("value") for e in container.get("env") or []}
    fields = {ENV_PREFIX + name.upper() for name in Settings.model_fields}
    assert set(env) <= fields, "every variable it sets is a setting"
    lease = one("Lease", "loraflow-filer-source")
    assert env["LORAFLOW_SOURCE_LEASE"] == f"{lease['metadata']['namespace']}/{lease['metadata']['name']}"
    assert Settings.from_env(env).source_lease == env["LORAFLOW_SOURCE_LEASE"]
    # K_SINK: a ContainerSource injects its sink's URL, the Broker
    assert source["spec"]["sink"]["ref"] == {
        "apiVersion": "eventing.knative.dev/v1",
        "kind": "Broker",
        "name": "loraflow",
    }
    assert spec["serviceAccountName"] == "loraflow-filer-source"


def test_its_role_touches_only_its_lease() -> None:
    role = one("Role", "loraflow-filer-source")
    lease = one("Lease", "loraflow-filer-source")
    assert role["metadata"]["namespace"] == lease["metadata"]["namespace"]
    assert role["rules"] == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [lease["metadata"]["name"]],
            "verbs": ["get", "patch"],
        }
    ]
    binding = one("RoleBinding", "loraflow-filer-source")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "loraflow-filer-source", "namespace": "loraflow"}
    ]


def test_its_resync_tick_reaches_resync_and_the_pingsources_trigger_does_not_take_it() -> None:
    trigger = one("Trigger", "loraflow-resync-filer-source")
    assert trigger["spec"]["filters"] == [
        {"exact": {"type": PING}},
        {"exact": {"source": "/loraflow/filer-source"}},
    ]
    assert trigger["spec"]["subscriber"]["ref"]["name"] == "loraflow-resync"
    tick = one("Trigger", "loraflow-resync-tick")
    prefixes = [f["prefix"]["source"] for f in tick["spec"]["filters"] if "prefix" in f]
    assert prefixes and not any("/loraflow/filer-source".startswith(p) for p in prefixes)
