"""What the real kubectl shows of our CRDs on the real server: the printer columns of both
LoRAAdapter kinds (Phase, Ready, Model, Size, Age / Available, Loaded, Age), the short names,
`explain` from the published schema, `describe`, `get -w` following a status change, and the
seed's CEL rule refusing an edit."""

from __future__ import annotations

import json
import queue
import re
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devstack.kubernetes import ControlPlane
from tests.support.watch import lines_of

Kubectl = Callable[..., subprocess.CompletedProcess[str]]

STAMP = "2026-01-01T00:00:00Z"
MD5 = "0123456789abcdef" * 2
"""Letters in it: YAML reads 32 zeros as an integer, which the schema refuses for a string."""
READY = {
    "type": "Ready",
    "status": "True",
    "reason": "IntegrityVerified",
    "message": "ok",
    "lastTransitionTime": STAMP,
}
VLLM = """\
apiVersion: rackai.rackspace.com/v1alpha1
kind: LoRAAdapter
metadata:
  name: finance
  namespace: {namespace}
spec:
  model: llama3-8b-base
  integrity:
    md5:
      /loraadapters/{namespace}/llama3-8b-base/finance/adapter_model.safetensors: {md5}
"""
SGLANG = """\
apiVersion: inference.rackai.rackspace.com/v1alpha1
kind: LoRAAdapter
metadata:
  name: support
  namespace: {namespace}
spec:
  inferenceServiceRef:
    name: sglang-svc
  name: support-v1
  path: /models/adapters/support
"""


def rows(table: str) -> list[dict[str, str]]:
    """A kubectl table as dicts, each cell cut at its header's column."""
    header, *body = [line for line in table.splitlines() if line.strip()]
    starts = [m.start() for m in re.finditer(r"\S+", header)]
    names = header.split()
    return [
        dict(
            zip(
                names,
                (line[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)),
                strict=True,
            )
        )
        for line in body
    ]


def status(kubectl: Kubectl, resource: str, name: str, namespace: str, **fields: Any) -> None:
    patch = json.dumps({"status": fields})
    kubectl("patch", resource, name, "-n", namespace, "--subresource=status", "--type=merge", "-p", patch)


def test_printer_columns_of_both_kinds(kubectl: Kubectl, namespace: str) -> None:
    kubectl(
        "apply",
        "-f",
        "-",
        stdin=VLLM.format(namespace=namespace, md5=MD5) + "---\n" + SGLANG.format(namespace=namespace),
    )
    (fresh,) = rows(kubectl("get", "lora", "-n", namespace).stdout)
    assert fresh == {
        "NAME": "finance",
        "PHASE": "",
        "READY": "",
        "MODEL": "llama3-8b-base",
        "SIZE": "",
        "AGE": fresh["AGE"],
    }
    status(kubectl, "lora", "finance", namespace, phase="Ready", ready=True, size="12Mi", conditions=[READY])
    (ready,) = rows(kubectl("get", "loraadapters.rackai.rackspace.com", "-n", namespace).stdout)
    assert list(ready) == ["NAME", "PHASE", "READY", "MODEL", "SIZE", "AGE"]
    assert (ready["PHASE"], ready["READY"], ready["SIZE"]) == ("Ready", "true", "12Mi")
    available = {**READY, "type": "Available", "reason": "InferenceServiceFound"}
    loaded = {**READY, "type": "Loaded", "status": "False", "reason": "NoReadyPods"}
    status(kubectl, "sglora", "support", namespace, conditions=[available, loaded])
    (sglang,) = rows(kubectl("get", "sglora", "-n", namespace).stdout)
    assert {k: v for k, v in sglang.items() if k != "AGE"} == {
        "NAME": "support",
        "AVAILABLE": "True",
        "LOADED": "False",
    }
    # the priority-1 columns show with -o wide only; the bare plural names the SGLang kind, as on a cluster
    (wide,) = rows(kubectl("get", "loraadapters", "-n", namespace, "-o", "wide").stdout)
    assert list(wide) == ["NAME", "ADAPTER", "SERVICE", "AVAILABLE", "LOADED", "AGE"]
    assert (wide["ADAPTER"], wide["SERVICE"]) == ("support-v1", "sglang-svc")
    both = kubectl("get", "loraflow", "-n", namespace, "-o", "name").stdout.split()
    assert sorted(both) == [
        "loraadapter.inference.rackai.rackspace.com/support",
        "loraadapter.rackai.rackspace.com/finance",
    ]


def test_explain_reads_the_published_schema(kubectl: Kubectl) -> None:
    integrity = kubectl("explain", "lora.spec.integrity").stdout
    assert "KIND:       LoRAAdapter" in integrity and "GROUP:      rackai.rackspace.com" in integrity
    assert "md5\t<map[string]string>" in integrity
    phase = kubectl("explain", "lora.status.phase").stdout
    assert [line.strip() for line in phase.split("ENUM:")[1].split("DESCRIPTION:")[0].split()] == [
        "Pending",
        "Processing",
        "Ready",
        "Failed",
    ]
    spec = kubectl("explain", "sglora.spec", "--recursive").stdout
    for field in (
        "inferenceServiceRef\t<Object> -required-",
        "name\t<string> -required-",
        "path\t<string> -required-",
    ):
        assert field in spec


def test_apply_describe_patch_and_delete(kubectl: Kubectl, namespace: str) -> None:
    manifest = VLLM.format(namespace=namespace, md5=MD5)
    assert (
        kubectl("apply", "-f", "-", stdin=manifest).stdout.strip()
        == "loraadapter.rackai.rackspace.com/finance created"
    )
    assert (
        kubectl("apply", "-f", "-", stdin=manifest).stdout.strip()
        == "loraadapter.rackai.rackspace.com/finance unchanged"
    )
    status(kubectl, "lora", "finance", namespace, phase="Ready", conditions=[READY])
    described = kubectl("describe", "lora", "finance", "-n", namespace).stdout
    assert "Name:         finance" in described and "Model:" in described and "llama3-8b-base" in described
    assert (
        "Reason:                IntegrityVerified" in described
        and "Phase:                   Ready" in described
    )
    stored = yaml.safe_load(kubectl("get", "lora", "finance", "-n", namespace, "-o", "yaml").stdout)
    assert stored["metadata"]["generation"] == 1  # the status write left it
    relative = json.dumps({"spec": {"integrity": {"md5": {"relative": "x"}}}})
    refused = kubectl(
        "patch", "lora", "finance", "-n", namespace, "--type=merge", "-p", relative, check=False
    )
    assert refused.returncode != 0
    assert refused.stderr.strip() == (
        'The LoRAAdapter "finance" is invalid: spec.integrity: Invalid value: '
        "Spec.Integrity.MD5 keys must be absolute storage paths starting with '/'"
    )
    assert "deleted" in kubectl("delete", "lora", "finance", "-n", namespace).stdout
    gone = kubectl("get", "lora", "finance", "-n", namespace, check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr


@pytest.fixture
def watch(plane: ControlPlane, namespace: str, tmp_path: Path) -> Iterator[queue.Queue[str]]:
    """`kubectl get lora -n NS -w`: its lines as they come."""
    config = plane.write_kubeconfig(tmp_path / "kubeconfig")
    with lines_of(
        [str(plane.kubectl), f"--kubeconfig={config}", "get", "lora", "-n", namespace, "-w"]
    ) as lines:
        yield lines


def test_get_watch_sees_the_phase_change(kubectl: Kubectl, namespace: str, watch: queue.Queue[str]) -> None:
    kubectl("apply", "-f", "-", stdin=VLLM.format(namespace=namespace, md5=MD5))
    seen = [watch.get(timeout=30), watch.get(timeout=30)]  # the header, then the adapter as listed
    assert seen[0].split()[:3] == ["NAME", "PHASE", "READY"]
    assert seen[1].split()[:2] == ["finance", "llama3-8b-base"]
    status(kubectl, "lora", "finance", namespace, phase="Processing")
    update = watch.get(timeout=30)
    assert update.split()[:3] == ["finance", "Processing", "llama3-8b-base"]
