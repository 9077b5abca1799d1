"""The invariant checker itself: silent on a converged world, loud on every planted violation.

A checker that cannot fail proves nothing: each test below plants one kind of violation
behind the functions' backs (the broker drops every delivery meanwhile, so nothing repairs it
before the check), asserts the checker names it, then lets the system repair it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import httpx
import pytest

from devstack.eventing.broker import Faults
from devstack.stack import Stack
from functions.resources.kinds import SGLANG_ADAPTER, VLLM_ADAPTER
from tests.support.convergence import Env, md5_hex, quiesce_and_check
from tests.support.invariant import Violation
from tests.support.wait import eventually


@pytest.fixture(scope="module")
def env(rstack: Stack) -> Env:
    env = Env.new(rstack, "inv")
    env.deployment("d1", 2, ["a1", "a2"])
    env.deployment("d2", 1, ["a2"])
    env.service("svc", 2)
    env.wait_pods(md={"d1": 2, "d2": 1}, isvc={"svc": 2})
    env.vllm("a1")
    env.vllm("a2")
    env.vllm("spare")  # Ready, named by no deployment
    env.vllm("bad", corrupt=True)
    env.sglang("s1", "svc")
    violations, _ = quiesce_and_check(rstack, [env.namespace], rounds=10)
    assert violations == [], violations
    return env


@pytest.fixture
def frozen(rstack: Stack, env: Env) -> Iterator[Env]:
    """Nothing is delivered while a violation is planted and checked; afterwards it is repaired."""
    rstack.settle()
    rstack.broker.set_faults(Faults(drop=1.0))
    yield env
    violations, _ = quiesce_and_check(rstack, [env.namespace], rounds=10)
    assert violations == [], violations


def _rules(violations: list[Violation]) -> set[str]:
    return {v.rule for v in violations}


def _pod_url(env: Env, pod: dict[str, object]) -> str:
    return env.stack.workload.replica(env.namespace, pod["metadata"]["name"]).url  # type: ignore[index]


def test_converged_world_has_no_violation(env: Env) -> None:
    assert env.check() == []


def test_adapter_unloaded_behind_our_back_is_missing(frozen: Env) -> None:
    pod = frozen.md_pods("d1")[0]
    httpx.post(_pod_url(frozen, pod) + "/v1/unload_lora_adapter", json={"lora_name": "a1"}).raise_for_status()
    found = frozen.check()
    assert any(v.rule == "missing" and "a1" in v.detail for v in found), found
    # and the status now lies (Loaded=True while a pod lacks it)
    assert any(v.rule == "status" and "a1" in v.subject and "Loaded" in v.detail for v in found), found


def test_adapter_loaded_where_not_wanted_is_surplus(frozen: Env) -> None:
    pod = frozen.md_pods("d2")[0]
    path = f"{frozen.stack.mount_root}/loraadapters/{frozen.namespace}/{frozen.model}/spare"
    answer = httpx.post(
        _pod_url(frozen, pod) + "/v1/load_lora_adapter", json={"lora_name": "spare", "lora_path": path}
    )
    answer.raise_for_status()
    found = frozen.check()
    assert any(v.rule == "surplus" and "spare" in v.detail for v in found), found


def test_sglang_missing_and_surplus(frozen: Env) -> None:
    pod = frozen.isvc_pods("svc")[0]
    url = _pod_url(frozen, pod)
    httpx.post(url + "/unload_lora_adapter", json={"lora_name": "s1-v1"}).raise_for_status()
    found = frozen.check()
    assert any(v.rule == "missing" and "s1-v1" in v.detail for v in found), found


def test_failed_adapter_loaded_is_surplus(frozen: Env) -> None:
    pod = frozen.md_pods("d1")[0]
    path = f"{frozen.stack.mount_root}/loraadapters/{frozen.namespace}/{frozen.model}/bad"
    body = {"lora_name": "bad", "lora_path": path}
    httpx.post(_pod_url(frozen, pod) + "/v1/load_lora_adapter", json=body).raise_for_status()
    assert any(v.rule == "surplus" and "bad" in v.detail for v in frozen.check())


def _use(url: str, *models: str) -> dict[str, object]:
    """Requests naming `models` in turn, as traffic would; the last one's `served_by`."""
    served: dict[str, object] = {}
    for model in models:
        answer = httpx.post(url + "/v1/completions", json={"model": model, "prompt": "hi", "max_tokens": 1})
        answer.raise_for_status()
        served = answer.json()["served_by"]
    return served


def test_tampered_frozen_copy_read_again_is_unverified(frozen: Env) -> None:
    pod = frozen.md_pods("d1")[0]
    url = _pod_url(frozen, pod)
    record = frozen.cluster.get(VLLM_ADAPTER, "a1")["status"]["frozen"][0]  # type: ignore[index]
    path = record["path"].rstrip("/") + "/adapter_model.safetensors"
    original = frozen.files["a1"]["adapter_model.safetensors"]
    frozen.stack.upload(path, os.urandom(len(original)))  # the same size: a retrain of the same rank
    # the pod's vLLM keeps one adapter in its CPU cache: a request for a2 puts a1 out, and the
    # next request for a1 reads its frozen copy again
    served = _use(url, "a2", "a1")
    assert served["reloaded"] is True, served
    assert served["md5s"]["adapter_model.safetensors"] != md5_hex(original), served  # type: ignore[index]
    found = frozen.check()
    name = pod["metadata"]["name"]
    assert any(
        v.rule == "unverified" and name in v.subject and "a1" in v.detail and "adapter_model" in v.detail
        for v in found
    ), found
    # nothing loraflow would do differs (the listing is the same): only integrity names it
    assert {v.rule for v in found} == {"unverified"}, found
    # the verified bytes back, read again by the pod: the teardown's check then holds
    frozen.stack.upload(path, original)
    served = _use(url, "a2", "a1")
    assert served["md5s"]["adapter_model.safetensors"] == md5_hex(original), served  # type: ignore[index]


def test_status_field_that_lies_is_caught(frozen: Env) -> None:
    custom = frozen.stack.custom
    g, v, p = VLLM_ADAPTER.group, VLLM_ADAPTER.version, VLLM_ADAPTER.plural
    saved = {
        n: custom.get_namespaced_custom_object(g, v, frozen.namespace, p, n)["status"] for n in ("a2", "bad")
    }
    custom.patch_namespaced_custom_object_status(
        g, v, frozen.namespace, p, "a2", {"status": {"usedBy": ["d1"], "size": "1Ki"}}
    )
    found = frozen.check()
    details = " ".join(x.detail for x in found if x.rule == "status" and "a2" in x.subject)
    assert "usedBy" in details and "size" in details, found
    # a Failed adapter must never say Ready
    custom.patch_namespaced_custom_object_status(
        g, v, frozen.namespace, p, "bad", {"status": {"phase": "Ready", "ready": True}}
    )
    found = frozen.check()
    assert any(x.rule == "status" and "bad" in x.subject and "phase" in x.detail for x in found), found
    # a status no step would write is not an event any step reacts to: put the truth back
    for name, status in saved.items():
        custom.patch_namespaced_custom_object_status(g, v, frozen.namespace, p, name, {"status": status})


def test_sglang_status_that_lies_is_caught(frozen: Env) -> None:
    g, v, p = SGLANG_ADAPTER.group, SGLANG_ADAPTER.version, SGLANG_ADAPTER.plural
    current = frozen.stack.custom.get_namespaced_custom_object(g, v, frozen.namespace, p, "s1")
    saved = dict(current["status"])
    conditions = [
        {**c, "status": "False", "reason": "NoReadyReplicas"} if c["type"] == "Loaded" else c
        for c in current["status"]["conditions"]
    ]
    frozen.stack.custom.patch_namespaced_custom_object_status(
        g, v, frozen.namespace, p, "s1", {"status": {"conditions": conditions, "lastLoadedAt": None}}
    )
    found = frozen.check()
    assert {"status", "last-loaded-at"} <= _rules(found), found
    frozen.stack.custom.patch_namespaced_custom_object_status(
        g, v, frozen.namespace, p, "s1", {"status": saved}
    )


def test_finalizer_left_on_deleted_adapter_is_caught(frozen: Env) -> None:
    frozen.vllm("doomed", upload=False)
    eventually(
        lambda: (
            "loraflow.io/unload"
            in (frozen.cluster.get(VLLM_ADAPTER, "doomed") or {}).get("metadata", {}).get("finalizers", [])
            or _admit_by_hand(frozen)
        ),
        timeout=30,
        what="finalizer",
    )
    frozen.cluster.delete(VLLM_ADAPTER, "doomed")
    found = frozen.check()
    assert any(v.rule == "finalizer" and "doomed" in v.subject for v in found), found


def _admit_by_hand(env: Env) -> bool:
    """Deliveries are dropped: put the finalizer on as admit would."""
    g, v, p = VLLM_ADAPTER.group, VLLM_ADAPTER.version, VLLM_ADAPTER.plural
    env.stack.custom.patch_namespaced_custom_object(
        g, v, env.namespace, p, "doomed", {"metadata": {"finalizers": ["loraflow.io/unload"]}}
    )
    return False


def test_live_adapter_never_admitted_is_caught(frozen: Env) -> None:
    frozen.vllm("unseen", upload=False)
    found = frozen.check()
    assert any(v.rule == "finalizer" and "unseen" in v.subject for v in found), found
    assert any(v.rule == "status" and "unseen" in v.subject for v in found), found
