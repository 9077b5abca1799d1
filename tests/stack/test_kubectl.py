"""The real kubectl against the embedded stack, through the kubeconfig `make serve` writes (HTTPS,
the stand-in's own CA, a bearer token): printer columns, describe with conditions and Events,
get -w following an adapter through admission; and `loraflow status` reading the same file.

`kubectl get loraadapters` alone is ambiguous (two groups serve that plural): kubectl picks
inference.rackai.rackspace.com, as it would on a cluster. The short names are `lora` (vLLM
kind) and `sglora` (SGLang kind)."""

from __future__ import annotations

import queue
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from devstack.__main__ import write_kubeconfig
from devstack.stack import Stack
from loraflow.cli import main
from tests.support.manifests import kubectl as kubectl_binary
from tests.support.wait import eventually
from tests.support.watch import lines_of

MODEL = "no-such-model"
ADAPTER = """\
apiVersion: rackai.rackspace.com/v1alpha1
kind: LoRAAdapter
metadata:
  name: finance
  namespace: {namespace}
spec:
  model: {model}
  integrity:
    md5:
      /loraadapters/{namespace}/{model}/finance/adapter_model.safetensors: 0123456789abcdef0123456789abcdef
"""


@pytest.fixture(scope="module")
def kubeconfig(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("devstack") / "kubeconfig"
    write_kubeconfig(stack, path)  # what `make serve` writes to .devstack/kubeconfig
    return path


def kubectl(kubeconfig: Path, *args: str) -> str:
    done = subprocess.run(
        [kubectl_binary(), "--kubeconfig", str(kubeconfig), *args], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def namespace(stack: Stack) -> str:
    import secrets

    name = f"kubectl-{secrets.token_hex(3)}"
    stack.core.create_namespace({"metadata": {"name": name}})
    return name


@pytest.fixture
def watch(kubeconfig: Path, namespace: str) -> Iterator[queue.Queue[str]]:
    """`kubectl get lora -n NS -w`: its lines as they come."""
    with lines_of(
        [kubectl_binary(), "--kubeconfig", str(kubeconfig), "get", "lora", "-n", namespace, "-w"]
    ) as lines:
        yield lines


def rows(table: str) -> list[dict[str, str]]:
    """A kubectl table as dicts (columns are separated by 3+ spaces or aligned; split on 2+)."""
    import re

    header, *body = [line for line in table.splitlines() if line.strip()]
    starts = [m.start() for m in re.finditer(r"\S+", header)]
    names = header.split()
    found = []
    for line in body:
        cells = [line[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
        found.append(dict(zip(names, cells, strict=True)))
    return found


def test_kubectl_get_describe_and_watch(
    stack: Stack, kubeconfig: Path, namespace: str, watch: queue.Queue[str], tmp_path: Path
) -> None:
    manifest = tmp_path / "adapter.yaml"
    manifest.write_text(ADAPTER.format(namespace=namespace, model=MODEL))
    assert "loraadapter.rackai.rackspace.com/finance created" in kubectl(
        kubeconfig, "apply", "-f", str(manifest)
    )

    # admit finds no Model: Ready False ModelNotFound, phase Failed (docs/operations.md)
    def failed() -> dict[str, str] | None:
        listed = [r for r in rows(kubectl(kubeconfig, "get", "lora", "-A")) if r["NAMESPACE"] == namespace]
        return listed[0] if listed and listed[0]["PHASE"] == "Failed" else None

    row = eventually(failed, what="the adapter Failed in kubectl get")
    assert list(row) == ["NAMESPACE", "NAME", "PHASE", "READY", "MODEL", "SIZE", "AGE"]
    assert row["NAME"] == "finance" and row["READY"] == "false" and row["MODEL"] == MODEL

    described = kubectl(kubeconfig, "describe", "lora", "finance", "-n", namespace)
    conditions, events = described.split("Events:")
    assert (
        "Reason:                ModelNotFound" in conditions and "Type:                  Ready" in conditions
    )
    (warning,) = [line.split() for line in events.splitlines() if line.split()[:1] == ["Warning"]]
    assert warning[1] == "ModelNotFound" and warning[3] == "loraflow-admit"

    as_yaml = yaml.safe_load(kubectl(kubeconfig, "get", "lora", "finance", "-n", namespace, "-o", "yaml"))
    assert as_yaml["metadata"]["finalizers"] == ["loraflow.io/unload"]

    # the watch saw it appear, then move to Failed
    seen: list[str] = []
    while not any("Failed" in line for line in seen):
        seen.append(watch.get(timeout=20))
    assert seen[0].split()[:2] == ["NAME", "PHASE"]
    assert any(line.split()[0] == "finance" for line in seen[1:])


def test_loraflow_status_reads_the_same_kubeconfig(
    stack: Stack, kubeconfig: Path, namespace: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = tmp_path / "adapter.yaml"
    manifest.write_text(ADAPTER.format(namespace=namespace, model=MODEL))
    kubectl(kubeconfig, "apply", "-f", str(manifest))
    eventually(
        lambda: "Failed" in kubectl(kubeconfig, "get", "lora", "finance", "-n", namespace),
        what="the adapter Failed",
    )
    assert main(["status", "--kubeconfig", str(kubeconfig), "-n", namespace]) == 0
    out = capsys.readouterr().out
    assert "finance" in out and "ModelNotFound" in out
