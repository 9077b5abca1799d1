"""The real kubectl (/usr/bin/kubectl) against the stand-in, via a kubeconfig it writes."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from devstack.standins.kube import KubeServer

KUBECTL = shutil.which("kubectl")
MANIFEST = """\
apiVersion: rackai.rackspace.com/v1alpha1
kind: LoRAAdapter
metadata:
  name: demo
  labels:
    team: a
spec:
  model: llama3-8b-base
  integrity:
    md5:
      /loraadapters/default/llama3-8b-base/demo/adapter.safetensors: 0123456789abcdef0123456789abcdef
"""
Kubectl = Callable[..., subprocess.CompletedProcess[str]]

pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl not installed")


@pytest.fixture
def tls_server(fixture_dirs: tuple[Path, Path]) -> Iterator[KubeServer]:
    """kubectl sends bearer tokens only over TLS, so this server serves HTTPS."""
    crd_dir = Path(__file__).resolve().parents[2] / "knative" / "crds"
    if not any(crd_dir.glob("*.yaml")):
        crd_dir = fixture_dirs[0]
    server = KubeServer(crd_dir=crd_dir, tls=True).start()
    yield server
    server.stop()


@pytest.fixture
def kubectl(tls_server: KubeServer, tmp_path: Path) -> Kubectl:
    config = tls_server.write_kubeconfig(tmp_path / "kubeconfig")

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        assert KUBECTL is not None
        result = subprocess.run(
            [KUBECTL, "--kubeconfig", str(config), *args], capture_output=True, text=True, timeout=30
        )
        if check:
            assert result.returncode == 0, result.stderr
        return result

    return run


def test_kubectl_apply_get_describe_patch_delete(kubectl: Kubectl, tmp_path: Path) -> None:
    manifest = tmp_path / "adapter.yaml"
    manifest.write_text(MANIFEST)
    assert "loraadapter.rackai.rackspace.com/demo created" in kubectl("apply", "-f", str(manifest)).stdout
    assert "unchanged" in kubectl("apply", "-f", str(manifest)).stdout
    table = kubectl("get", "loraadapters.rackai.rackspace.com").stdout.splitlines()
    header = table[0].split()
    assert header[:2] == ["NAME", "PHASE"]
    assert "AGE" in header
    assert table[1].split()[0] == "demo"
    as_yaml = yaml.safe_load(kubectl("get", "loraadapters.rackai.rackspace.com", "demo", "-o", "yaml").stdout)
    assert as_yaml["spec"]["model"] == "llama3-8b-base"
    assert as_yaml["metadata"]["generation"] == 1
    described = kubectl("describe", "loraadapters.rackai.rackspace.com", "demo").stdout
    assert "Name:         demo" in described
    assert "llama3-8b-base" in described
    patched = kubectl(
        "patch",
        "loraadapters.rackai.rackspace.com",
        "demo",
        "--subresource=status",
        "--type=merge",
        "-p",
        '{"status":{"phase":"Ready"}}',
    )
    assert "patched" in patched.stdout
    row = kubectl("get", "loraadapters.rackai.rackspace.com", "demo").stdout.splitlines()[1]
    assert "Ready" in row.split()
    bad = kubectl(
        "patch",
        "loraadapters.rackai.rackspace.com",
        "demo",
        "--type=merge",
        "-p",
        '{"spec":{"integrity":{"md5":{"relative":"x"}}}}',
        check=False,
    )
    assert bad.returncode != 0
    assert "absolute storage paths" in bad.stderr
    assert "deleted" in kubectl("delete", "loraadapters.rackai.rackspace.com", "demo").stdout
    gone = kubectl("get", "loraadapters.rackai.rackspace.com", "demo", check=False)
    assert gone.returncode != 0
    assert "NotFound" in gone.stderr or "not found" in gone.stderr


def test_kubectl_get_watch(kubectl: Kubectl, tls_server: KubeServer, tmp_path: Path) -> None:
    manifest = tmp_path / "adapter.yaml"
    manifest.write_text(MANIFEST)
    kubectl("apply", "-f", str(manifest))
    config = tmp_path / "kubeconfig"
    assert KUBECTL is not None
    process = subprocess.Popen(
        [
            KUBECTL,
            "--kubeconfig",
            str(config),
            "get",
            "loraadapters.rackai.rackspace.com",
            "--watch",
            "--request-timeout=20s",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        header = process.stdout.readline()
        first = process.stdout.readline()
        assert "NAME" in header
        assert first.split()[0] == "demo"
        time.sleep(0.3)
        kubectl(
            "patch",
            "loraadapters.rackai.rackspace.com",
            "demo",
            "--subresource=status",
            "--type=merge",
            "-p",
            '{"status":{"phase":"Processing"}}',
        )
        deadline = time.monotonic() + 10
        update = ""
        while time.monotonic() < deadline and "Processing" not in update:
            update = process.stdout.readline()
        assert "Processing" in update
    finally:
        process.kill()
        process.wait(timeout=5)


def test_kubectl_pods_and_namespaces(kubectl: Kubectl, tmp_path: Path) -> None:
    pod = tmp_path / "pod.yaml"
    pod.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "engine-0", "labels": {"loraflow.io/serving": "true"}},
                "spec": {
                    "containers": [
                        {
                            "name": "engine",
                            "image": "vllm",
                            "ports": [{"name": "http", "containerPort": 8000}],
                        }
                    ]
                },
            }
        )
    )
    kubectl("apply", "-f", str(pod))
    kubectl("apply", "-f", str(pod))
    header = kubectl("get", "pods").stdout.splitlines()[0].split()
    assert header == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert "default" in kubectl("get", "namespaces").stdout
    assert "engine-0" in kubectl("get", "pods", "-l", "loraflow.io/serving=true").stdout
    kubectl("delete", "pod", "engine-0")
