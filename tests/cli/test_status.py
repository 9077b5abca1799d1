"""`loraflow status` against the stand-ins: both kinds, per-pod loading from the engines."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from functions.resources.kinds import INFERENCE_SERVICE, MODEL_DEPLOYMENT, SGLANG_ADAPTER, VLLM_ADAPTER, Kind
from loraflow.status import age, human_size, last_reason
from tests.support.cli import CliStack

MODEL = "llama3-8b"
NOW = "2026-11-30T05:00:00Z"


def create(stack: CliStack, kind: Kind, namespace: str, body: dict[str, Any]) -> None:
    body = {"apiVersion": kind.api_version, "kind": kind.kind, **body}
    body["metadata"]["namespace"] = namespace
    stack.custom.create_namespaced_custom_object(kind.group, kind.version, namespace, kind.plural, body)


def set_status(stack: CliStack, kind: Kind, namespace: str, name: str, status: dict[str, Any]) -> None:
    stack.custom.patch_namespaced_custom_object_status(
        kind.group,
        kind.version,
        namespace,
        kind.plural,
        name,
        {"status": status},
        _content_type="application/merge-patch+json",
    )


def condition(type_: str, status: str, reason: str, message: str = "", at: str = NOW) -> dict[str, str]:
    return {"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": at}


def pods(stack: CliStack, namespace: str, selector: str) -> list[str]:
    return sorted(p["metadata"]["name"] for p in stack.workload.pods(namespace, selector))


CONFIG = b'{"peft_type": "LORA", "r": 8, "target_modules": ["q_proj"]}'


def write_adapter_dir(root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / "adapter_config.json").write_bytes(CONFIG)
    (root / "adapter_model.safetensors").write_bytes(os.urandom(1024))


@pytest.fixture
def scene(stack: CliStack, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """A Ready vllm adapter on a 2-replica ModelDeployment, loaded in one pod only; an sglang
    adapter on a 1-replica SGLang InferenceService, loaded there, with an old error."""
    namespace = stack.namespace()
    source = tmp_path / "finance"
    write_adapter_dir(source)
    argv = ["upload", str(source), "--model", MODEL, "--name", "finance", "--namespace", namespace]
    assert stack.run(*argv) == 0
    create(
        stack,
        MODEL_DEPLOYMENT,
        namespace,
        {"metadata": {"name": "llama"}, "spec": {"model": MODEL, "replicas": 2, "loraAdapters": ["finance"]}},
    )
    create(
        stack,
        INFERENCE_SERVICE,
        namespace,
        {"metadata": {"name": "qwen"}, "spec": {"runtime": "sglang", "model": "qwen", "replicas": 1}},
    )
    # The SGLang pod sees this directory through its SeaweedFS mount.
    sg_storage = f"/sglang/{namespace}/support"
    stack.filer.put_file(sg_storage + "/adapter_config.json", CONFIG)
    stack.filer.put_file(sg_storage + "/adapter_model.safetensors", os.urandom(1024))
    sg_dir = stack.mount_root / sg_storage.lstrip("/")
    create(
        stack,
        SGLANG_ADAPTER,
        namespace,
        {
            "metadata": {"name": "support"},
            "spec": {"inferenceServiceRef": {"name": "qwen"}, "name": "support-v2", "path": str(sg_dir)},
        },
    )
    stack.workload.sync()
    set_status(
        stack,
        VLLM_ADAPTER,
        namespace,
        "finance",
        {
            "phase": "Ready",
            "ready": True,
            "size": 1089,
            "usedBy": ["llama"],
            "conditions": [
                condition("Ready", "True", "IntegrityVerified"),
                condition("Loaded", "False", "LoadFailed", "1 of 2 pods failed: engine timeout"),
            ],
        },
    )
    set_status(
        stack,
        SGLANG_ADAPTER,
        namespace,
        "support",
        {
            "conditions": [
                condition("Available", "True", "InferenceServiceReady"),
                condition("Loaded", "True", "Loaded"),
                condition("Error", "False", "NoError"),
            ]
        },
    )
    vllm_pods = pods(stack, namespace, "rackai.rackspace.com/model-deployment=llama")
    sglang_pods = pods(stack, namespace, "inference.rackai.rackspace.com/inference-service=qwen")
    first = stack.workload.replica(namespace, vllm_pods[0])
    lora_path = str(stack.mount_root / "loraadapters" / namespace / MODEL / "finance")
    httpx.post(first.url + "/v1/load_lora_adapter", json={"lora_name": "finance", "lora_path": lora_path})
    sglang = stack.workload.replica(namespace, sglang_pods[0])
    httpx.post(sglang.url + "/load_lora_adapter", json={"lora_name": "support-v2", "lora_path": str(sg_dir)})
    capsys.readouterr()
    return {"namespace": namespace, "vllm_pods": vllm_pods, "sglang_pods": sglang_pods}


def lines_with(out: str, *words: str) -> list[str]:
    return [line for line in out.splitlines() if all(w in line.split() for w in words)]


def test_status_shows_both_kinds_and_where_each_is_loaded(
    stack: CliStack, scene: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    assert stack.run("status", "--namespace", scene["namespace"]) == 0
    out = capsys.readouterr().out

    header = out.splitlines()[0].split()
    assert header[:5] == ["NAME", "KIND", "PHASE/AVAILABLE", "READY/LOADED", "MODEL/TARGET"]
    (finance,) = lines_with(out, "finance", "LoRAAdapter.rackai", "Ready")
    assert {"true", MODEL, "1.1KiB", "llama", "1/2", "LoadFailed:"} <= set(finance.split())
    assert "engine timeout" in finance
    (support,) = lines_with(out, "support", "LoRAAdapter.inference", "qwen", "1/1")
    assert {"True", "qwen", "1/1"} <= set(support.split())
    loaded, missing = scene["vllm_pods"]
    assert lines_with(out, "finance", "llama", loaded, "vllm", "loaded")
    assert lines_with(out, "finance", "llama", missing, "vllm", "not")
    assert lines_with(out, "support", "qwen", scene["sglang_pods"][0], "sglang", "loaded")


def test_status_name_filter_all_namespaces_and_unknown_name(
    stack: CliStack, scene: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    assert stack.run("status", "support", "-A") == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:2] == ["NAMESPACE", "NAME"]
    assert lines_with(out, scene["namespace"], "support") and not lines_with(out, "finance")

    assert stack.run("status", "nothing-here", "--namespace", scene["namespace"]) == 1
    err = capsys.readouterr().err
    assert "no LoRAAdapter named nothing-here" in err and "Traceback" not in err


def test_status_marks_an_engine_that_does_not_answer(
    stack: CliStack, scene: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    namespace, pod = scene["namespace"], scene["vllm_pods"][1]
    stack.workload.replica(namespace, pod).stop()

    assert stack.run("status", "finance", "--namespace", namespace) == 0

    assert lines_with(capsys.readouterr().out, "finance", pod, "unreachable")


def test_watch_refreshes_until_interrupted(
    stack: CliStack,
    scene: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr("loraflow.cli._pause", sleep)
    argv = ["status", "--namespace", scene["namespace"], "--watch", "--interval", "0.5"]

    assert stack.run(*argv) == 0
    assert sleeps == [0.5, 0.5]
    assert "finance" in capsys.readouterr().out


def test_empty_namespace(stack: CliStack, capsys: pytest.CaptureFixture[str]) -> None:
    assert stack.run("status", "--namespace", stack.namespace()) == 0
    assert "No LoRAAdapters found." in capsys.readouterr().out


# -- pure helpers ------------------------------------------------------------------------------
def test_age_is_kubectl_like() -> None:
    now = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
    assert age("2026-11-30T11:59:15Z", now) == "45s"
    assert age("2026-11-30T11:58:30Z", now) == "90s"
    assert age("2026-11-30T11:48:00Z", now) == "12m"
    assert age("2026-11-30T07:00:00Z", now) == "5h"
    assert age("2026-11-27T12:00:00Z", now) == "3d"
    assert age(None, now) == "-"


def test_human_size() -> None:
    assert human_size(None) == "-"
    assert human_size(512) == "512B"
    assert human_size(3 * (1 << 20)) == "3.0MiB"
    assert human_size("64Mi") == "64Mi"


def test_last_reason_is_the_latest_unhealthy_condition() -> None:
    conditions = [
        condition("Ready", "False", "AwaitingFiles", "2 files missing", "2026-11-30T05:00:00Z"),
        condition("Loaded", "False", "NoReadyReplicas", "", "2026-11-30T05:01:00Z"),
        condition("Error", "False", "NoError", "", "2026-11-30T05:02:00Z"),
    ]
    assert last_reason(conditions) == "NoReadyReplicas"
    assert last_reason([condition("Error", "True", "EngineTimeout", "pod a: timed out")]) == (
        "EngineTimeout: pod a: timed out"
    )
    assert last_reason([condition("Ready", "True", "IntegrityVerified")]) == ""
