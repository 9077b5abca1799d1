"""resync at scale: thousands of adapters, paginated lists, nudges for exactly what drifted.

2,000 vllm adapters over 40 ModelDeployments (one Ready replica each) and 200 sglang
adapters over 4 InferenceServices are created in the real API server, several at a time, with
the status the steps leave (each Ready/Available, used, Loaded, present in its pod's engine),
then a known set drifts:
vllm: missing from its pod (load), stale usedBy (load), a new generation not yet observed
(admit), loaded where no deployment names it (unload), deleted with our finalizer still set
(unload); sglang: missing from its pod (load), never admitted (admit). One ping to resync
(over HTTP, functions-framework) must publish exactly those nudges, after paginated lists.
"""

from __future__ import annotations

import json
import math
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from devstack.standins.engines.base import LoadedAdapter
from events.domain import STEP_EXTENSION
from events.external import PING
from functions.logic.facts import file_set
from functions.resources.kinds import (
    FINALIZER,
    INFERENCE_SERVICE,
    MODEL_DEPLOYMENT,
    SGLANG_ADAPTER,
    VLLM_ADAPTER,
    Kind,
)
from tests.support.convergence import record_result
from tests.support.testbed import Testbed

VLLM_ADAPTERS, DEPLOYMENTS = 2000, 40
SGLANG_ADAPTERS, SERVICES = 200, 4
PAGE = 500  # LORAFLOW_LIST_PAGE_SIZE's default
MODEL = "m1"
STAMP = "2026-01-01T00:00:00Z"


def _cond(type_: str, reason: str, status: str = "True") -> dict[str, str]:
    return {"type": type_, "status": status, "reason": reason, "message": "ok", "lastTransitionTime": STAMP}


def _create(
    http: Any, kind: Kind, ns: str, body: dict[str, object], status: dict[str, object] | None
) -> None:
    path = f"/apis/{kind.group}/{kind.version}/namespaces/{ns}/{kind.plural}"
    http.post(path, json={"apiVersion": kind.api_version, "kind": kind.kind, **body}).raise_for_status()
    if status is not None:
        name = body["metadata"]["name"]  # type: ignore[index]
        patch = {"status": status}
        headers = {"Content-Type": "application/merge-patch+json"}
        http.patch(f"{path}/{name}/status", content=json.dumps(patch), headers=headers).raise_for_status()


def _put_all(
    world: Testbed, kind: Kind, ns: str, items: list[tuple[dict[str, object], dict[str, object] | None]]
) -> None:
    """Many objects at once: eight clients at a time, as a bulk import would."""
    workers = 8
    clients = [world.kube.plane.http() for _ in range(workers)]
    try:
        with ThreadPoolExecutor(workers) as pool:
            done = [
                pool.submit(_create, clients[i % workers], kind, ns, body, status)
                for i, (body, status) in enumerate(items)
            ]
            for future in done:
                future.result()
    finally:
        for client in clients:
            client.close()


def _count(world: Testbed, kind: Kind) -> int:
    found = world.custom.list_cluster_custom_object(kind.group, kind.version, kind.plural)
    return len(found.get("items") or [])


def test_resync_nudges_exactly_the_drifted_over_thousands(world: Testbed) -> None:
    ns = world.namespace()
    started = time.monotonic()
    owner = {f"a{i:04d}": f"d{i % DEPLOYMENTS:02d}" for i in range(VLLM_ADAPTERS)}
    names = sorted(owner)
    for d in range(DEPLOYMENTS):
        md = f"d{d:02d}"
        spec = {"model": MODEL, "replicas": 1, "loraAdapters": sorted(a for a, o in owner.items() if o == md)}
        world.create(
            MODEL_DEPLOYMENT,
            ns,
            {"metadata": {"name": md}, "spec": spec},
        )
    isvc_of = {f"s{i:03d}": f"svc{i % SERVICES}" for i in range(SGLANG_ADAPTERS)}
    for s in range(SERVICES):
        world.create(
            INFERENCE_SERVICE,
            ns,
            {"metadata": {"name": f"svc{s}"}, "spec": {"runtime": "sglang", "replicas": 1}},
        )
    world.workload.sync()

    # the known drifts (every 97th/89th/... adapter, disjoint)
    missing = set(names[1::97])
    stale_used = set(names[2::89]) - missing
    stale_gen = set(names[3::83]) - missing - stale_used
    deleting = set(names[4::211]) - missing - stale_used - stale_gen
    surplus = {names[5], names[6]}  # also loaded in the pod of the next deployment
    v2_names = sorted(isvc_of)
    v2_missing = set(v2_names[1::23])
    v2_unadmitted = set(v2_names[2::31]) - v2_missing

    def pod_of(label: str) -> str:
        (pod,) = [p["metadata"]["name"] for p in world.workload.pods(ns, label)]
        return pod

    md_pod = {
        f"d{d:02d}": pod_of(f"rackai.rackspace.com/model-deployment=d{d:02d}") for d in range(DEPLOYMENTS)
    }
    v1_items: list[tuple[dict[str, object], dict[str, object] | None]] = []
    for name in names:
        # in sync: the status exactly as load writes it (its pod counted and recorded)
        loaded = {**_cond("Loaded", "Loaded"), "message": f"loaded in 1 Ready pod(s): {owner[name]} 1/1"}
        directory = f"/loraadapters/{ns}/{MODEL}/{name}/"
        generation_drift = name in stale_gen
        status = {
            "observedGeneration": 0 if generation_drift else 1,
            "phase": "Ready",
            "ready": True,
            "usedBy": [] if name in stale_used else [owner[name]],
            "storageRef": {"path": directory},
            "conditions": [_cond("Ready", "IntegrityVerified"), loaded],
            "served": [{"pod": md_pod[owner[name]], "fileSet": file_set({})}],
        }
        meta: dict[str, object] = {"name": name, "namespace": ns, "finalizers": [FINALIZER]}
        v1_items.append(({"metadata": meta, "spec": {"model": MODEL}}, status))
    _put_all(world, VLLM_ADAPTER, ns, v1_items)
    for name in sorted(deleting):  # our finalizer holds them: deletionTimestamp set, still listed
        world.custom.delete_namespaced_custom_object(
            VLLM_ADAPTER.group, VLLM_ADAPTER.version, ns, VLLM_ADAPTER.plural, name
        )
    v2_items: list[tuple[dict[str, object], dict[str, object] | None]] = []
    for name in v2_names:
        spec = {
            "name": f"{name}-v1",
            "path": f"/sglang/{ns}/{name}",
            "inferenceServiceRef": {"name": isvc_of[name]},
        }
        message = f"loaded in 1 Ready pod(s) of {ns}/{isvc_of[name]}"
        conds = [
            _cond("Available", "InferenceServiceReady", "True"),
            {**_cond("Error", "NoError", "False"), "message": "no error"},
            {**_cond("Loaded", "Loaded"), "message": message},
        ]
        for c in conds:
            c["observedGeneration"] = 1  # type: ignore[assignment]
        loaded = {"conditions": conds, "loadedPath": spec["path"], "lastLoadedAt": "2026-01-01T00:00:00Z"}
        status = None if name in v2_unadmitted else loaded
        meta = {"name": name, "namespace": ns, "finalizers": [FINALIZER]}
        v2_items.append(({"metadata": meta, "spec": spec}, status))
    _put_all(world, SGLANG_ADAPTER, ns, v2_items)

    # engines: every pod holds what it should, minus the "missing" drifts, plus the surplus
    root = f"{world.mount_root}/loraadapters/{ns}/{MODEL}"
    for d in range(DEPLOYMENTS):
        md = f"d{d:02d}"
        (pod,) = [
            p["metadata"]["name"]
            for p in world.workload.pods(ns, f"rackai.rackspace.com/model-deployment={md}")
        ]
        replica = world.workload.replica(ns, pod)
        held = {a for a, o in owner.items() if o == md and a not in missing and a not in deleting}
        held |= {a for a in surplus if owner[a] == f"d{(d - 1) % DEPLOYMENTS:02d}"}
        held |= {a for a in deleting if owner[a] == md}  # deleting: still loaded -> unload
        with replica._lock:  # the stand-in's own state: thousands of loads over HTTP are setup
            for name in sorted(held):
                replica._adapters[name] = LoadedAdapter(name, f"{root}/{name}")
    for s in range(SERVICES):
        svc = f"svc{s}"
        (pod,) = [
            p["metadata"]["name"]
            for p in world.workload.pods(ns, f"inference.rackai.rackspace.com/inference-service={svc}")
        ]
        replica = world.workload.replica(ns, pod)
        with replica._lock:
            for name in v2_names:
                if isvc_of[name] == svc and name not in v2_missing and name not in v2_unadmitted:
                    replica._adapters[f"{name}-v1"] = LoadedAdapter(f"{name}-v1", f"/sglang/{ns}/{name}")
    setup_s = time.monotonic() - started

    expected = (
        {(n, "load") for n in missing | stale_used}
        | {(n, "admit") for n in stale_gen}
        | {(n, "unload") for n in surplus | deleting}
        | {(n, "load") for n in v2_missing}
        | {(n, "admit") for n in v2_unadmitted}
    )
    world.sink.clear()
    world.kube.reset_counters()
    ping = world.event(PING, {"message": "resync"})
    began = time.monotonic()
    answer = world.post("resync", ping)
    resync_s = time.monotonic() - began
    assert answer.status_code == 204, answer.text
    nudges = {
        (e.get_data()["adapter"]["name"], e[STEP_EXTENSION])  # type: ignore[index]
        for e in world.sink.events
        if (e.get_data() or {}).get("adapter", {}).get("namespace") == ns  # type: ignore[union-attr]
    }
    lists = world.kube.requests
    v1_lists = lists[("list", VLLM_ADAPTER.plural)]
    result = {
        "vllm_adapters": VLLM_ADAPTERS,
        "sglang_adapters": SGLANG_ADAPTERS,
        "deployments": DEPLOYMENTS,
        "services": SERVICES,
        "drifted": len(expected),
        "nudges": len(nudges),
        "nudges_exactly_the_drifted": nudges == expected,
        "adapter_list_pages": v1_lists,
        "api_requests": world.kube.request_count,
        "resync_s": round(resync_s, 2),
        "setup_s": round(setup_s, 1),
    }
    record_result("resync_scale", result)
    print("\nresync at scale: " + ", ".join(f"{k}={v}" for k, v in result.items()))
    assert nudges == expected, (sorted(nudges - expected)[:10], sorted(expected - nudges)[:10])
    assert v1_lists >= math.ceil(VLLM_ADAPTERS / PAGE), f"{v1_lists} list requests: not paginated"
    # page by page and no more: one request per page of each kind (the sglang kind twice: the
    # claimants from other namespaces are read first), whatever else the cluster holds
    stored = {kind: _count(world, kind) for kind in (VLLM_ADAPTER, SGLANG_ADAPTER)}
    # (both kinds' plural is `loraadapters`: the counter holds the two together)
    pages = math.ceil(stored[VLLM_ADAPTER] / PAGE) + 2 * math.ceil(stored[SGLANG_ADAPTER] / PAGE)
    assert v1_lists <= pages + 3, (v1_lists, stored)
    # no per-object GETs; the only reads by name are of Models some adapter reported missing
    # (one per distinct missing Model, cluster-wide: earlier tests of the session leave a few)
    assert all(verb != "get" or resource == "models" for verb, resource in lists), f"GETs: {dict(lists)}"
    assert lists.get(("get", "models"), 0) <= 10, f"Model GETs: {dict(lists)}"
