"""11. Cold pipeline: the last file's notification to Ready and loaded in 3 replicas, with admit,
stat, verify and load scaled to zero, beside the same with them running.

The embedded stack of benchmark 1 (filer webhook -> ingest -> broker -> stat -> verify ->
load, each step a functions-framework process, the ApiServerSource stand-in turning our status
writes into events), with every function behind an activator (bench/activator.py): a function
scaled to zero is started by the first event that reaches it, which is held until its
readiness probe passes, as Knative's activator holds a request for a Service at min-scale 0.
Cold: admit, stat, verify and load are stopped after the adapter is set up, so each starts on
its first event (stat, verify and load one after the other on the path to Loaded; admit, woken
by stat's status write, beside them, sharing the machine's two cores). ingest and the other
steps stay running. Warm: the same with nothing stopped. Cold and warm runs alternate, a fresh
adapter each. The functions run in the image's environment (.venv-runtime, byte-compiled) as
in benchmark 4. A cluster adds scheduling, image pull and container start (1-4 s per pod)
to every cold step; this measures what our code and its libraries cost.
Reported (no target); every cold run must have started each of the four once.
"""

from __future__ import annotations

from typing import Any

from bench import cold_start
from bench.activator import ActivatedStack
from bench.common import Result, median_of
from bench.upload_latency import Probe, create_deployment, measure_one, ready_pods
from devstack.processes import adopt_orphans
from tests.support.wait import eventually

COLD = ("admit", "stat", "verify", "load")
REPLICAS = 3


def _one(stack: ActivatedStack, probe: Probe, name: str, cold: bool) -> dict[str, Any]:
    """Benchmark 1's measurement, with admit, stat, verify and load stopped first when `cold`."""
    host = stack.activated
    starts = {n: host.revisions[n].starts for n in COLD}

    def scale_to_zero() -> None:
        starts.update({n: host.revisions[n].starts for n in COLD})
        if cold:
            host.scale_to_zero(COLD)

    ready_s, served_s = measure_one(stack, probe, name, before_last=scale_to_zero, timeout=60)
    return {
        "served_s": served_s,
        "ready_s": ready_s,
        "started": {n: host.revisions[n].starts - starts[n] for n in COLD},
    }


def run(smoke: bool) -> Result:
    repeats = 1 if smoke else 7
    python, environment = cold_start.interpreter()
    cold_start.byte_compile()
    adopt_orphans()
    runs: dict[str, list[dict[str, Any]]] = {"cold": [], "warm": []}
    stack = ActivatedStack(ping_period=None, python=python)
    with stack:
        deployment = f"d{REPLICAS}"
        names = [f"c{i}" for i in range(2 * repeats + 1)]  # +1: a warm-up, dropped
        create_deployment(stack, REPLICAS, names)
        eventually(
            lambda: ready_pods(stack, deployment) == REPLICAS, 60, what="replicas Ready", interval=0.05
        )
        stack.settle(timeout=30, quiet=0.3)
        probe = Probe(stack, deployment)
        _one(stack, probe, names[0], cold=False)
        for i, name in enumerate(names[1:]):
            mode = "cold" if i % 2 == 0 else "warm"
            runs[mode].append(_one(stack, probe, name, cold=mode == "cold"))
        # what a pod kept warm holds: the function's processes (the server's parent and worker)
        # after serving the runs above
        memory = {n: round(stack.activated.revisions[n].memory_mib(), 1) for n in COLD}
    cold = median_of([r["served_s"] for r in runs["cold"]]) * 1000
    warm = median_of([r["served_s"] for r in runs["warm"]]) * 1000
    each_started = all(set(r["started"].values()) == {1} for r in runs["cold"])
    stayed_warm = all(set(r["started"].values()) == {0} for r in runs["warm"])
    cold_ready = median_of([r["ready_s"] for r in runs["cold"]]) * 1000
    warm_ready = median_of([r["ready_s"] for r in runs["warm"]]) * 1000
    return Result(
        name="pipeline_cold",
        title=f"Cold pipeline: notification to Ready and loaded, {', '.join(COLD)} started by their events",
        value=round(cold, 1),
        unit="ms",
        reference=round(warm, 1),
        ratio=round(cold / warm, 1),
        target="reported (no target); each of the four started once per cold run",
        met=each_started and stayed_warm,
        details={
            "cold_ms": [round(r["served_s"] * 1000, 1) for r in runs["cold"]],
            "warm_ms": [round(r["served_s"] * 1000, 1) for r in runs["warm"]],
            "cold_ready_median_ms": round(cold_ready, 1),
            "warm_ready_median_ms": round(warm_ready, 1),
            "started_per_cold_run": [r["started"] for r in runs["cold"]],
            "pss_mib_after_runs": memory,
            "environment": environment,
            "repeats": repeats,
        },
        note=(
            f"cold {cold:.0f} ms (Ready at {cold_ready:.0f} ms) vs warm {warm:.0f} ms (Ready at "
            f"{warm_ready:.0f} ms): {cold - warm:.0f} ms for three cold starts in series (stat, verify, "
            f"load) with admit's beside them; reference = warm, the same stack with nothing stopped"
        ),
    )
