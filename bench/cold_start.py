"""4. Cold start: process start to the first event answered, per function, against a bare
functions-framework function answering the same request.

Each function runs as `python -m functions_framework --target <fn>` (as in the container)
against the stand-ins; the clock starts before the process is spawned and stops at the first
answer to a real event (one that needs a Kubernetes read or, for ingest, the decode of a real
SeaweedFS notification; its clients are built on that first event). Reference: bench/_bare.py
(`return ("", 204)`) under the same launcher, answering the same request; bench/_floor.py (our
libraries imported, nothing of ours) shows which part of the gap is the libraries'.

Each launch is paired with a bare launch just before it, and a function's ratio is the median
of its pairs' ratios: on this shared 2-core machine the bare start alone drifts from ~230 to
~330 ms within minutes, and unpaired medians of the two sides moved the ratio by 0.3.

Both run as in the functions' image: in `.venv-runtime` (`make bench` builds it with the
[project] dependencies only, as the Dockerfile installs them; without it, this venv) and from
byte-compiled sources (pip compiles what it installs; this machine sets PYTHONDONTWRITEBYTECODE,
which would otherwise make every start compile our modules again).
Target: <= 2.0x the bare function, and <= 800 ms. (Until pydantic returned it was 1.5x: a
Knative scale from zero costs 1-4 s of scheduling, image pull and container start before the
process starts, so the process's share matters little; bench/pipeline_cold.py measures what
the steps' starts add to a whole pipeline, and docs/operations.md when to keep them warm.)
"""

from __future__ import annotations

import base64
import compileall
import sys
from typing import Any

import httpx
from cloudevents.http import CloudEvent

from bench import world as w
from bench.common import Result, median_of, timed
from devstack.ports import free_port
from devstack.processes import adopt_orphans, kill_tree
from events import catalog
from events.domain import ADAPTER_ADMITTED, ADAPTER_READY, ADAPTER_STAT_COMPLETED
from events.external import AWS_SQS, PING
from functions.resources.kinds import VLLM_ADAPTER

BARE = w.ROOT / "bench" / "_bare.py"
FLOOR = w.ROOT / "bench" / "_floor.py"
MAIN = w.ROOT / "main.py"
FUNCTIONS = ("admit", "stat", "verify", "load", "reload", "unload", "resync", "ingest")
RUNTIME_PYTHON = w.ROOT / ".venv-runtime" / "bin" / "python"
RATIO_TARGET = 2.0
MS_TARGET = 800


def interpreter() -> tuple[str, str]:
    """The image's environment when `make bench` built it, else this one (with the dev extras:
    httpx then imports its command line, rich and pygments, ~45 ms)."""
    if RUNTIME_PYTHON.exists():
        return str(RUNTIME_PYTHON), ".venv-runtime (the image's dependencies)"
    return sys.executable, "the dev venv (.venv-runtime absent)"


def byte_compile() -> None:
    """What `pip install .` does in the image: .pyc for the modules a start imports."""
    for package in ("functions", "events"):
        compileall.compile_dir(w.ROOT / package, quiet=1)
    compileall.compile_file(w.ROOT / "main.py", quiet=1)
    for source in (MAIN, BARE, FLOOR):
        compileall.compile_file(source, quiet=1)


def events(ns: str) -> dict[str, CloudEvent]:
    missing_adapter = {
        "apiVersion": VLLM_ADAPTER.api_version,
        "kind": "LoRAAdapter",
        "metadata": {"name": "gone", "namespace": ns, "generation": 1},
        "spec": {"model": w.MODEL},
    }
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "gone", "namespace": ns}}
    ref = w.adapter_data(VLLM_ADAPTER, ns, "gone")
    return {
        "admit": w.apiserver_event("add", missing_adapter),
        "stat": w.event(ADAPTER_ADMITTED, {**ref, "generation": 1}),
        "verify": w.event(ADAPTER_STAT_COMPLETED, {**ref, "files": 0, "size": "0"}),
        "load": w.event(ADAPTER_READY, ref),
        "reload": w.apiserver_event("update", pod),
        "unload": w.apiserver_event("update", missing_adapter),
        "resync": w.event(PING, {"message": "resync"}),
        "ingest": sqs_notification(),
    }


def sqs_notification() -> CloudEvent:
    """The catalog's sample aws-sqs event: SeaweedFS's protobuf EventNotification, which ingest
    decodes and answers with a file.changed event."""
    sample = catalog.sample(catalog.BY_TYPE[AWS_SQS])
    attributes = {k: str(v) for k, v in sample.items() if k != "data_base64"}
    return CloudEvent(attributes, base64.b64decode(str(sample["data_base64"])))


def _cold(http: httpx.Client, python: str, target: str, source: Any, event: CloudEvent) -> tuple[float, int]:
    port = free_port()
    statuses: list[int] = []
    processes: list[Any] = []

    def start_and_answer() -> None:
        processes.append(w.spawn(target, source, port, python=python))
        statuses.append(w.first_answer(http, f"http://127.0.0.1:{port}/", event).status_code)

    try:
        elapsed = timed(start_and_answer)
    finally:
        # Stopping is not part of a cold start, and a graceful one would wait for the server's
        # shutdown: time better spent on more rounds. Nothing is left to flush.
        for process in processes:
            kill_tree(process)
    return elapsed, statuses[0]


def run(smoke: bool) -> Result:
    rounds = 1 if smoke else 15  # the highest of 8 medians: each needs many pairs to stay steady
    functions = ("stat", "resync") if smoke else FUNCTIONS
    python, environment = interpreter()
    byte_compile()
    adopt_orphans()
    with w.world(functions=False) as world:
        catalog = events(world.namespace())
        launches = {"floor": (FLOOR, catalog["stat"]), **{name: (MAIN, catalog[name]) for name in functions}}
        pairs: dict[str, list[tuple[float, float, int]]] = {name: [] for name in launches}
        with httpx.Client(timeout=30) as http:
            _cold(http, python, "bare", BARE, catalog["stat"])  # warm the OS caches once
            # Each launch is paired with a bare one just before it and compared with that one:
            # this shared machine's slow spells last seconds and drift by 1.5x, and a pair
            # launched back to back shares them.
            for _ in range(rounds):
                for name, (source, event) in launches.items():
                    bare_s, _ = _cold(http, python, "bare", BARE, catalog["stat"])
                    took, status = _cold(http, python, name, source, event)
                    pairs[name].append((bare_s, took, status))
    bare = median_of([b for runs in pairs.values() for b, _, _ in runs]) * 1000
    floor = _summary(pairs.pop("floor"), 0.0)
    per_function = {name: _summary(runs, floor["median_ms"]) for name, runs in pairs.items()}
    worst_name = max(per_function, key=lambda name: per_function[name]["ratio"])
    ratio = per_function[worst_name]["ratio"]
    slowest = max(e["median_ms"] for e in per_function.values())
    met = (
        ratio <= RATIO_TARGET
        and slowest <= MS_TARGET
        and all(e["status"] < 500 for e in per_function.values())
    )
    return Result(
        name="cold_start",
        title="Cold start: process start to first event answered (highest ratio)",
        value=per_function[worst_name]["median_ms"],
        unit="ms",
        reference=round(bare, 1),
        ratio=ratio,
        target=f"<= {RATIO_TARGET}x bare functions-framework and <= {MS_TARGET} ms",
        met=met,
        details={
            "per_function": per_function,
            "bare_ms": round(bare, 1),
            "floor": floor,
            "environment": environment,
            "rounds": rounds,
            "method": "each launch paired with a bare one just before it; ratio: median of the pairs'",
        },
        note=_note(worst_name, per_function, bare, floor, slowest, met),
    )


def _summary(runs: list[tuple[float, float, int]], floor_ms: float) -> dict[str, Any]:
    """Median time and median paired ratio of one launch's rounds."""
    median_ms = median_of([t for _, t, _ in runs]) * 1000
    return {
        "median_ms": round(median_ms, 1),
        "ratio": round(median_of([t / b for b, t, _ in runs]), 2),
        "over_floor_ms": round(median_ms - floor_ms, 1) if floor_ms else None,
        "status": runs[-1][2],
    }


def _note(
    worst: str,
    per_function: dict[str, dict[str, Any]],
    bare: float,
    floor: dict[str, Any],
    slowest: float,
    met: bool,
) -> str:
    figures = ", ".join(f"{n} {e['median_ms']:.0f} ms ({e['ratio']:.2f}x)" for n, e in per_function.items())
    note = (
        f"highest ratio: {worst}; {figures}; bare {bare:.0f} ms; the libraries' floor (bench/_floor.py: "
        f"httpx and pydantic imported, nothing of ours) {floor['median_ms']:.0f} ms = "
        f"{floor['ratio']:.2f}x bare"
    )
    if not met:
        over = [n for n, e in per_function.items() if e["ratio"] > RATIO_TARGET or e["status"] >= 500]
        failing = ", ".join(over) or "none"
        note += f"; NOT met: over {RATIO_TARGET}x or failing: {failing}; slowest {slowest:.0f} ms"
    return note
