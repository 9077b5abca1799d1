"""`kubectl apply --dry-run=server` of knative/ and of an overlay with each optional component
(knative/components), as a user applies them: the real server admits every object (its schema,
the Knative CRDs' and ours, RBAC objects, the ConfigMap the monitoring component generates)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from devstack.eventing.triggers import read_files, render
from devstack.kubernetes import ControlPlane

Kubectl = Callable[..., subprocess.CompletedProcess[str]]
ROOT = Path(__file__).resolve().parents[2]
KNATIVE = ROOT / "knative"
PROMETHEUS_OPERATOR_CRDS = ROOT / "tests" / "manifests" / "prometheus-operator-crds"
COMPONENTS = ("webhook", "sqs", "monitoring", "filer-source")


def accepted(done: subprocess.CompletedProcess[str]) -> list[str]:
    """The objects the server admitted, from kubectl's lines `<kind>/<name> <verb> (server dry run)`."""
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    refused = [line for line in lines if not line.endswith("(server dry run)")]
    assert refused == [], refused
    return lines


def overlay(workdir: Path, component: str) -> Path:
    """A user's overlay of the core with `component` (kustomize takes relative paths only)."""
    folder = workdir / component
    folder.mkdir(parents=True)
    relative = os.path.relpath(KNATIVE, folder)
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [relative],
        "components": [f"{relative}/components/{component}"],
    }
    (folder / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return folder


@pytest.fixture(scope="module")
def core() -> list[dict[str, Any]]:
    return render()


def test_the_core_tree_is_accepted(kubectl: Kubectl, core: list[dict[str, Any]]) -> None:
    lines = accepted(kubectl("apply", "--dry-run=server", "-k", str(KNATIVE)))
    assert len(lines) == len(core)


@pytest.mark.parametrize("component", COMPONENTS)
def test_each_component_is_accepted(
    plane: ControlPlane, kubectl: Kubectl, core: list[dict[str, Any]], tmp_path: Path, component: str
) -> None:
    if component == "monitoring":
        # PodMonitor and PrometheusRule are kinds the cluster's prometheus-operator installs
        plane.install(read_files(sorted(PROMETHEUS_OPERATOR_CRDS.glob("*.yaml"))))
    lines = accepted(kubectl("apply", "--dry-run=server", "-k", str(overlay(tmp_path, component))))
    rendered = render(components=(component,))
    assert len(lines) == len(rendered)
    added = {(d["kind"], d["metadata"]["name"]) for d in rendered} - {
        (d["kind"], d["metadata"]["name"]) for d in core
    }
    admitted = {
        (line.split()[0].split("/")[0].split(".")[0], line.split()[0].split("/")[1]) for line in lines
    }
    assert {(kind.lower(), name) for kind, name in added} <= admitted
