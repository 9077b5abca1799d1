"""17. Engines at capacity: engine loads per resync tick at steady state, and the engine
listings a rolling restart makes.

Both run the production load and reload handlers on the in-memory fakes of the ports
(tests/support/fakes.py), whose SGLang engines enforce `max_loaded_loras` as SGLang's LRU
release does (a load past it evicts the least recently loaded, and the name leaves the listing):
- 3 SGLang pods at `max_loaded_loras` 4 (reported by the engine) with 10 adapters on their
  InferenceService, and a vLLM deployment of 3 pods at `--max-cpu-loras 4` with 10 adapters:
  every adapter is nudged each tick, as a resync that found them all drifted would, for 20
  ticks after the first loads; figure: engine loads per tick at steady state (target 0);
- a rolling restart of a 50-pod ModelDeployment: each pod's restart reloads it; figure: the
  engine listings made (target: 50, one per restart).

Measured on the code before engine capacity was planned (same scenarios, its handlers): SGLang
30 loads per tick on every one of the 20 ticks (each load evicted another wanted adapter, which
the next tick loaded again), and 2,500 listings for the 50-pod rolling restart (N²). vLLM made
0 loads per tick before and after: its listing keeps every name (it reads an evicted adapter
again from its path on demand); what changes for it is the status, which says `reloadable`.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from bench.common import Result
from events.domain import ADAPTER_DRIFTED, ADAPTER_READY, STEP_EXTENSION
from functions import load, reload
from functions.edge.bootstrap import Deps
from functions.logic.capacity import Capacity
from functions.resources.kinds import SGLANG_ADAPTER, VLLM_ADAPTER
from functions.settings import Settings
from tests.support.fakes import FakeBroker, FakeConfigs, FakeEngines, FakeKube, FakeStorage
from tests.support.objects import (
    MOUNT,
    adapter_event,
    api_event,
    inference_service,
    model_deployment,
    pod,
    sglang_adapter,
    url_of,
    vllm_adapter,
)

NS = "bench"
CONFIG = b'{"peft_type": "LORA", "r": 8}'
BEFORE = {"sglang_loads_per_tick": 30, "rolling_restart_listings": 2500}


def _deps(kube: FakeKube, engines: FakeEngines, storage: FakeStorage) -> Deps:
    return Deps(
        Settings(mount_root=MOUNT, loopback_engines="allow"),
        kube=kube,
        storage=storage,
        configs=FakeConfigs(storage),
        engines=engines,
        broker=FakeBroker(),
        clock=lambda: datetime(2026, 6, 1, tzinfo=UTC),
    )


def _count(engines: FakeEngines, op: str) -> int:
    return sum(1 for e in engines.pods.values() for c in e.calls if c[0] == op)


def _ticks(deps: Deps, engines: FakeEngines, kind: Any, names: list[str], ticks: int) -> list[int]:
    per_tick = []
    for _ in range(ticks):
        before = _count(engines, "load")
        for name in names:
            load.handle(adapter_event(ADAPTER_DRIFTED, kind, NS, name, **{STEP_EXTENSION: "load"}), deps)
        per_tick.append(_count(engines, "load") - before)
    return per_tick


def sglang_steady(ticks: int) -> list[int]:
    isvc = inference_service(NS, "chat")
    pods = [pod(NS, f"chat-{i}", isvc, f"10.9.0.{i + 1}") for i in range(3)]
    names = [f"s{i:02d}" for i in range(10)]
    adapters = [
        sglang_adapter(NS, n, n, f"/m/{n}", (NS, "chat"), created=f"2026-01-{i + 1:02d}T00:00:00Z")
        for i, n in enumerate(names)
    ]
    kube, engines = FakeKube(isvc, *pods, *adapters), FakeEngines()
    for p in pods:
        engine = engines.engine(url_of(p), "sglang")
        engine.slots, engine.reports = 4, Capacity(4, True, "engine")
    deps = _deps(kube, engines, FakeStorage())
    for name in names:
        load.handle(adapter_event(ADAPTER_READY, SGLANG_ADAPTER, NS, name), deps)
    return _ticks(deps, engines, SGLANG_ADAPTER, names, ticks)


def vllm_steady(ticks: int) -> tuple[list[int], list[str]]:
    names = [f"v{i:02d}" for i in range(10)]
    md = model_deployment(NS, "d1", names)
    pods = [pod(NS, f"d1-{i}", md, f"10.7.0.{i + 1}") for i in range(3)]
    for p in pods:
        p["spec"]["containers"][0]["args"] = ["--enable-lora", "--max-loras", "2", "--max-cpu-loras", "4"]
    files = {f"/loraadapters/{NS}/m1/{n}/adapter_config.json": CONFIG for n in names}
    kube, engines = FakeKube(md, *pods, *(vllm_adapter(NS, n) for n in names)), FakeEngines()
    deps = _deps(kube, engines, FakeStorage(files))
    for name in names:
        load.handle(adapter_event(ADAPTER_READY, VLLM_ADAPTER, NS, name), deps)
    per_tick = _ticks(deps, engines, VLLM_ADAPTER, names, ticks)
    obj = kube.get(VLLM_ADAPTER, NS, names[0]) or {}
    residency = sorted({str(s.get("residency")) for s in (obj.get("status") or {}).get("served") or []})
    return per_tick, residency


def rolling_restart(replicas: int) -> int:
    md = model_deployment(NS, "d1", ["a1"])
    pods = [pod(NS, f"d1-{i:02d}", md, f"10.8.{i // 200}.{i % 200 + 1}") for i in range(replicas)]
    files = {f"/loraadapters/{NS}/m1/a1/adapter_config.json": CONFIG}
    kube, engines = FakeKube(vllm_adapter(NS, "a1"), md, *pods), FakeEngines()
    deps = _deps(kube, engines, FakeStorage(files))
    load.handle(adapter_event(ADAPTER_READY, VLLM_ADAPTER, NS, "a1"), deps)
    before = _count(engines, "list")
    for p in pods:
        engines.engine(url_of(p)).loaded.clear()  # the restart forgets it
        reload.handle(api_event("update", p), deps)
    return _count(engines, "list") - before


def run(smoke: bool) -> Result:
    ticks, replicas = (3, 10) if smoke else (20, 50)
    started = time.perf_counter()
    sglang = sglang_steady(ticks)
    vllm, residency = vllm_steady(ticks)
    listings = rolling_restart(replicas)
    steady = max(sglang[1:] + vllm[1:]) if ticks > 1 else max(sglang + vllm)
    return Result(
        name="capacity",
        title="engines at capacity: engine loads per resync tick at steady state",
        value=float(steady),
        unit="loads/tick",
        target="0 at steady state; a rolling restart lists N engines",
        met=steady == 0 and listings == replicas,
        reference=float(BEFORE["sglang_loads_per_tick"]),
        details={
            "sglang_loads_per_tick": sglang,
            "vllm_loads_per_tick": vllm,
            "vllm_residency": residency,
            "rolling_restart_pods": replicas,
            "rolling_restart_listings": listings,
            "before": BEFORE,
            "seconds": round(time.perf_counter() - started, 3),
        },
        note="handlers on fakes; 'before' measured on the code before capacity planning",
    )
