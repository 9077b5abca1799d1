"""5. Kubernetes API cost: requests per adapter lifecycle (create -> Ready -> loaded in N
replicas), counted by the Kubernetes stand-in, for N = 1, 10, 100.

The adapter's files are in storage and a ModelDeployment of N replicas names it; after the
create, the ApiServerSource `add` event goes to admit and every reply follows the Triggers
(synchronously, without the broker): admit -> stat -> verify -> load. Every request the
functions make is counted (the stand-in's counters, reset after the setup).
Target: no per-replica Kubernetes requests beyond one list of pods (count independent of N).
"""

from __future__ import annotations

from collections import Counter

from bench import world as w
from bench.common import Result
from functions.resources.kinds import VLLM_ADAPTER


def _lifecycle(
    world: w.World, replicas: int
) -> tuple[int, Counter[tuple[str, str]], list[tuple[str, str, int]]]:
    ns = world.namespace()
    world.deployment(ns, "d1", replicas, ["a1"])
    world.workload.sync()
    md5s = world.put_files(ns, "a1")
    world.kube.reset_counters()
    created = world.create(VLLM_ADAPTER, ns, {"metadata": {"name": "a1"}, "spec": world.spec(md5s)})
    deliveries = w.route(world, w.apiserver_event("add", created))
    count, by_key = world.kube.request_count, Counter(world.kube.requests)
    obj = world.read(VLLM_ADAPTER, ns, "a1")
    conditions = {c["type"]: c["status"] for c in obj["status"]["conditions"]}
    assert conditions.get("Ready") == "True" and conditions.get("Loaded") == "True", (conditions, deliveries)
    replicas_with = [
        r for key, r in world.workload.fleet.items() if key.startswith(ns + "/") and "a1" in r.loaded
    ]
    assert len(replicas_with) == replicas
    return count, by_key, deliveries


def run(smoke: bool) -> Result:
    sizes = (1, 3) if smoke else (1, 10, 100)
    counts: dict[int, int] = {}
    breakdown: dict[int, dict[str, int]] = {}
    with w.world() as world:
        _lifecycle(world, 1)  # warm-up (clients, discovery)
        deliveries: list[tuple[str, str, int]] = []
        for n in sizes:
            count, by_key, deliveries = _lifecycle(world, n)
            counts[n] = count
            breakdown[n] = {f"{verb} {resource}": c for (verb, resource), c in sorted(by_key.items())}
    small, large = sizes[0], sizes[-1]
    per_replica = (counts[large] - counts[small]) / (large - small)
    return Result(
        name="kube_cost",
        title=f"Kubernetes API requests per adapter lifecycle, N = {', '.join(map(str, sizes))} replicas",
        value=float(counts[large]),
        unit=f"requests at N={large}",
        reference=float(counts[small]),
        ratio=round(counts[large] / counts[small], 3),
        target="no per-replica requests (growth 0 per replica)",
        met=per_replica == 0,
        details={
            "requests_by_replicas": counts,
            "growth_per_replica": per_replica,
            "breakdown": breakdown,
            "deliveries": [f"{fn} <- {t.rsplit('.', 2)[-2]}: {s}" for fn, t, s in deliveries],
        },
        note=f"reference = N={small}; counts {counts}; {per_replica:g} extra requests per replica",
    )
