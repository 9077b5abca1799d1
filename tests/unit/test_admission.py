"""functions.logic.admission: what admission reads for a spec, and its decision from what was
read (or the lookup it still lacks), by table. The statuses themselves: test_admit_decide.py."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from functions.logic import reasons
from functions.logic.admission import Found, Lookup, decide, lookup_of
from functions.resources.inference import InferenceService, SGLangAdapter
from functions.resources.rackai import LoRAAdapter, LoRAAdapterStatus

NOW = datetime(2026, 3, 1, tzinfo=UTC)
MODEL = Lookup("Model", "ns", "llama")
CHAT = Lookup("InferenceService", "ns", "chat")


def vllm(model: str = "llama") -> LoRAAdapter:
    return LoRAAdapter.model_validate(
        {"metadata": {"name": "a", "namespace": "ns", "generation": 1}, "spec": {"model": model}}
    )


def sglang(namespace: str | None = None, name: str = "chat") -> SGLangAdapter:
    ref: dict[str, Any] = {"name": name} if namespace is None else {"namespace": namespace, "name": name}
    return SGLangAdapter.model_validate(
        {
            "metadata": {"name": "s", "namespace": "ns", "generation": 1},
            "spec": {"inferenceServiceRef": ref, "name": "s", "path": "/models/s"},
        }
    )


def service(runtime: str = "sglang") -> InferenceService:
    return InferenceService.model_validate(
        {"metadata": {"name": "chat", "namespace": "ns"}, "spec": {"runtime": runtime, "replicas": 1}}
    )


@pytest.mark.parametrize(
    ("adapter", "expected"),
    [
        pytest.param(vllm(), MODEL, id="model"),
        pytest.param(vllm("Not_A_Name"), None, id="model-name-that-cannot-exist"),
        pytest.param(vllm("a" * 254), None, id="model-name-too-long"),
        pytest.param(sglang(), CHAT, id="service-in-own-namespace"),
        pytest.param(sglang("team-b"), Lookup("InferenceService", "team-b", "chat"), id="service-elsewhere"),
        pytest.param(sglang("Team B"), None, id="namespace-that-cannot-exist"),
        pytest.param(sglang(name="../x"), None, id="service-name-that-cannot-exist"),
    ],
)
def test_lookup_of(adapter: LoRAAdapter | SGLangAdapter, expected: Lookup | None) -> None:
    assert lookup_of(adapter) == expected


def ready_reason(status: Any) -> str:
    assert isinstance(status, LoRAAdapterStatus)
    return next(c.reason for c in status.conditions or [] if c.type == "Ready")


def available_reason(status: Any) -> str:
    return str(next(c.reason for c in status.conditions or [] if c.type == "Available"))


@pytest.mark.parametrize(
    ("adapter", "found", "expected"),
    [
        pytest.param(vllm(), Found(), MODEL, id="vllm-not-read-yet"),
        pytest.param(
            vllm(), Found(models={Lookup("Model", "ns", "other"): True}), MODEL, id="vllm-read-another"
        ),
        pytest.param(sglang(), Found(models={CHAT: True}), CHAT, id="sglang-a-model-is-not-a-service"),
        pytest.param(sglang(), Found(), CHAT, id="sglang-not-read-yet"),
    ],
)
def test_decide_names_the_lookup_it_lacks(
    adapter: LoRAAdapter | SGLangAdapter, found: Found, expected: Lookup
) -> None:
    assert decide(adapter, found, NOW) == expected


@pytest.mark.parametrize(
    ("adapter", "found", "reason"),
    [
        pytest.param(vllm(), Found(models={MODEL: True}), reasons.ADMITTED, id="model-exists"),
        pytest.param(vllm(), Found(models={MODEL: False}), reasons.MODEL_NOT_FOUND, id="model-missing"),
        pytest.param(vllm("Not_A_Name"), Found(), reasons.MODEL_NOT_FOUND, id="no-read-needed"),
    ],
)
def test_decide_vllm_from_what_was_read(adapter: LoRAAdapter, found: Found, reason: str) -> None:
    assert ready_reason(decide(adapter, found, NOW)) == reason


@pytest.mark.parametrize(
    ("adapter", "found", "reason"),
    [
        pytest.param(
            sglang(), Found(services={CHAT: service()}), reasons.INFERENCE_SERVICE_READY, id="ready"
        ),
        pytest.param(
            sglang(), Found(services={CHAT: None}), reasons.INFERENCE_SERVICE_NOT_FOUND, id="missing"
        ),
        pytest.param(
            sglang(), Found(services={CHAT: service("vllm")}), reasons.RUNTIME_MISMATCH, id="runtime"
        ),
        pytest.param(sglang("Team B"), Found(), reasons.INFERENCE_SERVICE_NOT_FOUND, id="no-read-needed"),
    ],
)
def test_decide_sglang_from_what_was_read(adapter: SGLangAdapter, found: Found, reason: str) -> None:
    assert available_reason(decide(adapter, found, NOW)) == reason


def test_found_knows_each_kind_apart() -> None:
    found = Found(models={MODEL: False}, services={CHAT: None})
    assert found.knows(MODEL) and found.knows(CHAT)
    assert not found.knows(Lookup("Model", "ns", "chat"))
    assert not found.knows(Lookup("InferenceService", "ns", "llama"))
