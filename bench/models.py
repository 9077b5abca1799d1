"""10. Model hot paths: a status of 1,000 files, an engine listing of 500 adapters.

Two paths where the model layer handles the most data per event:
- status: what stat does with models for one status write of an adapter whose status records
  1,000 files (LORAFLOW_STATUS_MAX_FILES): validate the stored object as a LoRAAdapter, build
  the new status from a listing (`stat.decide`: 1,000 files and 1,000 integrity entries), and
  serialize it to the JSON of the write;
- listing: read a vLLM `GET /v1/models` answer of 500 adapters (plus the base model's card)
  into name -> path (`engines.adapters_listed`).

Reference: the same work on the model layer as it was before pydantic (bench/reference/: the
records layer, kept verbatim), measured in the same run. Each round times both sides back to
back (in alternating order) and a figure's ratio is the median of the rounds' ratios: this
shared machine's speed drifts within minutes, and a pair measured together shares the drift.
Target: each path <= 1.3x the reference.
"""

from __future__ import annotations

import gc
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from bench.common import Result, median_of
from bench.reference import resources as ref
from devstack.standins.engines.vllm import VllmReplica
from functions import stat
from functions.adapters.engines import adapters_listed
from functions.adapters.storage import StoredFile
from functions.logic import phase
from functions.logic.quantity import format_bytes
from functions.resources.rackai import LoRAAdapter

NOW = datetime(2026, 11, 30, tzinfo=UTC)
NAMESPACE, MODEL, NAME = "team-a", "llama3-8b", "finance"
DIRECTORY = f"/loraadapters/{NAMESPACE}/{MODEL}/{NAME}/"
TARGET = 1.3


def listing(files: int) -> list[StoredFile]:
    return [StoredFile(f"{DIRECTORY}shard-{i:05d}.bin", 1_000_000 + i, f"{i:032x}") for i in range(files)]


def stored_adapter(files: int, declared: int) -> dict[str, Any]:
    """An adapter as the API server returns it after stat and verify recorded `files` files."""
    observed = listing(files)
    return {
        "apiVersion": "rackai.rackspace.com/v1alpha1",
        "kind": "LoRAAdapter",
        "metadata": {
            "name": NAME,
            "namespace": NAMESPACE,
            "uid": "3f6c1c1e-9a51-4c0e-8f4e-2b8f3b7f1a10",
            "resourceVersion": "123456",
            "generation": 3,
            "creationTimestamp": "2026-11-30T10:00:00Z",
            "labels": {"team": "finance", "loraflow.io/model": MODEL},
            "annotations": {"loraflow.io/owner": "ml-platform"},
            "finalizers": ["loraflow.io/unload"],
            "managedFields": [
                {
                    "manager": "loraflow-stat",
                    "operation": "Update",
                    "apiVersion": "rackai.rackspace.com/v1alpha1",
                    "time": "2026-11-30T10:00:01Z",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:status": {".": {}, "f:files": {}, "f:integrity": {".": {}}}},
                    "subresource": "status",
                }
            ],
        },
        "spec": {
            "model": MODEL,
            "displayName": "Finance Q&A",
            "integrity": {"md5": {f.path: f.md5 for f in observed[:declared]}},
            "tags": ["finance"],
        },
        "status": {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "IntegrityVerified",
                    "message": f"{declared} files verified",
                    "lastTransitionTime": "2026-11-30T10:00:02Z",
                    "observedGeneration": 3,
                }
            ],
            "files": [{"path": f.path, "size": f.size} for f in observed],
            "integrity": {"files": {f.path: {"md5": f.md5, "size": f.size} for f in observed}},
            "observedGeneration": 3,
            "phase": "Ready",
            "ready": True,
            "size": "953Mi",
            "storageRef": {"path": DIRECTORY},
            "uploadComplete": True,
            "usedBy": ["llama3-8b-prod"],
        },
    }


def models_answer(adapters: int) -> bytes:
    """A vLLM replica's `GET /v1/models` with `adapters` adapters loaded, as the engine stand-in
    writes it (vLLM's ModelList: the base model's card, then one per adapter, each with fields
    we do not read: object, created, owned_by, max_model_len, permission)."""
    loaded = {
        f"adapter-{i}": f"/mnt/seaweedfs/loraadapters/{NAMESPACE}/{MODEL}/adapter-{i}"
        for i in range(adapters)
    }
    replica = VllmReplica(served_model=MODEL, static_adapters=loaded)
    return json.dumps(replica.models_payload()).encode()


# -- the two sides ---------------------------------------------------------------------------
def status_now(obj: dict[str, Any], observed: list[StoredFile]) -> Callable[[], object]:
    """Validate, decide (production stat.decide), serialize: the production models."""

    def run() -> object:
        adapter = LoRAAdapter.model_validate(obj)
        return stat.decide(adapter, observed, NOW, len(observed)).to_wire()

    return run


def status_reference(obj: dict[str, Any], observed: list[StoredFile]) -> Callable[[], object]:
    """The same on the reference records: stat.decide's model work as it was written then."""

    def run() -> object:
        adapter = ref.LoRAAdapter.parse(obj)
        status = adapter.status or ref.LoRAAdapterStatus()
        files = stat.recorded(adapter, observed, len(observed))  # type: ignore[arg-type]
        total = sum(f.size for f in observed)
        integrity = (status.integrity or ref.IntegrityStatus()).replace(
            files={f.path: ref.FileStatus(md5=f.md5, size=f.size) for f in files} or None
        )
        phase_, ready = phase.summarize(status.conditions, bool(observed))  # type: ignore[arg-type]
        return status.replace(
            files=[ref.FileInfo(path=f.path, size=f.size) for f in files] or None,
            size=format_bytes(total),
            integrity=integrity,
            phase=phase_,
            ready=ready,
        ).to_json()

    return run


def per_call_s(action: Callable[[], object], calls: int) -> float:
    gc.collect()
    started = time.perf_counter()
    for _ in range(calls):
        action()
    return (time.perf_counter() - started) / calls


def paired(
    now: Callable[[], object], reference: Callable[[], object], rounds: int, calls: int
) -> dict[str, Any]:
    """Median per-call times of both sides and the median of the rounds' ratios."""
    now(), reference()  # first use builds whatever is built lazily (validators, shapes)
    samples: list[tuple[float, float]] = []
    for i in range(rounds):
        if i % 2:
            r = per_call_s(reference, calls)
            n = per_call_s(now, calls)
        else:
            n = per_call_s(now, calls)
            r = per_call_s(reference, calls)
        samples.append((n, r))
    return {
        "ms": round(median_of([n for n, _ in samples]) * 1000, 3),
        "reference_ms": round(median_of([r for _, r in samples]) * 1000, 3),
        "ratio": round(median_of([n / r for n, r in samples]), 2),
    }


def run(smoke: bool) -> Result:
    files, adapters = (100, 50) if smoke else (1000, 500)
    rounds, calls = (3, 2) if smoke else (31, 5)
    obj, observed = stored_adapter(files, declared=10), listing(files)
    body = models_answer(adapters)
    assert status_now(obj, observed)() == status_reference(obj, observed)(), "the two sides disagree"
    assert adapters_listed(body) == ref.adapters_listed(body), "the two listings disagree"
    figures = {
        "status": paired(status_now(obj, observed), status_reference(obj, observed), rounds, calls),
        "listing": paired(
            lambda: adapters_listed(body), lambda: ref.adapters_listed(body), rounds, calls * 4
        ),
    }
    worst = max(figures, key=lambda k: figures[k]["ratio"])
    met = all(f["ratio"] <= TARGET for f in figures.values())
    status, listed = figures["status"], figures["listing"]
    return Result(
        name="models",
        title=f"Model hot paths: a status of {files:,} files, an engine listing of {adapters} adapters",
        value=figures[worst]["ms"],
        unit="ms",
        reference=figures[worst]["reference_ms"],
        ratio=figures[worst]["ratio"],
        target=f"each <= {TARGET}x the records layer (bench/reference/), same run",
        met=met,
        details={"figures": figures, "files": files, "adapters": adapters, "rounds": rounds, "calls": calls},
        note=(
            f"highest ratio: {worst}; status (validate + stat.decide + serialize) {status['ms']:.2f} ms vs "
            f"{status['reference_ms']:.2f} ms ({status['ratio']:.2f}x); listing {listed['ms']:.2f} ms vs "
            f"{listed['reference_ms']:.2f} ms ({listed['ratio']:.2f}x)"
        ),
    )
