"""13. Update gap: a retrained adapter replaces the old one in 10 replicas; how long each pod
serves no adapter under that name while it happens (p50/p99 over the pods).

vLLM with `load_inplace` keeps the name the whole time (target: 0 ms). Unload then load (SGLang,
which has no in-place reload, and vLLM with LORAFLOW_VLLM_REPLACE=reload) leaves it unserved for
one load (target: p99 <= 1.5x the engine's load time, 100 ms here). Measured from the engine
stand-ins' own log of when each name came and went; the load step runs in its own process.
Reference: the engine's load latency (what one load costs).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

from bench import world as w
from bench.common import Result, percentile, timed
from events.domain import ADAPTER_DRIFTED, ADAPTER_READY, STEP_EXTENSION
from functions.logic.facts import file_set
from functions.resources.kinds import INFERENCE_SERVICE, INFERENCE_SERVICE_LABEL, SGLANG_ADAPTER, VLLM_ADAPTER
from tests.support.testbed import environment

LATENCY = 0.1


def gaps(world: w.World, ns: str, pods: list[str], name: str, since: float) -> list[float]:
    """Per pod: the longest stretch after `since` in which `name` was not served."""
    found: list[float] = []
    for pod in pods:
        events = [
            e
            for e in world.workload.replica(ns, pod).state()["presence"]
            if e["name"] == name and e["at"] >= since
        ]
        longest, gone_at = 0.0, None
        for e in events:
            if not e["served"]:
                gone_at = e["at"]
            elif gone_at is not None:
                longest, gone_at = max(longest, e["at"] - gone_at), None
        found.append(longest)
    return found


def drift(kind: Any, ns: str, name: str) -> Any:
    data = w.adapter_data(kind, ns, name, step="load", reason="a newer file set")
    return w.event(ADAPTER_DRIFTED, data, **{STEP_EXTENSION: "load"})


def vllm_update(world: w.World, load_url: str, replicas: int) -> tuple[list[float], float]:
    ns = world.namespace()
    world.deployment(ns, "d1", replicas, ["a1"])
    world.ready_adapter(ns, "a1")
    world.workload.sync()
    pods = world.pods(ns, "d1")
    ready = w.event(ADAPTER_READY, w.adapter_data(VLLM_ADAPTER, ns, "a1"))
    assert w.post_to(world.http, load_url, ready).status_code == 200
    # retrained: new weights in storage, verified (the status verify writes for the new set)
    files = world.adapter_files(ns, "a1")
    weights = world.adapter_dir(ns, "a1") + "adapter_model.safetensors"
    files[weights] = b"retrained weights"
    world.upload(weights, files[weights])
    md5s = {path: w._md5(content) for path, content in files.items()}
    world.custom.patch_namespaced_custom_object(
        VLLM_ADAPTER.group,
        VLLM_ADAPTER.version,
        ns,
        VLLM_ADAPTER.plural,
        "a1",
        {"spec": {"integrity": {"md5": md5s}}},
    )
    status = world.read(VLLM_ADAPTER, ns, "a1")["status"]
    status["fileSet"] = file_set(md5s)
    status["integrity"] = {"files": {p: {"md5": m, "size": len(files[p])} for p, m in md5s.items()}}
    world.patch_status(VLLM_ADAPTER, ns, "a1", status)
    started = world.workload.replica(ns, pods[0]).state()["presence"][-1]["at"]
    elapsed = timed(lambda: w.post_to(world.http, load_url, drift(VLLM_ADAPTER, ns, "a1")).raise_for_status())
    new = w._md5(files[weights])
    for pod in pods:
        assert new in world.workload.replica(ns, pod).state()["files"]["a1"].values(), pod
    return gaps(world, ns, pods, "a1", started), elapsed


def sglang_update(world: w.World, load_url: str, replicas: int) -> tuple[list[float], float]:
    ns = world.namespace()
    world.create(
        INFERENCE_SERVICE,
        ns,
        {"metadata": {"name": "chat"}, "spec": {"runtime": "sglang", "model": "base", "replicas": replicas}},
    )
    world.workload.sync()
    for version in ("v1", "v2"):
        world.upload(
            f"/sglang/{ns}/{version}/adapter_config.json", json.dumps({"peft_type": "LORA", "r": 8}).encode()
        )
        world.upload(f"/sglang/{ns}/{version}/adapter_model.safetensors", version.encode())
    created = world.create(
        SGLANG_ADAPTER,
        ns,
        {
            "metadata": {"name": "s1"},
            "spec": {"inferenceServiceRef": {"name": "chat"}, "name": "s1", "path": f"/sglang/{ns}/v1"},
        },
    )
    admit = w.post_to(world.http, world.host.urls["admit"], w.apiserver_event("add", created))
    assert admit.status_code == 200, admit.text
    assert (
        w.post_to(
            world.http, load_url, w.event(ADAPTER_READY, w.adapter_data(SGLANG_ADAPTER, ns, "s1"))
        ).status_code
        == 200
    )
    pods = sorted(p["metadata"]["name"] for p in world.workload.pods(ns, f"{INFERENCE_SERVICE_LABEL}=chat"))
    world.custom.patch_namespaced_custom_object(
        SGLANG_ADAPTER.group,
        SGLANG_ADAPTER.version,
        ns,
        SGLANG_ADAPTER.plural,
        "s1",
        {"spec": {"path": f"/sglang/{ns}/v2"}},
    )
    started = world.workload.replica(ns, pods[0]).state()["presence"][-1]["at"]
    elapsed = timed(
        lambda: w.post_to(world.http, load_url, drift(SGLANG_ADAPTER, ns, "s1")).raise_for_status()
    )
    for pod in pods:
        assert world.workload.replica(ns, pod).loaded["s1"] == f"/sglang/{ns}/v2", pod
    return gaps(world, ns, pods, "s1", started), elapsed


@contextlib.contextmanager
def load_process(replace: str) -> Iterator[str]:
    with environment(LORAFLOW_VLLM_REPLACE=replace), w.function_process("load") as url:
        yield url


def summary(samples: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(percentile(samples, 50) * 1000, 1),
        "p99_ms": round(percentile(samples, 99) * 1000, 1),
    }


def run(smoke: bool) -> Result:
    replicas = 2 if smoke else 10
    latency = 0.01 if smoke else LATENCY
    with w.world(functions=True, load_latency_s=latency, unload_latency_s=0.0) as world:
        with load_process("inplace") as url:
            inplace, inplace_s = vllm_update(world, url, replicas)
            sglang, sglang_s = sglang_update(world, url, replicas)
        with load_process("reload") as url:
            reload, reload_s = vllm_update(world, url, replicas)
    figures = {
        "vllm_inplace": summary(inplace),
        "vllm_unload_then_load": summary(reload),
        "sglang": summary(sglang),
    }
    worst = max(percentile(reload, 99), percentile(sglang, 99))
    met = percentile(inplace, 99) == 0.0 and worst <= 1.5 * latency
    return Result(
        name="update_gap",
        title=f"Update gap: a retrained adapter replaced in {replicas} replicas (time a name goes unserved)",
        value=figures["sglang"]["p99_ms"],
        unit="ms p99 (unload then load)",
        reference=round(latency * 1000, 1),
        ratio=round(worst / latency, 2),
        target="vLLM in place: 0 ms; unload then load: p99 <= 1.5x one load",
        met=met,
        details={
            **figures,
            "replicas": replicas,
            "engine_load_latency_ms": latency * 1000,
            "update_answered_ms": {
                "vllm_inplace": round(inplace_s * 1000, 1),
                "vllm_reload": round(reload_s * 1000, 1),
                "sglang": round(sglang_s * 1000, 1),
            },
        },
        note="; ".join(
            f"{label} p50/p99 {figures[key]['p50_ms']}/{figures[key]['p99_ms']} ms"
            for label, key in (
                ("vLLM in place", "vllm_inplace"),
                ("vLLM unload then load", "vllm_unload_then_load"),
                ("SGLang", "sglang"),
            )
        )
        + f"; one load {latency * 1000:.0f} ms",
    )


if __name__ == "__main__":
    print(run(False))
