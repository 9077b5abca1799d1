"""17. Engines at capacity: engine loads per resync tick at steady state, and the engine
listings a rolling restart makes.

On the real servers the other rows use (bench/world.py): kube-apiserver and etcd, the SeaweedFS
filer, the workload stand-in's engine replicas (their capacity set by each target's
`spec.engineArgs`, as tests/functions/test_capacity.py sets it), and every function served over
HTTP by functions-framework; events go from one function to the next by the Triggers, as the
Broker routes them (`Broker` below: bench/world.py's `route`, with the Triggers rendered once).
- 3 SGLang pods of an InferenceService at `--max-loaded-loras 4` (the engine reports it in
  `/server_info`) with 10 adapters (created, then admitted by admit, whose `adapter.admitted`
  goes to load), and a vLLM ModelDeployment of 3 pods at `--max-cpu-loras 4` with 10 Ready
  adapters (`adapter.ready` to load). Then 20 ticks: traffic naming every adapter in every pod
  (the engines' `POST /v1/completions`, which answer the weights that served it; SGLang touches
  the adapter in its LRU registry and vLLM reads an evicted one again from its path), then a
  resync tick (a PingSource event posted to resync), whose drift nudges (published to the
  event sink) are delivered by the Triggers, replies followed. Figure: the engine loads
  (`POST` load, the stand-ins' own counters) per tick at steady state, per kind (target 0);
  details: the nudges per tick and their reasons, the traffic's answers, and the Loaded
  condition of each adapter (the ones left out carry EngineCapacityExceeded). The first tick
  nudges load for the SGLang adapters left out while fewer were admitted (their Loaded message
  still counts the adapters the service wanted then): load rewrites the message, no engine call;
- a rolling restart of a 50-pod ModelDeployment serving one adapter: each pod in turn is
  restarted by the workload stand-in (Pod not Ready, the engine forgets its adapters, Ready again
  once /health answers) and its Pod update is posted to reload (as ApiServerSource sends it);
  figure: the engine listings (`GET /v1/models` on any replica) made (target: 50, one per
  restart).

Measured on the in-memory fakes (tests/support/fakes.py), on the code before engine capacity
was planned (same scenarios, its handlers, no traffic): SGLang 30 loads per tick on every one
of the 20 ticks (each load evicted another wanted adapter, which the next tick loaded again),
and 2,500 listings for the 50-pod rolling restart (N²). vLLM made 0 loads per tick before and
after: its listing keeps every name (it reads an evicted adapter again from its path on
demand); what changes for it is the status, which says `reloadable`.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import httpx

from bench import world as w
from bench.common import Result
from devstack.standins.engines import EngineReplica
from events.domain import ADAPTER_DRIFTED, ADAPTER_READY
from events.external import PING
from functions.resources.kinds import (
    INFERENCE_SERVICE,
    INFERENCE_SERVICE_LABEL,
    MODEL_DEPLOYMENT,
    MODEL_DEPLOYMENT_LABEL,
    SGLANG_ADAPTER,
    VLLM_ADAPTER,
    Kind,
)
from tests.support.builders import condition, pod_object, sglang_adapter, sglang_files

BEFORE = {"sglang_loads_per_tick": 30, "rolling_restart_listings": 2500}
"""Measured on the fakes, on the code before capacity planning (see the docstring)."""
PODS, ADAPTERS, SLOTS = 3, 10, 4
SGLANG_ARGS = ["--enable-lora", "--max-loaded-loras", str(SLOTS), "--max-loras-per-batch", "2"]
VLLM_ARGS = ["--enable-lora", "--max-loras", "2", "--max-cpu-loras", str(SLOTS)]
KINDS = {SGLANG_ADAPTER.api_version: "sglang", VLLM_ADAPTER.api_version: "vllm"}


def _replicas(world: w.World, ns: str, selector: str) -> list[EngineReplica]:
    return [world.workload.replica(ns, p["metadata"]["name"]) for p in world.workload.pods(ns, selector)]


def _fleet(world: w.World) -> list[EngineReplica]:
    return [r for _, r in world.workload.fleet.items()]


def _calls(replicas: list[EngineReplica], route: str) -> int:
    return sum(r.calls.get(route, 0) for r in replicas)


def _engine(replicas: list[EngineReplica], counter: str) -> int:
    """The sum of an engine's own counter (`reloads`, `evictions`) over `replicas`."""
    return sum(int(getattr(r, counter)) for r in replicas)


def sglang_service(world: w.World, broker: w.Router, ns: str) -> list[str]:
    """The InferenceService at capacity and its adapters, admitted (oldest first: s00)."""
    world.create(
        INFERENCE_SERVICE,
        ns,
        {
            "metadata": {"name": "chat"},
            "spec": {"runtime": "sglang", "model": "base", "replicas": PODS, "engineArgs": SGLANG_ARGS},
        },
    )
    world.workload.sync()
    names = [f"s{i:02d}" for i in range(ADAPTERS)]
    for name in names:
        created = sglang_adapter(world, ns, name, name, sglang_files(world, ns, name), target="chat")
        broker.deliver(w.apiserver_event("add", created), "admit")
    return names


def vllm_deployment(world: w.World, broker: w.Router, ns: str) -> list[str]:
    """The ModelDeployment at capacity and its Ready adapters, loaded."""
    names = [f"v{i:02d}" for i in range(ADAPTERS)]
    world.create(
        MODEL_DEPLOYMENT,
        ns,
        {
            "metadata": {"name": "d1"},
            "spec": {
                "model": w.MODEL,
                "replicas": PODS,
                "loraAdapters": names,
                "engineArgs": VLLM_ARGS,
            },
        },
    )
    world.workload.sync()
    for name in names:
        world.ready_adapter(ns, name)
        broker.deliver(w.event(ADAPTER_READY, w.adapter_data(VLLM_ADAPTER, ns, name)))
    return names


def traffic(http: httpx.Client, replicas: list[EngineReplica], names: list[str], seen: Counter[str]) -> None:
    """One request naming each adapter in each pod; `seen` counts the answers: `served` when the
    weights that served it are the adapter's, else the status the engine answered."""
    for replica in replicas:
        for name in names:
            answer = http.post(replica.url + "/v1/completions", json={"model": name, "prompt": "x"})
            by = (answer.json().get("served_by") or {}) if answer.status_code == 200 else {}
            right = by.get("lora_name") == name and str(by.get("lora_path", "")).rstrip("/").endswith(name)
            seen["served" if right else f"answered {answer.status_code}"] += 1
            if answer.status_code != 200:
                seen[f"refused {name}"] += 1


def tick(world: w.World, broker: w.Router, ns: str) -> list[tuple[str, str]]:
    """A resync tick as PingSource sends it; its nudges for this namespace delivered by the
    Triggers. Returns (kind, `name step: reason`) per nudge."""
    world.sink.clear()
    answer = world.post("resync", w.event(PING, {"message": "resync"}))
    assert answer.status_code == 204, answer.text
    nudges: list[tuple[str, str]] = []
    for nudge in world.sink.of_type(ADAPTER_DRIFTED):
        data = nudge.get_data()
        assert isinstance(data, dict)
        ref = data["adapter"]
        if ref["namespace"] == ns:
            nudges.append((KINDS[ref["apiVersion"]], f"{ref['name']} {data['step']}: {data['reason']}"))
            broker.deliver(nudge)
    return nudges


def conditions(world: w.World, kind: Kind, ns: str, names: list[str]) -> dict[str, Any]:
    """The adapters by their Loaded condition (`status reason`), one message per kind of them,
    and the vLLM residencies the status records."""
    grouped: dict[str, list[str]] = {}
    messages: dict[str, str] = {}
    residency: set[str] = set()
    for name in names:
        obj = world.read(kind, ns, name)
        loaded = condition(obj, "Loaded")
        key = f"{loaded['status']} {loaded.get('reason', '')}"
        grouped.setdefault(key, []).append(name)
        messages.setdefault(key, str(loaded.get("message", "")))
        residency |= {str(s.get("residency")) for s in obj["status"].get("served") or []}
    found: dict[str, Any] = {"by_condition": grouped, "messages": messages}
    if kind is VLLM_ADAPTER:
        found["residency"] = sorted(residency)
    return found


def steady(world: w.World, broker: w.Router, ticks: int) -> dict[str, Any]:
    """Both targets at capacity under traffic; engine loads, nudges and traffic per tick."""
    ns = world.namespace()
    adapters = {"sglang": sglang_service(world, broker, ns), "vllm": vllm_deployment(world, broker, ns)}
    pods = {
        "sglang": _replicas(world, ns, f"{INFERENCE_SERVICE_LABEL}=chat"),
        "vllm": _replicas(world, ns, f"{MODEL_DEPLOYMENT_LABEL}=d1"),
    }
    first = {kind: _calls(pods[kind], "load") for kind in pods}
    loads: dict[str, list[int]] = {kind: [] for kind in pods}
    nudges: dict[str, list[int]] = {kind: [] for kind in pods}
    why: dict[int, list[str]] = {}
    seen: dict[str, Counter[str]] = {kind: Counter() for kind in pods}
    reloads = {kind: _engine(pods[kind], "reloads") for kind in pods}
    evictions = {kind: _engine(pods[kind], "evictions") for kind in pods}
    started = time.perf_counter()
    for index in range(ticks):
        before = {kind: _calls(pods[kind], "load") for kind in pods}
        for kind in pods:
            traffic(world.http, pods[kind], adapters[kind], seen[kind])
        nudged = tick(world, broker, ns)
        for kind in pods:
            loads[kind].append(_calls(pods[kind], "load") - before[kind])
            nudges[kind].append(sum(1 for k, _ in nudged if k == kind))
        if nudged:
            why[index + 1] = sorted(reason for _, reason in nudged)
    return {
        "namespace": ns,
        "first_loads": first,
        "loads_per_tick": loads,
        "nudges_per_tick": nudges,
        "nudged": why,
        "traffic": {kind: dict(sorted(seen[kind].items())) for kind in pods},
        # what the engines did for the traffic on their own: reads of an evicted adapter
        "engine_reloads_by_traffic": {kind: _engine(pods[kind], "reloads") - reloads[kind] for kind in pods},
        "engine_evictions": {kind: _engine(pods[kind], "evictions") - evictions[kind] for kind in pods},
        "loaded_now": {kind: [sorted(r.loaded) for r in pods[kind]] for kind in pods},
        "sglang": conditions(world, SGLANG_ADAPTER, ns, adapters["sglang"]),
        "vllm": conditions(world, VLLM_ADAPTER, ns, adapters["vllm"]),
        "ticks_s": round(time.perf_counter() - started, 2),
    }


def rolling_restart(world: w.World, broker: w.Router, replicas: int) -> dict[str, Any]:
    """Every pod of a `replicas`-pod ModelDeployment restarted in turn, each reloaded by its Pod
    update; the listings counted on every replica of the fleet."""
    ns = world.namespace()
    world.deployment(ns, "roll", replicas, ["a1"])
    world.workload.sync()
    world.ready_adapter(ns, "a1")
    broker.deliver(w.event(ADAPTER_READY, w.adapter_data(VLLM_ADAPTER, ns, "a1")))
    pods = world.pods(ns, "roll")
    assert all("a1" in world.workload.replica(ns, p).loaded for p in pods), "a1 not loaded everywhere"
    before = _calls(_fleet(world), "models")
    own = 0
    answers: Counter[int] = Counter()
    started = time.perf_counter()
    for pod in pods:
        replica = world.workload.replica(ns, pod)
        world.workload.restart(ns, pod, unhealthy_for_s=0.01, wait=True)
        assert not replica.loaded, f"{pod} kept its adapters over a restart"
        listed = replica.calls["models"]
        delivered = broker.deliver(w.apiserver_event("update", pod_object(world, ns, pod)), "reload")
        answers[delivered[0][2]] += 1
        own += replica.calls["models"] - listed
        assert "a1" in replica.loaded, f"{pod}: a1 not reloaded"
    return {
        "pods": replicas,
        "listings": _calls(_fleet(world), "models") - before,
        "listings_of_the_restarted_pod": own,
        "reload_answers": {str(k): v for k, v in sorted(answers.items())},
        "seconds": round(time.perf_counter() - started, 2),
    }


def run(smoke: bool) -> Result:
    ticks, replicas = (3, 5) if smoke else (20, 50)
    started = time.perf_counter()
    with w.world() as world:
        setup = time.perf_counter() - started
        broker = w.Router(world)
        state = steady(world, broker, ticks)
        restart = rolling_restart(world, broker, replicas)
    per_tick = state["loads_per_tick"]
    value = max(per_tick["sglang"] + per_tick["vllm"])
    listings = restart["listings"]
    met = value == 0 and listings == replicas and not broker.failed
    # each adapter left out and the Loaded condition it carries (`status reason`)
    left_out = {
        name: key
        for key, names in state["sglang"]["by_condition"].items()
        if not key.startswith("True")
        for name in names
    }
    nudges = sum(state["nudges_per_tick"]["sglang"] + state["nudges_per_tick"]["vllm"])
    return Result(
        name="capacity",
        title="engines at capacity: engine loads per resync tick at steady state",
        value=float(value),
        unit="loads/tick",
        target="0 at steady state; a rolling restart lists N engines",
        met=met,
        reference=float(BEFORE["sglang_loads_per_tick"]),
        details={
            "ticks": ticks,
            "sglang_loads_per_tick": per_tick["sglang"],
            "vllm_loads_per_tick": per_tick["vllm"],
            "steady": state,
            "sglang_left_out": left_out,
            "vllm_residency": state["vllm"]["residency"],
            "rolling_restart_pods": replicas,
            "rolling_restart_listings": listings,
            "rolling_restart": restart,
            "failed_deliveries": broker.failed,
            "before": BEFORE,
            "before_measured_on": "the in-memory fakes (tests/support/fakes.py), the code before capacity",
            "world_start_s": round(setup, 1),
            "seconds": round(time.perf_counter() - started, 1),
        },
        note=(
            "on the real API server, filer and engine stand-ins, every function over HTTP, traffic "
            f"to every adapter between ticks; SGLang {max(per_tick['sglang'])} and vLLM "
            f"{max(per_tick['vllm'])} loads/tick over {ticks} ticks ({nudges} nudges delivered); "
            f"{len(left_out)} SGLang adapters left out ({', '.join(sorted(set(left_out.values())))}); "
            f"rolling restart of {replicas} "
            f"pods: {listings} listings; 'before' measured on the fakes, code before capacity planning"
        ),
    )
