"""4. Cold start: process start to the first event answered, per function, against a bare
functions-framework function answering the same request.

Each function runs as `python -m functions_framework --target <fn>` (as in the container)
against the stand-ins; the clock starts before the process is spawned and stops at the first
answer to a real event (one that needs a Kubernetes read or, for ingest, a decode; its clients
are built on that first event). Reference: bench/_bare.py (`return ("", 204)`) under the same
launcher, answering the same request.
Target: <= 1.5x the bare function, and <= 600 ms.
"""

from __future__ import annotations

import signal
from typing import Any

import httpx
from cloudevents.http import CloudEvent

from bench import world as w
from bench.common import Result, median_of, timed
from events.domain import ADAPTER_ADMITTED, ADAPTER_READY, ADAPTER_STAT_COMPLETED
from events.external import PING
from functions.resources.kinds import VLLM_ADAPTER

BARE = w.ROOT / "bench" / "_bare.py"


def events(ns: str) -> dict[str, CloudEvent]:
    missing_adapter = {
        "apiVersion": VLLM_ADAPTER.api_version,
        "kind": "LoRAAdapter",
        "metadata": {"name": "gone", "namespace": ns, "generation": 1},
        "spec": {"model": w.MODEL},
    }
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "gone", "namespace": ns}}
    ref = w.adapter_data(VLLM_ADAPTER, ns, "gone")
    path = f"/loraadapters/{ns}/{w.MODEL}/gone/adapter_config.json"
    return {
        "admit": w.apiserver_event("add", missing_adapter),
        "stat": w.event(ADAPTER_ADMITTED, {**ref, "generation": 1}),
        "verify": w.event(ADAPTER_STAT_COMPLETED, {**ref, "files": 0, "size": "0"}),
        "load": w.event(ADAPTER_READY, ref),
        "reload": w.apiserver_event("update", pod),
        "unload": w.apiserver_event("update", missing_adapter),
        "resync": w.event(PING, {"message": "resync"}),
        "ingest": w.event(
            "dev.knative.eventing.aws-sqs",
            {"Message": "{}", "Body": "{}", "path": path},
        ),
    }


def _cold(http: httpx.Client, target: str, source: Any, event: CloudEvent) -> tuple[float, int]:
    port = w.free_port()
    statuses: list[int] = []
    processes: list[Any] = []

    def start_and_answer() -> None:
        processes.append(w.spawn(target, source, port))
        statuses.append(w.first_answer(http, f"http://127.0.0.1:{port}/", event).status_code)

    try:
        elapsed = timed(start_and_answer)
    finally:
        # stopping is not part of a cold start: gunicorn's graceful shutdown alone took ~2.3 s,
        # which the first version of this benchmark counted on both sides
        for process in processes:
            process.send_signal(signal.SIGINT)  # gunicorn: quick shutdown (SIGTERM is graceful)
            process.wait(10)
    return elapsed, statuses[0]


def run(smoke: bool) -> Result:
    repeats = 1 if smoke else 3
    functions = (
        ("stat", "resync")
        if smoke
        else ("admit", "stat", "verify", "load", "reload", "unload", "resync", "ingest")
    )
    per_function: dict[str, dict[str, Any]] = {}
    with w.world(functions=False) as world:
        ns = world.namespace()
        catalog = events(ns)
        with httpx.Client(timeout=30) as http:
            _cold(http, "bare", BARE, catalog["stat"])  # warm the OS caches once
            bare = [_cold(http, "bare", BARE, catalog["stat"])[0] for _ in range(repeats * 2)]
            for name in functions:
                runs = [_cold(http, name, w.ROOT / "main.py", catalog[name]) for _ in range(repeats)]
                per_function[name] = {
                    "median_ms": round(median_of([t for t, _ in runs]) * 1000, 1),
                    "status": runs[-1][1],
                }
    reference = median_of(bare) * 1000
    worst_name = max(per_function, key=lambda n: per_function[n]["median_ms"])
    worst = per_function[worst_name]["median_ms"]
    ratio = worst / reference
    for entry in per_function.values():
        entry["ratio"] = round(entry["median_ms"] / reference, 2)
    answered = all(e["status"] < 500 for e in per_function.values())
    return Result(
        name="cold_start",
        title="Cold start: process start to first event answered (slowest function)",
        value=round(worst, 1),
        unit="ms",
        reference=round(reference, 1),
        ratio=round(ratio, 2),
        target="<= 1.5x bare functions-framework and <= 600 ms",
        met=ratio <= 1.5 and worst <= 600 and answered,
        details={"per_function": per_function, "bare_ms": [round(b * 1000, 1) for b in bare]},
        note=f"slowest: {worst_name}; "
        + ", ".join(f"{n} {e['median_ms']:.0f}" for n, e in per_function.items())
        + " ms"
        + (
            ""
            if ratio <= 1.5 and worst <= 600
            else "; NOT met: the kubernetes package is no longer imported (thin httpx REST client, "
            "was ~0.5 s); what the others add over ingest is mostly imports on the first event: "
            "httpx (its __init__ imports its CLI, rich + pygments, ~75 ms), the functions' pydantic "
            "resource models (~80 ms) and the engine/storage adapters; ingest is "
            f"{per_function.get('ingest', {}).get('ratio', '-')}x"
        ),
    )
