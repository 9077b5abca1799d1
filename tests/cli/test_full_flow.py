"""The CLI against the whole embedded stack (devstack.stack.Stack): upload -> Ready -> Loaded,
through the filer notifications, the broker, the Triggers and every function."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devstack.seaweedfs import shared
from devstack.stack import Stack
from functions.resources.kinds import MODEL, MODEL_DEPLOYMENT, VLLM_ADAPTER, Kind
from loraflow.cli import main
from tests.support.wait import eventually

MODEL_NAME = "llama3-8b"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, Path]]:
    base = tmp_path_factory.mktemp("fullstack")
    with Stack(base / "stack", ping_period=None, seaweed=shared()) as running:
        endpoints = base / "endpoints.json"
        endpoints.write_text(json.dumps(running.endpoints()))
        yield running, endpoints


def create(stack: Stack, kind: Kind, namespace: str, name: str, spec: dict[str, Any]) -> None:
    body = {"apiVersion": kind.api_version, "kind": kind.kind, "metadata": {"name": name}, "spec": spec}
    stack.custom.create_namespaced_custom_object(kind.group, kind.version, namespace, kind.plural, body)


def adapter_status(stack: Stack, namespace: str, name: str) -> dict[str, Any]:
    found = stack.custom.get_namespaced_custom_object(
        VLLM_ADAPTER.group, VLLM_ADAPTER.version, namespace, VLLM_ADAPTER.plural, name
    )
    status: dict[str, Any] = found.get("status") or {}
    return status


def test_upload_makes_the_adapter_ready_and_loaded(
    stack: tuple[Stack, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    running, endpoints = stack
    namespace = "cli-e2e"
    running.core.create_namespace({"metadata": {"name": namespace}})
    create(running, MODEL, namespace, MODEL_NAME, {})
    spec = {"model": MODEL_NAME, "replicas": 2, "loraAdapters": ["finance"]}
    create(running, MODEL_DEPLOYMENT, namespace, "llama", spec)
    (tmp_path / "adapter_config.json").write_text(
        '{"peft_type": "LORA", "r": 8, "target_modules": ["q_proj"]}'
    )
    (tmp_path / "adapter_model.safetensors").write_bytes(b"\x00" * 4096)
    argv = ["upload", str(tmp_path), "--model", MODEL_NAME, "--name", "finance", "-n", namespace]

    assert main([*argv, "--endpoints", str(endpoints)]) == 0

    eventually(lambda: adapter_status(running, namespace, "finance").get("ready") is True, 30, what="Ready")
    eventually(
        lambda: adapter_status(running, namespace, "finance").get("usedBy") == ["llama"], 30, what="used"
    )
    running.settle()
    capsys.readouterr()

    assert main(["status", "-n", namespace, "--endpoints", str(endpoints)]) == 0
    out = capsys.readouterr().out
    (row,) = [line for line in out.splitlines() if line.startswith("finance ") and "Ready" in line.split()]
    assert {"true", MODEL_NAME, "llama", "2/2"} <= set(row.split())
    pods = [line for line in out.splitlines() if line.split()[-1:] == ["loaded"]]
    assert len(pods) == 2

    assert main(["events", "--endpoints", str(endpoints)]) == 0
    out = capsys.readouterr().out
    for type_ in ("adapter.admitted.v1", "file.changed.v1", "adapter.ready.v1", "adapter.loaded.v2"):
        assert f"io.loraflow.{type_}" in out, type_
