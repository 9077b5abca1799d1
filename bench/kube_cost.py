"""5. Kubernetes API cost: requests per adapter lifecycle (create -> Ready -> loaded in N
replicas), counted by the real kube-apiserver's audit log, for N = 1, 10, 100.

The adapter's files are in storage and a ModelDeployment of N replicas names it; after the
create, the ApiServerSource `add` event goes to admit and every reply follows the Triggers
(synchronously, without the broker): admit -> stat -> verify -> load. The referee is the API
server: every request the functions' ServiceAccounts made between the create and the last
answer, read from its audit log, by function (load's count is the requests per load) and by
verb and resource. The servers' CPU over the lifecycle (kube-apiserver and etcd, from /proc)
is reported beside it, less what they spend idle (measured over 3 s after a warm-up); the workload's
watches share that server, so it is an upper bound.
Target: no per-replica Kubernetes requests (the count independent of N).
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from bench import world as w
from bench.common import Result
from bench.cpu import idle_server_cpu, net, server_cpu
from devstack.kubernetes import FUNCTIONS_USERS
from functions.resources.kinds import VLLM_ADAPTER


def _lifecycle(world: w.World, replicas: int, idle: dict[str, float]) -> dict[str, Any]:
    ns = world.namespace()
    world.deployment(ns, "d1", replicas, ["a1"])
    world.workload.sync()
    md5s = world.put_files(ns, "a1")
    mark = world.kube.audit.mark()
    cpu, began = server_cpu(world.kube.plane), time.perf_counter()
    created = world.create(VLLM_ADAPTER, ns, {"metadata": {"name": "a1"}, "spec": world.spec(md5s)})
    deliveries = w.route(world, w.apiserver_event("add", created))
    spent = {k: v - cpu.get(k, 0.0) for k, v in server_cpu(world.kube.plane).items()}
    spent = net(spent, idle, time.perf_counter() - began)
    ours = [r for r in world.kube.audit.since(mark) if r.user.startswith(FUNCTIONS_USERS)]
    obj = world.read(VLLM_ADAPTER, ns, "a1")
    conditions = {c["type"]: c["status"] for c in obj["status"]["conditions"]}
    assert conditions.get("Ready") == "True" and conditions.get("Loaded") == "True", (conditions, deliveries)
    replicas_with = [
        r for key, r in world.workload.fleet.items() if key.startswith(ns + "/") and "a1" in r.loaded
    ]
    assert len(replicas_with) == replicas
    by_key = Counter(f"{r.verb} {r.key[1]}" for r in ours)
    by_function = Counter(r.user.removeprefix(FUNCTIONS_USERS + "loraflow-") for r in ours)
    return {
        "requests": len(ours),
        "by_function": dict(sorted(by_function.items())),
        "breakdown": dict(sorted(by_key.items())),
        "not_2xx": sum(1 for r in ours if not 200 <= r.code < 300),
        "server_cpu_ms": {k: round(v * 1000, 1) for k, v in spent.items()},
        "deliveries": [f"{fn} <- {t.rsplit('.', 2)[-2]}: {s}" for fn, t, s in deliveries],
    }


def run(smoke: bool) -> Result:
    sizes = (1, 3) if smoke else (1, 10, 100)
    measured: dict[int, dict[str, Any]] = {}
    with w.world() as world:
        _lifecycle(world, 1, {})  # warm-up (clients, discovery)
        idle = idle_server_cpu(world.kube.plane)  # after it: the servers are busy a while after they start
        for n in sizes:
            measured[n] = _lifecycle(world, n, idle)
    counts = {n: m["requests"] for n, m in measured.items()}
    small, large = sizes[0], sizes[-1]
    per_replica = (counts[large] - counts[small]) / (large - small)
    top = measured[large]
    loads = top["by_function"].get("load", 0)
    server_ms = sum(top["server_cpu_ms"].values())
    return Result(
        name="kube_cost",
        title=f"Kubernetes API requests per adapter lifecycle, N = {', '.join(map(str, sizes))} replicas",
        value=float(counts[large]),
        unit=f"requests at N={large}",
        reference=float(counts[small]),
        ratio=round(counts[large] / counts[small], 3),
        target="no per-replica requests (growth 0 per replica), counted by the API server's audit log",
        met=per_replica == 0,
        details={
            "requests_by_replicas": counts,
            "growth_per_replica": per_replica,
            "sizes": {str(n): m for n, m in measured.items()},
        },
        note=(
            f"reference = N={small}; audit-log counts {counts}; {per_replica:g} extra requests per replica; "
            f"by function at N={large}: "
            + ", ".join(f"{fn} {c}" for fn, c in top["by_function"].items())
            + f" ({loads} per load); the servers' CPU over the lifecycle {server_ms:.0f} ms "
            f"(kube-apiserver {top['server_cpu_ms'].get('kube-apiserver', 0):.0f}, "
            f"etcd {top['server_cpu_ms'].get('etcd', 0):.0f})"
        ),
    )
