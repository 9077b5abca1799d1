"""What the periodic resync should nudge, from one snapshot of the world (pure).

Input: every adapter of both kinds, every ModelDeployment and InferenceService, and the
listing of each Ready serving pod grouped by target. Output: (adapter, step, reason) nudges,
at most one per adapter and step. Cost is linear in objects + pods x listed adapters.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from functions.logic import loading, targets
from functions.logic.adapter_config import VERDICT_REASONS
from functions.logic.paths import is_subdomain

Obj = dict[str, Any]
V1_API_VERSION = "rackai.rackspace.com/v1alpha1"
Listing = dict[str, str] | None
TargetKey = tuple[str, str]  # (namespace, name)


class Nudge(NamedTuple):
    api_version: str
    namespace: str
    name: str
    step: str
    reason: str


@dataclass
class Snapshot:
    v1: Sequence[Obj] = ()
    v2: Sequence[Obj] = ()
    deployments: Sequence[Obj] = ()
    services: Sequence[Obj] = ()
    md_pods: Mapping[TargetKey, Mapping[str, Listing]] = field(default_factory=dict)
    """(namespace, deployment) -> Ready pod name -> its listing (None: unreachable)."""
    isvc_pods: Mapping[TargetKey, Mapping[str, Listing]] = field(default_factory=dict)
    models: frozenset[TargetKey] = frozenset()
    """(namespace, model) of the Models that exist, among those some adapter reported missing."""


def _conditions(obj: Obj) -> dict[str, Obj]:
    return {c.get("type"): c for c in (obj.get("status") or {}).get("conditions") or []}


def _generation(obj: Obj) -> Any:
    return (obj.get("metadata") or {}).get("generation")


def _failed_v1(adapter: Obj) -> bool:
    status = adapter.get("status") or {}
    ready = _conditions(adapter).get("Ready") or {}
    return status.get("phase") == "Failed" or ready.get("reason") == "IntegrityCheckFailed"


def _lacking(pods: Mapping[str, Listing], lora: str) -> list[str]:
    return sorted(p for p, listing in pods.items() if listing is not None and lora not in listing)


def _loaded_stale(adapter: Obj, lacking: list[str], pods: int) -> str | None:
    loaded = _conditions(adapter).get("Loaded") or {}
    if loaded.get("reason") in VERDICT_REASONS:
        return None  # a verdict about the files: only new files (stat -> verify -> load) change it
    if lacking:
        return f"missing in Ready pod(s) {', '.join(lacking[:5])}"
    if pods and loaded.get("status") != "True":
        return "Loaded is not True although every Ready pod has it"
    stated = loading.counted(str(loaded.get("message") or ""))
    if stated is not None and stated != pods:
        # a scale-down whose Pod deletion events were lost: the pods went away after the
        # last load counted them (load recounts on each deletion it hears of)
        return f"Loaded counts {stated} Ready pod(s), there are {pods}"
    return None


def orphan_ref(namespace: str, name: str) -> Obj:
    return {"apiVersion": V1_API_VERSION, "metadata": {"namespace": namespace, "name": name}}


def missing_models(adapters: Sequence[Obj]) -> set[TargetKey]:
    """(namespace, model) named by adapters whose verdict is ModelNotFound: worth a GET each."""
    named = {
        (targets.namespace_of(a), str((a.get("spec") or {}).get("model")))
        for a in adapters
        if (_conditions(a).get("Ready") or {}).get("reason") == "ModelNotFound"
    }
    return {key for key in named if is_subdomain(key[1])}  # never put an invalid name in a URL


def target_changed(adapter: Obj, isvc: Obj | None) -> str | None:
    """Admit's verdict about the InferenceService no longer matches the InferenceService."""
    available = _conditions(adapter).get("Available") or {}
    if isvc is None:
        return "its InferenceService is gone" if available.get("status") == "True" else None
    reason = available.get("reason")
    if reason == "InferenceServiceNotFound":
        return "its InferenceService exists now"
    if reason == "RuntimeMismatch" and targets.isvc_serves(isvc):
        return "its InferenceService runs sglang now"
    return None


def admit_reason(adapter: Obj, seed2: bool) -> str | None:
    generation = _generation(adapter)
    if seed2:
        available = _conditions(adapter).get("Available")
        if available is None:
            return "never admitted"
        observed = available.get("observedGeneration")
    else:
        observed = (adapter.get("status") or {}).get("observedGeneration")
        if observed is None:
            return "never admitted"
    if generation is not None and observed != generation:
        return f"observedGeneration {observed} != generation {generation}"
    return None


def drift(snapshot: Snapshot, mount_root: str, restat: str | None = None) -> list[Nudge]:
    """`restat`: a reason to nudge stat for every admitted seed-1 adapter whatever its state (a
    full resync: storage changes may have gone unnoticed, and a Ready adapter's files too)."""
    nudges: dict[tuple[str, str, str, str], list[str]] = defaultdict(list)

    def add(adapter: Obj, step: str, reason: str) -> None:
        key = (str(adapter.get("apiVersion")), targets.namespace_of(adapter), targets.name_of(adapter), step)
        nudges[key].append(reason)

    _drift_v1(snapshot, mount_root, add, restat)
    _drift_v2(snapshot, add)
    return [Nudge(*key, "; ".join(reasons)) for key, reasons in sorted(nudges.items())]


def _drift_v1(snapshot: Snapshot, mount_root: str, add: Any, restat: str | None) -> None:
    by_ns: dict[str, dict[str, Obj]] = defaultdict(dict)
    for adapter in snapshot.v1:
        by_ns[targets.namespace_of(adapter)][targets.name_of(adapter)] = adapter
    # (namespace, adapter name) -> deployments naming it: one pass over the specs instead of
    # every adapter scanning every deployment of its namespace (quadratic at 10,000 x 200)
    naming: dict[tuple[str, str], list[Obj]] = defaultdict(list)
    for md in snapshot.deployments:
        namespace = targets.namespace_of(md)
        named = (md.get("spec") or {}).get("loraAdapters") or []
        for lora in dict.fromkeys(n for n in named if isinstance(n, str)):
            naming[(namespace, lora)].append(md)
    for adapter in snapshot.v1:
        key = (targets.namespace_of(adapter), targets.name_of(adapter))
        _adapter_v1(adapter, naming.get(key, []), snapshot, add, restat)
    for md in snapshot.deployments:
        namespace = targets.namespace_of(md)
        adapters = by_ns[namespace]
        desired = targets.desired_v1(md, adapters, mount_root)
        for listing in snapshot.md_pods.get((namespace, targets.name_of(md)), {}).values():
            for lora in targets.surplus_v1(listing or {}, desired, namespace, mount_root):
                # an orphan (its LoRAAdapter is gone) is named by reference: unload cleans it up
                adapter = adapters.get(lora) or orphan_ref(namespace, lora)
                add(adapter, "unload", f"loaded in {targets.name_of(md)} which should not serve it")


def _adapter_v1(adapter: Obj, mds: list[Obj], snapshot: Snapshot, add: Any, restat: str | None) -> None:
    if targets.is_deleting(adapter):
        if targets.FINALIZER_NAME in ((adapter.get("metadata") or {}).get("finalizers") or []):
            add(adapter, "unload", "deleting and still carrying our finalizer")
        return
    reason = admit_reason(adapter, seed2=False)
    if reason:
        add(adapter, "admit", reason)
        return
    model = (targets.namespace_of(adapter), str((adapter.get("spec") or {}).get("model")))
    if (_conditions(adapter).get("Ready") or {}).get(
        "reason"
    ) == "ModelNotFound" and model in snapshot.models:
        add(adapter, "admit", f"Model {model[1]} exists now")
        return
    if restat is not None:
        add(adapter, "stat", restat)
    name = targets.name_of(adapter)
    used = targets.used_by(name, mds)
    if used != sorted((adapter.get("status") or {}).get("usedBy") or []):
        add(adapter, "load", f"usedBy is stale (should be {used})")
    if not targets.ready_v1(adapter):
        if not _failed_v1(adapter):
            add(adapter, "stat", "admitted but not Ready: files may have arrived unnoticed")
        return
    loaded = _conditions(adapter).get("Loaded")
    if not mds and (loaded or {}).get("reason") != "NotReferenced":
        # stale, or never written: the adapter.ready delivery that would have said so was lost
        add(adapter, "load", "Loaded is stale or missing: no ModelDeployment names it")
        return
    serving = [md for md in mds if targets.serves_v1(md, adapter)]
    pods = {
        f"{targets.name_of(md)}/{pod}": listing
        for md in serving
        for pod, listing in snapshot.md_pods.get((targets.namespace_of(md), targets.name_of(md)), {}).items()
    }
    stale = _loaded_stale(adapter, _lacking(pods, name), len(pods)) if serving else None
    if stale:
        add(adapter, "load", stale)


def _drift_v2(snapshot: Snapshot, add: Any) -> None:
    services = {(targets.namespace_of(s), targets.name_of(s)): s for s in snapshot.services}
    for adapter in snapshot.v2:
        if targets.is_deleting(adapter):
            if targets.FINALIZER_NAME in ((adapter.get("metadata") or {}).get("finalizers") or []):
                add(adapter, "unload", "deleting and still carrying our finalizer")
            continue
        key = targets.isvc_ref(adapter)
        isvc = services.get(key)
        reason = admit_reason(adapter, seed2=True) or target_changed(adapter, isvc)
        if reason:
            add(adapter, "admit", reason)
            continue
        if isvc is None or not targets.available_v2(adapter) or not targets.isvc_serves(isvc):
            continue
        pods = snapshot.isvc_pods.get(key, {})
        lora = str((adapter.get("spec") or {}).get("name"))
        stale = _loaded_stale(adapter, _lacking(pods, lora), len(pods))
        if stale:
            add(adapter, "load", stale)
    by_target: dict[TargetKey, list[Obj]] = defaultdict(list)
    for adapter in snapshot.v2:
        by_target[targets.isvc_ref(adapter)].append(adapter)
    for key, isvc in services.items():
        candidates = by_target.get(key, [])
        desired = targets.desired_v2(isvc, candidates)
        for listing in snapshot.isvc_pods.get(key, {}).values():
            for lora in targets.surplus_v2(listing or {}, desired, isvc, candidates):
                for adapter in candidates:
                    if (adapter.get("spec") or {}).get("name") == lora:
                        add(adapter, "unload", f"loaded in {key[0]}/{key[1]} which should not serve it")
