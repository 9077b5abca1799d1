"""10. Model hot paths: validating a status of 1,000 files, and an engine listing of 500
adapters, each against the JSON parse alone.

Where the model layer handles the most data per event:
- status: what stat and verify do with an adapter read from the API server whose status records
  1,000 files (LORAFLOW_STATUS_MAX_FILES): decode the answer's bytes (the Kubernetes client's
  `decode`, pydantic's JSON parser) and validate the object as a LoRAAdapter (`stored`). The
  whole status path (that, `stat.decide` over 1,000 files, and the write's JSON) is reported
  beside it;
- listing: read a vLLM `GET /v1/models` answer of 500 adapters (plus the base model's card)
  into name -> path (`engines.adapters_listed`).

Reference: `json.loads` of the same bytes, nothing else (what any client pays to read them),
measured in the same run. Each round times both sides back to back (in alternating order) and
a figure's ratio is the median of the rounds' ratios: this shared machine's speed drifts within
minutes, and a pair measured together shares the drift.
Target: reported (no target): what validation costs over the parse.
"""

from __future__ import annotations

import gc
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from bench.common import Result, median_of
from devstack.standins.engines.vllm import VllmReplica
from functions import stat
from functions.adapters.engines import adapters_listed
from functions.adapters.kube import decode
from functions.edge.inputs import stored
from functions.ports import StoredFile
from functions.resources.rackai import LoRAAdapter

NOW = datetime(2026, 11, 30, tzinfo=UTC)
NAMESPACE, MODEL, NAME = "team-a", "llama3-8b", "finance"
DIRECTORY = f"/loraadapters/{NAMESPACE}/{MODEL}/{NAME}/"


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
def validated(raw: bytes) -> Callable[[], object]:
    """The adapter's bytes decoded and validated as the functions read it."""
    return lambda: stored(LoRAAdapter, decode(raw))


def status_path(raw: bytes, observed: list[StoredFile]) -> Callable[[], object]:
    """Decode, validate, decide (production stat.decide), serialize: one status write's model work."""

    def run() -> object:
        adapter = stored(LoRAAdapter, decode(raw))
        return stat.decide(adapter, observed, NOW, len(observed)).to_wire()

    return run


def parsed(raw: bytes) -> Callable[[], object]:
    """The reference: the JSON parse alone."""
    return lambda: json.loads(raw)


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
    observed = listing(files)
    raw = json.dumps(stored_adapter(files, declared=10)).encode()
    body = models_answer(adapters)
    figures = {
        "status": paired(validated(raw), parsed(raw), rounds, calls),
        "status_path": paired(status_path(raw, observed), parsed(raw), rounds, calls),
        "listing": paired(lambda: adapters_listed(body), parsed(body), rounds, calls * 4),
    }
    status, path, listed = figures["status"], figures["status_path"], figures["listing"]
    return Result(
        name="models",
        title=(
            f"Model hot paths: validating a status of {files:,} files, "
            f"an engine listing of {adapters} adapters"
        ),
        value=status["ms"],
        unit="ms",
        reference=status["reference_ms"],
        ratio=status["ratio"],
        target="reported (no target): validation against the JSON parse alone (json.loads), same run",
        met=True,
        details={
            "figures": figures,
            "files": files,
            "adapters": adapters,
            "status_bytes": len(raw),
            "rounds": rounds,
            "calls": calls,
        },
        note=(
            f"status of {len(raw) / 1024:.0f} KiB decoded and validated {status['ms']:.2f} ms vs json.loads "
            f"{status['reference_ms']:.2f} ms ({status['ratio']:.2f}x); "
            f"with stat.decide and the write's JSON "
            f"{path['ms']:.2f} ms ({path['ratio']:.2f}x); listing of {adapters} {listed['ms']:.2f} ms vs "
            f"json.loads {listed['reference_ms']:.2f} ms ({listed['ratio']:.2f}x)"
        ),
    )
