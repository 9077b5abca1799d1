"""The engine stand-ins at capacity, over real HTTP: what SGLang (both releases) and vLLM do
when adapters outnumber their slots, and the completion route that touches adapters as traffic."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from devstack.standins.engines import EngineFleet, SglangReplica, VllmReplica
from devstack.standins.engines.args import EngineArgsError, replica_settings

MODEL = "base"
NAMES = ("a", "b", "c", "d", "e", "f")


@pytest.fixture(scope="module")
def fleet() -> Iterator[EngineFleet]:
    with EngineFleet(port=0) as f:
        yield f


@pytest.fixture
def mount(tmp_path: Path) -> Path:
    for name in NAMES:
        d = tmp_path / name
        d.mkdir()
        (d / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8}))
        (d / "adapter_model.safetensors").write_bytes(name.encode() * 100)
    return tmp_path


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=5) as c:
        yield c


_keys = iter(range(100_000))


def sglang(fleet: EngineFleet, mount: Path, **settings: object) -> SglangReplica:
    r = fleet.create(f"cap-s{next(_keys)}", "sglang", served_model=MODEL, mount_root=mount, **settings)
    assert isinstance(r, SglangReplica)
    return r


def vllm(fleet: EngineFleet, mount: Path, **settings: object) -> VllmReplica:
    r = fleet.create(f"cap-v{next(_keys)}", "vllm", served_model=MODEL, mount_root=mount, **settings)
    assert isinstance(r, VllmReplica)
    return r


def load(c: httpx.Client, r: SglangReplica | VllmReplica, name: str, **extra: object) -> httpx.Response:
    route = "/load_lora_adapter" if isinstance(r, SglangReplica) else "/v1/load_lora_adapter"
    return c.post(r.url + route, json={"lora_name": name, "lora_path": f"/{name}", **extra})


def listed(c: httpx.Client, r: SglangReplica | VllmReplica) -> list[str]:
    return [card["id"] for card in c.get(r.url + "/v1/models").json()["data"] if card.get("parent")]


def complete(c: httpx.Client, r: SglangReplica | VllmReplica, model: str) -> httpx.Response:
    return c.post(r.url + "/v1/completions", json={"model": model, "prompt": "hi", "max_tokens": 1})


# -- SGLang, the LRU release -------------------------------------------------------------------
def test_sglang_lru_load_past_the_limit_evicts_the_least_recently_used(
    fleet: EngineFleet, mount: Path, client: httpx.Client
) -> None:
    r = sglang(fleet, mount, max_loaded_loras=2, max_loras_per_batch=2)
    assert load(client, r, "a").status_code == 200
    assert load(client, r, "b").status_code == 200
    assert complete(client, r, "a").status_code == 200  # a is now more recent than b
    answer = load(client, r, "c")
    assert answer.status_code == 200
    assert answer.json() == {
        "success": True,
        "error_message": None,
        "loaded_adapters": {"a": "/a", "c": "/c"},
    }
    assert listed(client, r) == ["a", "c"]
    assert r.evictions == 1


def test_sglang_lru_request_reloads_an_evicted_adapter_from_its_path(
    fleet: EngineFleet, mount: Path, client: httpx.Client
) -> None:
    r = sglang(fleet, mount, max_loaded_loras=2, max_loras_per_batch=2)
    for name in ("a", "b", "c"):  # a evicted
        assert load(client, r, name).status_code == 200
    (mount / "a" / "adapter_model.safetensors").write_bytes(b"new weights")
    answer = complete(client, r, "a")
    assert answer.status_code == 200
    served = answer.json()["served_by"]
    assert served["lora_name"] == "a" and served["reloaded"] is True
    assert served["md5s"]["adapter_model.safetensors"] == _md5(b"new weights")
    assert listed(client, r) == ["c", "a"]  # b, the least recently used, made room
    assert r.reloads == 1


def _md5(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def test_sglang_lru_even_an_unloaded_name_is_reloaded_by_a_request_but_never_a_new_one(
    fleet: EngineFleet, mount: Path, client: httpx.Client
) -> None:
    r = sglang(fleet, mount, max_loaded_loras=2, max_loras_per_batch=2)
    assert load(client, r, "a").status_code == 200
    assert client.post(r.url + "/unload_lora_adapter", json={"lora_name": "a"}).status_code == 200
    assert complete(client, r, "a").json()["served_by"]["reloaded"] is True  # lora_ref_cache keeps it
    never = complete(client, r, "zz")
    assert never.status_code == 400
    assert never.json()["message"].startswith("Got LoRA adapter that has never been loaded: zz")
    r.restart(unhealthy_for_s=0)
    assert complete(client, r, "a").status_code == 400  # a restart forgets the cache


def test_sglang_lru_pinned_adapters_are_never_evicted_and_nothing_evictable_is_a_400(
    fleet: EngineFleet, mount: Path, client: httpx.Client
) -> None:
    r = sglang(fleet, mount, max_loaded_loras=3, max_loras_per_batch=3)
    assert load(client, r, "a", pinned=True).status_code == 200
    assert load(client, r, "b", pinned=True).status_code == 200
    refused = load(client, r, "c", pinned=True)  # pinning every batch slot
    assert refused.status_code == 400
    assert "It is not allowed to pin all slots" in refused.json()["error_message"]
    assert load(client, r, "c").status_code == 200
    assert load(client, r, "d").status_code == 200  # evicts c, the only unpinned one
    assert listed(client, r) == ["a", "b", "d"]
    r.configure(max_loras_per_batch=8)
    assert load(client, r, "e", pinned=True).status_code == 200  # evicts d
    stuck = load(client, r, "f", pinned=True)
    assert stuck.status_code == 400
    assert stuck.json()["error_message"].startswith(
        "Didn't find any LoRA adapters when trying to evict LRU LoRA adapter. LoRA registry is:"
    )
    assert stuck.json()["loaded_adapters"] is None
    assert "f" in listed(client, r)  # registered before the eviction loop failed


def test_sglang_refuse_release_answers_400_at_the_limit_even_for_a_duplicate(
    fleet: EngineFleet, mount: Path, client: httpx.Client
) -> None:
    r = sglang(fleet, mount, max_loaded_loras=2, max_loras_per_batch=2, capacity_mode="refuse")
    assert load(client, r, "a").status_code == 200
    assert load(client, r, "b").status_code == 200
    for name in ("c", "a"):
        answer = load(client, r, name)
        assert answer.status_code == 400
        assert answer.json() == {
            "success": False,
            "error_message": f"Cannot load LoRA adapter {name} at path /{name}. Maximum number of loaded "
            "LoRA adapters is 2. Please unload some LoRA adapters before loading new ones.",
            "loaded_adapters": None,
        }
    assert listed(client, r) == ["a", "b"]
    assert client.post(r.url + "/unload_lora_adapter", json={"lora_name": "a"}).status_code == 200
    assert complete(client, r, "a").status_code == 400  # no implicit reload before the LRU change
    assert load(client, r, "c").status_code == 200


def test_sglang_server_info_reports_the_lora_settings_under_both_routes(
    fleet: EngineFleet, mount: Path, client: httpx.Client
) -> None:
    r = sglang(fleet, mount, max_loaded_loras=4, max_loras_per_batch=4, lora_eviction_policy="fifo")
    for route in ("/server_info", "/get_server_info"):
        info = client.get(r.url + route).json()
        assert (info["max_loaded_loras"], info["max_loras_per_batch"], info["lora_eviction_policy"]) == (
            4,
            4,
            "fifo",
        )
    assert client.get(sglang(fleet, mount).url + "/server_info").json()["max_loaded_loras"] is None
    r.configure(info_patch={"max_loaded_loras": "lots"})
    assert client.get(r.url + "/server_info").json()["max_loaded_loras"] == "lots"


def test_sglang_refuses_to_start_with_fewer_loaded_than_batch_slots(fleet: EngineFleet, mount: Path) -> None:
    with pytest.raises(ValueError, match="max_loaded_loras"):
        sglang(fleet, mount, max_loaded_loras=2)  # max_loras_per_batch defaults to 8


@pytest.mark.parametrize(("policy", "kept"), [("lru", ["a", "c"]), ("fifo", ["b", "c"])])
def test_sglang_gpu_pool_eviction_policy(
    fleet: EngineFleet, mount: Path, client: httpx.Client, policy: str, kept: list[str]
) -> None:
    r = sglang(fleet, mount, max_loras_per_batch=2, lora_eviction_policy=policy)
    for name in ("a", "b", "c"):
        assert load(client, r, name).status_code == 200
    for model in ("a", "b", "a", "c"):
        assert complete(client, r, model).status_code == 200
    assert sorted(r.memory()["gpu"]) == kept


# -- vLLM ----------------------------------------------------------------------------------------
def test_vllm_lists_every_name_and_rereads_an_evicted_one_from_its_path(
    fleet: EngineFleet, mount: Path, client: httpx.Client
) -> None:
    r = vllm(fleet, mount, max_loras=1, max_cpu_loras=2)
    for name in ("a", "b", "c"):
        assert load(client, r, name).status_code == 200
    assert listed(client, r) == ["a", "b", "c"]  # the registry is unbounded
    assert r.memory()["resident"] == ["b", "c"]
    assert r.evictions == 1
    (mount / "a" / "adapter_model.safetensors").write_bytes(b"changed under the same path")
    answer = complete(client, r, "a")
    assert answer.status_code == 200
    served = answer.json()["served_by"]
    assert served["reloaded"] is True
    assert served["md5s"]["adapter_model.safetensors"] == _md5(b"changed under the same path")
    assert r.memory()["resident"] == ["a", "c"]
    hit = complete(client, r, "c").json()["served_by"]
    assert hit["reloaded"] is False and hit["md5s"]["adapter_model.safetensors"] == _md5(b"c" * 100)
    assert complete(client, r, "zz").status_code == 404


def test_vllm_unload_drops_the_name_but_not_the_slot(
    fleet: EngineFleet, mount: Path, client: httpx.Client
) -> None:
    r = vllm(fleet, mount, max_loras=1, max_cpu_loras=2)
    assert load(client, r, "a").status_code == 200
    assert client.post(r.url + "/v1/unload_lora_adapter", json={"lora_name": "a"}).status_code == 200
    assert listed(client, r) == []
    assert [entry["name"] for entry in r.memory()["cpu"]] == ["a"]  # still cached, nobody can ask for it
    assert load(client, r, "a").status_code == 200  # a fresh lora_int_id: both copies cached
    assert [entry["name"] for entry in r.memory()["cpu"]] == ["a", "a"]
    assert complete(client, r, "a").json()["served_by"]["reloaded"] is False
    fixed = vllm(fleet, mount, max_loras=1, max_cpu_loras=2, unload_frees=True)
    assert load(client, fixed, "a").status_code == 200
    assert client.post(fixed.url + "/v1/unload_lora_adapter", json={"lora_name": "a"}).status_code == 200
    assert fixed.memory()["cpu"] == []


def test_vllm_refuses_fewer_cpu_than_gpu_slots(fleet: EngineFleet, mount: Path) -> None:
    with pytest.raises(ValueError, match="max_cpu_loras"):
        vllm(fleet, mount, max_loras=4, max_cpu_loras=2)


# -- engine arguments ----------------------------------------------------------------------------
def test_engine_args_as_a_deployment_writes_them() -> None:
    args = [
        "--enable-lora",
        "--max-loaded-loras=4",
        "--max-loras-per-batch",
        "4",
        "--lora-eviction-policy",
        "fifo",
    ]
    assert replica_settings("sglang", args) == {
        "max_loaded_loras": 4,
        "max_loras_per_batch": 4,
        "lora_eviction_policy": "fifo",
    }
    assert replica_settings("vllm", ["--max-loras", "2", "--max-cpu-loras=8", "--max-loaded-loras", "1"]) == {
        "max_loras": 2,
        "max_cpu_loras": 8,
    }
    with pytest.raises(EngineArgsError, match="invalid int"):
        replica_settings("sglang", ["--max-loaded-loras", "four"])


def test_a_targets_engine_args_reach_its_pods_and_replicas(fleet: EngineFleet, mount: Path) -> None:
    from devstack.workload import engine_settings, pod_body
    from functions.logic import capacity
    from functions.resources.kinds import INFERENCE_SERVICE

    args = ["--max-loaded-loras", "4", "--max-loras-per-batch", "4"]
    target = {
        "metadata": {"name": "chat", "namespace": "ns"},
        "spec": {"runtime": "sglang", "engineArgs": args},
    }
    r = sglang(fleet, mount, **engine_settings("sglang", args))
    assert (r.max_loaded_loras, r.max_loras_per_batch) == (4, 4)
    body = pod_body(INFERENCE_SERVICE, target, "chat-0", r)
    assert body["spec"]["containers"][0]["args"] == args
    assert (
        capacity.of_pod("sglang", None, capacity.container_args(body), None).slots == 4
    )  # what loraflow reads
    assert engine_settings("sglang", ["--max-loaded-loras", "x"]) == {}
