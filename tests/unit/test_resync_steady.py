"""drift.steady: the adapters left out of planning are exactly ones the planner nudges for nothing.

A namespace in sync (every vllm adapter loaded everywhere its ModelDeployments want it, its
status as load wrote it), then random damage: to adapters (status fields, conditions,
generation, deletion, model, storage path, file set, duplicates), to ModelDeployments (deleted,
other model, not naming, naming twice) and to the pods' listings (entries gone, other roots,
copies in other pods, unreachable pods, pods gone). `drift` (with the steady adapters left out)
must answer exactly what `every_nudge` (the planner over every adapter) answers, reasons
included; the undamaged namespace must be proven steady in full, and with no nudge.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from functions.logic import drift
from functions.logic.capacity import Capacity
from functions.logic.loaded import loaded_in
from functions.logic.serving import AdapterKey
from tests.support.objects import MOUNT, condition, model_deployment, vllm_adapter

Obj = dict[str, Any]
NS = "ns"
NAMED = {"d0": ["a0", "a1", "a2", "a4"], "d1": ["a2", "a3", "a4"]}
"""a2 and a4 are named by both deployments; a5 by none (never steady: NotReferenced)."""
PODS = {"d0": ["d0-0", "d0-1"], "d1": ["d1-0", "d1-1", "d1-2"]}
ADAPTERS = ["a0", "a1", "a2", "a3", "a4", "a5"]
SLOTS = {"d0-0": 2, "d0-1": 8}
"""The vllm capacity of d0's pods (d1's is unknown): d0-0 lists more than it keeps resident."""


def _root(name: str, model: str = "m1") -> str:
    """Where load points the engines: the frozen copy of the adapter's verified set."""
    return MOUNT + vllm_adapter(NS, name, model, frozen=True)["status"]["frozen"][0]["path"].rstrip("/")


def in_sync() -> drift.Snapshot:
    """The namespace as load leaves it once every load has succeeded."""
    deployments = [model_deployment(NS, md, names) for md, names in NAMED.items()]
    md_pods: dict[drift.Namespaced, dict[str, drift.Listing]] = {
        (NS, md): {pod: {name: _root(name) for name in NAMED[md]} for pod in pods}
        for md, pods in PODS.items()
    }
    md_capacity = {
        (NS, "d0"): {
            pod: drift.PodCapacity(Capacity(slots, False, "pod args"), len(NAMED["d0"]))
            for pod, slots in SLOTS.items()
        }
    }
    residency = {
        pod: "resident" if len(NAMED["d0"]) <= slots else "reloadable" for pod, slots in SLOTS.items()
    }
    v1 = []
    for name in ADAPTERS:
        obj = vllm_adapter(NS, name, frozen=True)
        status = obj["status"]
        used = sorted(md for md, names in NAMED.items() if name in names)
        pods = sorted(pod for md in used for pod in PODS[md])
        if used:
            counts = ", ".join(f"{md} {len(PODS[md])}/{len(PODS[md])}" for md in used)
            status["usedBy"] = used
            status["served"] = [
                {
                    "pod": pod,
                    "fileSet": status["fileSet"],
                    **({"residency": residency[pod]} if pod in residency else {}),
                }
                for pod in pods
            ]
            loaded = condition("Loaded", "True", "Loaded", f"{loaded_in(len(pods))}: {counts}")
        else:
            loaded = condition("Loaded", "False", "NotReferenced", "no ModelDeployment names it")
        status["conditions"].append(loaded)
        obj["metadata"]["generation"] = 1
        v1.append(obj)
    return drift.Snapshot(v1=v1, deployments=deployments, md_pods=md_pods, md_capacity=md_capacity)


def _adapter(snapshot: drift.Snapshot, name: str) -> Obj:
    return next(obj for obj in snapshot.v1 if obj["metadata"]["name"] == name)


def _condition(obj: Obj, type_: str) -> Obj:
    return next(c for c in obj["status"]["conditions"] if c["type"] == type_)


ADAPTER_DAMAGES = [
    "no-used-by", "more-used-by", "served-one-less", "served-other-set", "served-reordered",
    "served-garbage", "loaded-message", "loaded-false", "loaded-rank", "loaded-config-invalid",
    "no-loaded", "loaded-twice", "ready-twice", "ready-false", "ready-unknown", "model-not-found",
    "generation", "never-admitted", "deleting", "other-model", "storage-elsewhere", "storage-outside",
    "file-set-changed", "declared-changed", "duplicate", "phase-failed", "no-finalizer",
    "residency-lost", "residency-missing",
]  # fmt: skip
DEPLOYMENT_DAMAGES = ["deleting", "other-model", "names-less", "names-twice", "gone"]
POD_DAMAGES = [
    "entry-gone", "other-root", "static-root", "other-model-root", "unnormal-root", "copy",
    "unreachable", "pod-gone", "capacity-unknown", "capacity-garbage", "capacity-room",
]  # fmt: skip


def damage_adapter(snapshot: drift.Snapshot, name: str, how: str) -> None:
    obj = _adapter(snapshot, name)
    status, meta = obj["status"], obj["metadata"]
    loaded = next((c for c in status["conditions"] if c["type"] == "Loaded"), None)
    if how == "no-used-by":
        status.pop("usedBy", None)
    elif how == "more-used-by":
        status["usedBy"] = sorted({*status.get("usedBy", []), "d9"})
    elif how == "served-one-less" and status.get("served"):
        status["served"] = status["served"][1:]
    elif how == "served-other-set" and status.get("served"):
        status["served"][-1] = {**status["served"][-1], "fileSet": "md5set:0000000000000000"}
    elif how == "served-reordered":
        status["served"] = list(reversed(status.get("served", [])))
    elif how == "served-garbage":
        status["served"] = [*status.get("served", []), "garbage", {"pod": 7}]
    elif how == "loaded-message" and loaded is not None:
        loaded["message"] = "loaded in 1 Ready pod(s): d0 1/2"
    elif how == "loaded-false" and loaded is not None:
        loaded.update(status="False", reason="Loading")
    elif how == "loaded-rank" and loaded is not None:
        loaded.update(status="False", reason="RankTooHigh")
    elif how == "loaded-config-invalid" and loaded is not None:
        loaded.update(status="False", reason="AdapterConfigInvalid")
    elif how == "no-loaded":
        status["conditions"] = [c for c in status["conditions"] if c["type"] != "Loaded"]
    elif how == "loaded-twice" and loaded is not None:
        status["conditions"].append({**loaded, "status": "False", "reason": "Loading"})
    elif how == "ready-twice":
        status["conditions"].append(condition("Ready", "False", "AwaitingFiles"))
    elif how == "ready-false":
        _condition(obj, "Ready").update(status="False", reason="AwaitingFiles")
    elif how == "ready-unknown":
        _condition(obj, "Ready").update(status="Unknown", reason="Verifying")
    elif how == "model-not-found":
        _condition(obj, "Ready").update(reason="ModelNotFound")
    elif how == "generation":
        meta["generation"] = 2
    elif how == "never-admitted":
        status.pop("observedGeneration", None)
    elif how == "deleting":
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    elif how == "other-model":
        obj["spec"]["model"] = "m2"
    elif how == "storage-elsewhere":
        status["storageRef"] = {"path": f"/loraadapters/{NS}/m1/other/"}
    elif how == "storage-outside":
        status["storageRef"] = {"path": "/elsewhere/x/"}
        obj["spec"]["model"] = "not a name!"
    elif how == "file-set-changed":
        status["fileSet"] = "md5set:1111111111111111"
    elif how == "declared-changed":
        obj["spec"]["integrity"]["md5"] = {"/other": "1" * 32}
    elif how == "duplicate":
        twin = copy.deepcopy(obj)
        twin["status"]["usedBy"] = ["d1"]
        snapshot.v1 = [*snapshot.v1, twin]
    elif how == "phase-failed":
        status["phase"] = "Failed"
    elif how == "no-finalizer":
        meta["finalizers"] = []
    elif how == "residency-lost":  # the write after a load that moved the pod across its capacity
        flip = {"resident": "reloadable", "reloadable": "resident"}
        status["served"] = [
            {**r, "residency": flip[r["residency"]]} if isinstance(r, dict) and "residency" in r else r
            for r in status.get("served", [])
        ]
    elif how == "residency-missing":
        status["served"] = [
            {k: v for k, v in r.items() if k != "residency"} if isinstance(r, dict) else r
            for r in status.get("served", [])
        ]


def damage_deployment(snapshot: drift.Snapshot, index: int, how: str) -> None:
    if index >= len(snapshot.deployments):
        return
    md = snapshot.deployments[index]
    if how == "deleting":
        md["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    elif how == "other-model":
        md["spec"]["model"] = "m2"
    elif how == "names-less" and md["spec"]["loraAdapters"]:
        md["spec"]["loraAdapters"] = md["spec"]["loraAdapters"][1:]
    elif how == "names-twice":
        md["spec"]["loraAdapters"] = md["spec"]["loraAdapters"] * 2
    elif how == "gone":
        snapshot.deployments = [d for d in snapshot.deployments if d is not md]


def damage_pods(snapshot: drift.Snapshot, target: drift.Namespaced, index: int, name: str, how: str) -> None:
    group: dict[str, drift.Listing] = snapshot.md_pods[target]  # type: ignore[assignment]
    if index >= len(group):
        return
    pod = sorted(group)[index]
    listing = group[pod]
    known: dict[str, drift.PodCapacity] = snapshot.md_capacity.get(target, {})  # type: ignore[assignment]
    if how.startswith("capacity-") and pod not in known:
        return
    if how == "capacity-unknown":
        del known[pod]
    elif how == "capacity-garbage":
        known[pod] = drift.PodCapacity(Capacity(None, False, "pod args", ("EngineCapacityInvalid", "0")), 4)
    elif how == "capacity-room":  # raised: every adapter it lists is resident now
        known[pod] = known[pod]._replace(capacity=Capacity(64, False, "pod args"))
    elif how == "unreachable":
        group[pod] = None
    elif how == "pod-gone":
        del group[pod]
    elif listing is None:
        return
    elif how == "entry-gone":
        listing.pop(name, None)
    elif how == "other-root":
        listing[name] = _root("other")
    elif how == "static-root":
        listing[name] = "/models/static"
    elif how == "other-model-root":
        listing[name] = _root(name, "m2")
    elif how == "unnormal-root":
        listing[name] = _root(name).replace("/loraadapters/", "//loraadapters/./")
    elif how == "copy":
        listing[name] = _root(name)


def _copied(snapshot: drift.Snapshot) -> drift.Snapshot:
    snapshot.v1, snapshot.deployments = list(snapshot.v1), list(snapshot.deployments)
    snapshot.md_capacity = {target: dict(pods) for target, pods in snapshot.md_capacity.items()}
    return snapshot


@st.composite
def damaged(draw: st.DrawFn) -> drift.Snapshot:
    snapshot = _copied(in_sync())
    for _ in range(draw(st.integers(0, 4))):
        which = draw(st.sampled_from(["adapter", "deployment", "pods"]))
        if which == "adapter":
            damage_adapter(snapshot, draw(st.sampled_from(ADAPTERS)), draw(st.sampled_from(ADAPTER_DAMAGES)))
        elif which == "deployment":
            damage_deployment(snapshot, draw(st.integers(0, 1)), draw(st.sampled_from(DEPLOYMENT_DAMAGES)))
        else:
            target = draw(st.sampled_from(sorted(snapshot.md_pods)))
            name = draw(st.sampled_from([*ADAPTERS, "gone"]))
            damage_pods(snapshot, target, draw(st.integers(0, 2)), name, draw(st.sampled_from(POD_DAMAGES)))
    return snapshot


def _singly_damaged() -> list[tuple[str, drift.Snapshot]]:
    cases = []
    for name in ADAPTERS:
        for how in ADAPTER_DAMAGES:
            damage_adapter(snapshot := _copied(in_sync()), name, how)
            cases.append((f"{name} {how}", snapshot))
    for index in (0, 1):
        for how in DEPLOYMENT_DAMAGES:
            damage_deployment(snapshot := _copied(in_sync()), index, how)
            cases.append((f"d{index} {how}", snapshot))
    for target, pods in PODS.items():
        for index in range(len(pods)):
            for name in [*ADAPTERS, "gone"]:
                for how in POD_DAMAGES:
                    damage_pods(snapshot := _copied(in_sync()), (NS, target), index, name, how)
                    cases.append((f"{pods[index]} {name} {how}", snapshot))
    return cases


def test_the_namespace_in_sync_is_steady_but_for_the_unreferenced_one_and_needs_no_nudge() -> None:
    snapshot = in_sync()
    proven = drift.steady(snapshot, MOUNT)
    assert proven == {AdapterKey("vllm", NS, name) for name in ADAPTERS if name != "a5"}
    assert drift.every_nudge(snapshot, MOUNT) == []
    assert drift.drift(snapshot, MOUNT) == []
    left = drift.without(snapshot, proven)
    assert [obj["metadata"]["name"] for obj in left.v1] == ["a5"]
    assert all(listing == {} for group in left.md_pods.values() for listing in group.values())


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(damaged(), st.booleans())
def test_leaving_the_steady_out_changes_no_nudge(snapshot: drift.Snapshot, full: bool) -> None:
    _same_nudges(snapshot, "the filer's log lost its cursor" if full else None)


SINGLY_DAMAGED = _singly_damaged()


@pytest.mark.parametrize(
    ("damage", "snapshot"), SINGLY_DAMAGED, ids=lambda v: v if isinstance(v, str) else ""
)
def test_every_single_damage_is_judged_as_the_planner_judges_it(
    damage: str, snapshot: drift.Snapshot
) -> None:
    _same_nudges(snapshot, None)


def test_most_single_damages_drift() -> None:
    """The damage is real: most of it makes the planner nudge (some it rightly ignores: order,
    fields it does not read, a second Ready after the first, a copy that is ours already)."""
    drifting = [d for d, snapshot in SINGLY_DAMAGED if drift.every_nudge(copy.deepcopy(snapshot), MOUNT)]
    assert len(drifting) > len(SINGLY_DAMAGED) / 2


def _same_nudges(snapshot: drift.Snapshot, restat: str | None) -> set[tuple[str, str]]:
    expected = drift.every_nudge(copy.deepcopy(snapshot), MOUNT, restat=restat)
    assert drift.drift(snapshot, MOUNT, restat=restat) == expected
    nudged = {(n.namespace, n.name) for n in drift.every_nudge(snapshot, MOUNT)}
    assert not {(k.namespace, k.name) for k in drift.steady(snapshot, MOUNT)} & nudged
    return nudged
