"""What the periodic resync should nudge, from one snapshot of (a shard of) the world (pure).

Input: adapters of both kinds, the ModelDeployments and InferenceServices, and the listing of
each Ready serving pod grouped by target. Output: (adapter, step, reason) nudges, at most one
per adapter and step. Serving drift is the serving planner's own answer: an adapter is nudged to
load when a pod lacks it or serves an older file set, or when its status is not what load would
write now; a copy of ours that is not wanted is nudged to unload (a copy whose LoRAAdapter is
gone is named by reference). Cost is linear in objects + pods x listed adapters.

Shards (what lets resync read page by page, never every adapter at once): the planner's answer
for an adapter depends only on
- vllm: the adapter, the ModelDeployments of its namespace and their pods' listings, and of a
  listing only the entries under its own name (`restrict`): a chunk of one namespace's adapters
  is a shard, and the copies no chunk named are judged last (`unnamed`: orphans);
- sglang: every claimant of a name on its InferenceService: one namespace's adapters, with the
  claimants from other namespaces of its InferenceServices, is a shard.
`Snapshot.lifecycle` and `Snapshot.serving` say which adapters a shard judges (the others are in
it for their claims); the union of the shards' nudges is the whole world's
(tests/unit/test_resync_shards.py holds them equal).

Steady adapters (what almost every adapter of a large fleet is): `steady` proves, from the
adapter, its ModelDeployments and the entries under its name, that the planner would nudge a
vllm adapter for nothing, at a fraction of the planner's cost; `drift` leaves those out (with
their listing entries) before it plans. Anything unusual about an adapter (a verdict, a pod not
serving it, a copy elsewhere, a status load would rewrite, a duplicate, a garbled field) is
simply not proven and goes to the planner, which gives it its verdict as before
(tests/unit/test_resync_steady.py holds `drift` equal to `every_nudge`).

Capacity: resync reads no engine's settings, but an sglang adapter left out for capacity says
in its Loaded condition (EngineCapacityExceeded) how many adapters the engine holds. When every
reachable Ready pod of its InferenceService lists exactly that many names, those pods are
planned with that capacity (`full_targets`): the adapters ranked out stay out and are not
nudged to load every tick. Room that may have appeared shows in the snapshot and is planned as
load would plan it: a claimant deleted or reprioritised changes the ranking, and a pod listing
fewer (a copy unloaded, a replica added or restarted) or more (capacity raised) names than
the condition says leaves the capacity unknown, so every claim is nudged to load as before.
A vllm pod's capacity is read as load reads it, from its arguments or its ModelDeployment's
spec (`vllm_capacities`): its served records' residency is judged like any other field, so a
lost residency write is nudged to load, which rewrites it.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, NamedTuple

from functions.logic import capacity, conditions, facts, loaded, reasons, serving
from functions.logic.adapter_config import VALID, ConfigVerdict
from functions.logic.capacity import Capacity
from functions.logic.paths import is_subdomain
from functions.logic.serving import (
    AdapterKey,
    ListingFailure,
    Pod,
    PodReport,
    Policy,
    Scope,
    ServingReport,
    TargetKey,
    TargetReport,
)
from functions.resources.kinds import SERVING_BY_RUNTIME

Obj = dict[str, Any]
Listing = dict[str, str] | None
Namespaced = tuple[str, str]  # (namespace, name)
UNKNOWN_TIME = datetime(1970, 1, 1, tzinfo=UTC)
UNREACHABLE = ListingFailure(reasons.ENGINE_UNREACHABLE, "GET /v1/models failed")
LEFT_OUT = re.compile(r"the engine holds at most (\d+) adapter\(s\)(?: \(([^)]*)\))?")
"""The capacity in serving.left_out_message, as Loaded's message quotes it."""


class Nudge(NamedTuple):
    api_version: str
    namespace: str
    name: str
    step: str
    reason: str


class PodCapacity(NamedTuple):
    capacity: Capacity
    listed: int
    """How many names the pod's engine lists in all (a shard's listing holds only its own)."""


def vllm_capacities(
    deployments: Sequence[Obj],
    pods: Mapping[Namespaced, Mapping[str, Listing]],
    pod_args: Mapping[tuple[Namespaced, str], Sequence[object]],
) -> dict[Namespaced, dict[str, PodCapacity]]:
    """Each reachable Ready pod's capacity as load reads it (vLLM reports none: the pod's
    arguments, else its ModelDeployment's spec.engineArgs), with its whole listing's length;
    pods without a known count are left out (load writes no residency for them)."""
    spec_args: dict[Namespaced, Sequence[object] | None] = {}
    for md in deployments:
        args = facts.spec(md).get("engineArgs")
        spec_args[(facts.namespace_of(md), facts.name_of(md))] = args if isinstance(args, list) else None
    found: dict[Namespaced, dict[str, PodCapacity]] = {}
    for target, group in pods.items():
        for pod, listing in group.items():
            if listing is None:
                continue
            cap = capacity.of_pod("vllm", None, pod_args.get((target, pod)), spec_args.get(target))
            if cap.slots is not None or cap.problem is not None:
                found.setdefault(target, {})[pod] = PodCapacity(cap, len(listing))
    return found


@dataclass
class Snapshot:
    v1: Sequence[Obj] = ()
    v2: Sequence[Obj] = ()
    deployments: Sequence[Obj] = ()
    services: Sequence[Obj] = ()
    md_pods: Mapping[Namespaced, Mapping[str, Listing]] = field(default_factory=dict)
    """(namespace, deployment) -> Ready pod name -> its listing (None: unreachable)."""
    md_capacity: Mapping[Namespaced, Mapping[str, PodCapacity]] = field(default_factory=dict)
    """(namespace, deployment) -> Ready pod -> its capacity and how many names it lists in all,
    for the pods whose capacity is known (`vllm_capacities`): their adapters' residency."""
    isvc_pods: Mapping[Namespaced, Mapping[str, Listing]] = field(default_factory=dict)
    models: frozenset[Namespaced] = frozenset()
    """(namespace, model) of the Models that exist, among those some adapter reported missing."""
    lifecycle: frozenset[AdapterKey] | None = None
    """The adapters whose admission, observation and deletion this snapshot judges (None: all)."""
    serving: frozenset[AdapterKey] | None = None
    """The adapters whose serving this snapshot judges (None: all); copies of adapters absent
    from the snapshot are judged by whoever put their names in the listings."""


def restrict(
    pods: Mapping[Namespaced, Mapping[str, Listing]], names: Collection[str]
) -> dict[Namespaced, dict[str, Listing]]:
    """Each listing cut to the entries under `names` (an unreachable pod stays unreachable).

    For vllm the planner reads of a listing only the entry under the adapter's own name (its
    loads, its status, and whose copy an entry is: our layout names it), so a shard of a
    namespace's adapters needs no other entry, and an entry no shard named is an orphan's."""
    wanted = names if isinstance(names, set | frozenset) else set(names)
    cut: dict[Namespaced, dict[str, Listing]] = {}
    for target, group in pods.items():
        cut[target] = {}
        for pod, listing in group.items():
            if listing is None:
                cut[target][pod] = None
            elif len(wanted) < len(listing):
                cut[target][pod] = {n: listing[n] for n in wanted if n in listing}
            else:
                cut[target][pod] = {n: root for n, root in listing.items() if n in wanted}
    return cut


def listed(pods: Mapping[Namespaced, Mapping[str, Listing]]) -> set[str]:
    """Every name some pod lists."""
    return {name for group in pods.values() for listing in group.values() if listing for name in listing}


def _conditions(obj: Obj) -> dict[str, Obj]:
    return {c.get("type"): c for c in (obj.get("status") or {}).get("conditions") or []}


def _failed_vllm(adapter: Obj) -> bool:
    ready = _conditions(adapter).get(reasons.READY) or {}
    return (adapter.get("status") or {}).get("phase") == "Failed" or ready.get("reason") in reasons.TERMINAL


def missing_models(adapters: Sequence[Obj]) -> set[Namespaced]:
    """(namespace, model) named by adapters whose verdict is ModelNotFound: worth a GET each."""
    named = {
        (facts.namespace_of(a), str((a.get("spec") or {}).get("model")))
        for a in adapters
        if (_conditions(a).get(reasons.READY) or {}).get("reason") == reasons.MODEL_NOT_FOUND
    }
    return {key for key in named if is_subdomain(key[1])}  # never put an invalid name in a URL


def target_changed(adapter: Obj, isvc: Obj | None) -> str | None:
    """Admit's verdict about the InferenceService no longer matches the InferenceService."""
    available = _conditions(adapter).get(reasons.AVAILABLE) or {}
    if isvc is None:
        return "its InferenceService is gone" if available.get("status") == "True" else None
    reason = available.get("reason")
    if reason == reasons.INFERENCE_SERVICE_NOT_FOUND:
        return "its InferenceService exists now"
    target = facts.inference_service(isvc)
    if reason == reasons.RUNTIME_MISMATCH and target.serves:
        return "its InferenceService runs sglang now"
    if reason == reasons.REFERENCE_NOT_PERMITTED and serving.accepts(target, facts.namespace_of(adapter)):
        return "its InferenceService accepts this namespace now"
    if available.get("status") == "True" and not serving.accepts(target, facts.namespace_of(adapter)):
        return "its InferenceService no longer accepts this namespace"
    return None


def admit_reason(adapter: Obj, sglang: bool) -> str | None:
    generation = facts.meta(adapter).get("generation")
    if sglang:
        available = _conditions(adapter).get(reasons.AVAILABLE)
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


def stored_config(obj: Obj, conditions_: Mapping[str, Obj] | None = None) -> ConfigVerdict:
    """Resync reads no adapter_config.json: a verdict about the files stays as load wrote it
    (only new files, stat -> verify -> load, change it); otherwise the config counts as fine.
    `conditions_`: the object's `_conditions`, when the caller has them."""
    loaded_condition = (conditions_ if conditions_ is not None else _conditions(obj)).get(
        reasons.LOADED
    ) or {}
    reason = str(loaded_condition.get("reason") or "")
    if reason in reasons.CONFIG_VERDICTS:
        return ConfigVerdict(False, reason, str(loaded_condition.get("message") or ""))
    return ConfigVerdict(True, VALID, "")


def world_of(snapshot: Snapshot, policy: Policy) -> tuple[serving.World, dict[AdapterKey, Obj]]:
    objects: dict[AdapterKey, Obj] = {}
    adapters: dict[AdapterKey, serving.Adapter] = {}
    for obj in snapshot.v1:
        adapter = facts.vllm_adapter(obj, policy.mount_root, stored_config(obj))
        adapters[adapter.key], objects[adapter.key] = adapter, obj
    for obj in snapshot.v2:
        adapter = facts.sglang_adapter(obj)
        adapters[adapter.key], objects[adapter.key] = adapter, obj
    targets: dict[TargetKey, serving.Target | None] = {}
    for md in snapshot.deployments:
        target = facts.deployment(md, default_rank=1 << 30)
        targets[target.key] = target
    for isvc in snapshot.services:
        target = facts.inference_service(isvc)
        targets[target.key] = target
    for adapter in adapters.values():
        if adapter.target is not None:
            targets.setdefault(adapter.target, None)
    pods: dict[TargetKey, tuple[Pod, ...]] = {}
    full = full_targets(snapshot, adapters)
    for (namespace, name), listings in snapshot.md_pods.items():
        key = TargetKey("ModelDeployment", namespace, name)
        if targets.get(key) is not None:
            known = snapshot.md_capacity.get((namespace, name)) or {}
            pods[key] = tuple(
                Pod(key, pod, listing, *known[pod])
                if listing is not None and pod in known
                else Pod(key, pod, listing if listing is not None else UNREACHABLE)
                for pod, listing in sorted(listings.items())
            )
    for (namespace, name), listings in snapshot.isvc_pods.items():
        key = TargetKey("InferenceService", namespace, name)
        if targets.get(key) is not None:
            cap = full.get(key)
            pods[key] = tuple(
                Pod(key, pod, listing if listing is not None else UNREACHABLE, cap)
                for pod, listing in sorted(listings.items())
            )
    return serving.World(adapters, targets, pods, policy), objects


def left_out_capacity(obj: Obj) -> Capacity | None:
    """The capacity an sglang adapter's Loaded False EngineCapacityExceeded quotes (None: other)."""
    have = _conditions(obj).get(reasons.LOADED) or {}
    if have.get("status") != "False" or have.get("reason") != reasons.ENGINE_CAPACITY_EXCEEDED:
        return None
    found = LEFT_OUT.search(str(have.get("message") or ""))
    if found is None:
        return None
    return Capacity(int(found.group(1)), True, found.group(2) or "")


def full_targets(
    snapshot: Snapshot, adapters: Mapping[AdapterKey, serving.Adapter]
) -> dict[TargetKey, Capacity]:
    """The InferenceServices whose pods are full at the capacity their left-out adapters quote:
    every reachable Ready pod lists exactly that many names (and all quote the same one)."""
    quoted: dict[TargetKey, set[Capacity]] = defaultdict(set)
    for obj in snapshot.v2:
        cap = left_out_capacity(obj)
        if cap is None:
            continue
        target = adapters[AdapterKey("sglang", facts.namespace_of(obj), facts.name_of(obj))].target
        if target is not None:
            quoted[target].add(cap)
    out: dict[TargetKey, Capacity] = {}
    for target, caps in quoted.items():
        listings = [
            listing
            for listing in (snapshot.isvc_pods.get((target.namespace, target.name)) or {}).values()
            if listing is not None
        ]
        cap = next(iter(caps)) if len(caps) == 1 else None
        if cap is not None and listings and all(len(listing) == cap.slots for listing in listings):
            out[target] = cap
    return out


def steady(snapshot: Snapshot, mount_root: str) -> frozenset[AdapterKey]:
    """The vllm adapters of `snapshot` the planner would nudge for nothing, proven cheaply.

    Proven: not deleting, admitted at its generation, Ready for the file set its spec declares
    (not ModelNotFound), no stored verdict about its files; named by at least one existing
    ModelDeployment, each serving, of its model; every Ready pod of those listed and serving it
    from its path and file set (as `status.served` records); no copy in our layout elsewhere; its
    usedBy, served and Loaded exactly what load would write. Whatever is not proven (a
    duplicate, an odd field) is left to the planner."""
    if not snapshot.v1:
        return frozenset()
    targets: dict[TargetKey, serving.Target] = {}
    for md in snapshot.deployments:
        target = facts.deployment(md, default_rank=1 << 30)
        targets[target.key] = target  # the last of a name, as world_of keeps it
    naming: dict[Namespaced, list[serving.Target]] = defaultdict(list)
    for target in sorted(targets.values(), key=lambda t: t.key.name):
        for lora in dict.fromkeys(target.adapters):
            naming[(target.key.namespace, lora)].append(target)
    pods: dict[TargetKey, list[tuple[str, Listing]]] = {}
    copies: dict[Namespaced, list[tuple[TargetKey, str, str]]] = defaultdict(list)
    """(namespace, name) -> (target, pod, root) of every entry under that name."""
    residencies: dict[str, dict[str, str]] = {}
    """pod -> the residency field load writes for each adapter it serves (pods are named in
    their namespace, and a shard holds one namespace)."""
    for (namespace, name), group in snapshot.md_pods.items():
        md_key = TargetKey("ModelDeployment", namespace, name)
        if md_key not in targets:
            continue  # world_of keeps no pod of a target that does not exist
        pods[md_key] = sorted(group.items())
        for pod, known in (snapshot.md_capacity.get((namespace, name)) or {}).items():
            if known.capacity.slots is not None and known.capacity.problem is None:
                residencies[pod] = {"residency": serving.residency(known.capacity.slots, known.listed)}
        for pod, listing in pods[md_key]:
            for lora, root in (listing or {}).items():
                copies[(namespace, lora)].append((md_key, pod, root))
    expected: dict[tuple[TargetKey, ...], tuple[list[str], list[str], Mapping[str, Any]]] = {}
    """ModelDeployments -> (usedBy, their pods, the Loaded load writes): alike for their adapters."""
    seen: set[AdapterKey] = set()
    twice: set[AdapterKey] = set()
    proven: set[AdapterKey] = set()
    for obj in snapshot.v1:
        conditions_ = _conditions(obj)
        config = stored_config(obj, conditions_)
        adapter = facts.vllm_adapter(obj, mount_root, config)
        key = adapter.key
        if key in seen:
            twice.add(key)  # world_of keeps the last of a name: the planner judges duplicates
        seen.add(key)
        if adapter.serve != "serve" or not config.ok or adapter.deleting or not adapter.model:
            continue
        if frozen_drift(obj):
            continue
        if admit_reason(obj, sglang=False) is not None:
            continue
        if (conditions_.get(reasons.READY) or {}).get("reason") == reasons.MODEL_NOT_FOUND:
            continue
        mds = naming.get((key.namespace, key.name))
        if not mds or any(not md.serves or adapter.model != md.model for md in mds):
            continue
        if not _serves_everywhere(adapter, mds, pods, copies.get((key.namespace, key.name), ()), mount_root):
            continue
        named = tuple(md.key for md in mds)
        if named not in expected:
            expected[named] = _expected_status(key, named, pods)
        used_by, pod_names, want = expected[named]
        status = facts.status(obj)
        if sorted(status.get("usedBy") or []) != used_by:
            continue
        served = [{"pod": pod, "fileSet": adapter.file_set, **residencies.get(pod, {})} for pod in pod_names]
        have = conditions_.get(reasons.LOADED) or {}
        if _served_differ(status, served) or _loaded_differs(have, want):
            continue
        proven.add(key)
    return frozenset(proven - twice)


def _expected_status(
    key: AdapterKey, named: tuple[TargetKey, ...], pods: Mapping[TargetKey, Sequence[tuple[str, Listing]]]
) -> tuple[list[str], list[str], Mapping[str, Any]]:
    """(usedBy, pods, Loaded) load writes for an adapter every pod of `named` serves (as
    `stale_status` has them from the serving report)."""
    targets = tuple(
        TargetReport(
            md, None, tuple(PodReport(pod, "serving", reasons.POD_PRESENT) for pod, _ in pods.get(md, ()))
        )
        for md in named
    )
    served = {pod: "" for md in named for pod, _ in pods.get(md, ())}
    fields = loaded.vllm_serving(
        ServingReport(key, targets, served, (), ()), [md.name for md in named], "serve", True
    )
    return fields.used_by, [str(s["pod"]) for s in fields.served or []], _loaded(fields.loaded, {})


def _serves_everywhere(
    adapter: serving.Adapter,
    mds: Sequence[serving.Target],
    pods: Mapping[TargetKey, Sequence[tuple[str, Listing]]],
    copies: Sequence[tuple[TargetKey, str, str]],
    mount_root: str,
) -> bool:
    """Every Ready pod of `mds` serves the adapter's current copy, and no other pod holds a copy
    the planner would call ours (it would unload it)."""
    name = adapter.key.name
    for md in mds:
        for pod, listing in pods.get(md.key, ()):
            root = listing.get(name) if listing is not None else None
            if root is None or not serving.same_path(root, adapter.lora_path):
                return False
            if adapter.served.get(pod) != adapter.file_set:
                return False
    naming = {md.key for md in mds}
    for target, _, root in copies:
        if target not in naming:
            owner = serving.vllm_layout_owner(root, adapter.key.namespace, mount_root)
            if owner is not None and owner[1] == name:
                return False
    return True


def without(snapshot: Snapshot, keys: frozenset[AdapterKey]) -> Snapshot:
    """`snapshot` without the vllm adapters `keys` and their entries in the ModelDeployments' pods."""
    if not keys:
        return snapshot
    gone: dict[str, set[str]] = defaultdict(set)
    for key in keys:
        gone[key.namespace].add(key.name)
    v1 = [
        obj
        for obj in snapshot.v1
        if AdapterKey("vllm", facts.namespace_of(obj), facts.name_of(obj)) not in keys
    ]
    md_pods: dict[Namespaced, dict[str, Listing]] = {}
    for (namespace, name), group in snapshot.md_pods.items():
        drop = gone.get(namespace)
        md_pods[(namespace, name)] = {
            pod: {n: r for n, r in listing.items() if n not in drop}
            if listing is not None and drop
            else listing
            for pod, listing in group.items()
        }
    return replace(snapshot, v1=v1, md_pods=md_pods)


def drift(snapshot: Snapshot, mount_root: str, restat: str | None = None) -> list[Nudge]:
    """`restat`: a reason to nudge stat for every admitted seed-1 adapter whatever its state (a
    full resync: storage changes may have gone unnoticed, and a Ready adapter's files too).
    The same nudges as `every_nudge`; the adapters `steady` proves in sync are not planned."""
    if restat is None:  # a full resync nudges stat for every admitted adapter: none is steady
        snapshot = without(snapshot, steady(snapshot, mount_root))
    return every_nudge(snapshot, mount_root, restat)


def every_nudge(snapshot: Snapshot, mount_root: str, restat: str | None = None) -> list[Nudge]:
    """The planner over every adapter of the snapshot (what `drift` answers, the definition)."""
    nudges: dict[tuple[str, str, str, str], list[str]] = defaultdict(list)
    judged = {"lifecycle": snapshot.lifecycle, "serving": snapshot.serving}

    def adder(which: str) -> Callable[[AdapterKey, str, str], None]:
        mine = judged[which]

        def add(key: AdapterKey, step: str, reason: str) -> None:
            if mine is not None and key in objects and key not in mine:
                return  # another shard judges it
            api_version = SERVING_BY_RUNTIME[key.kind].api_version
            nudges[(api_version, key.namespace, key.name, step)].append(reason)

        return add

    world, objects = world_of(snapshot, Policy(mount_root=mount_root))
    services = {(facts.namespace_of(s), facts.name_of(s)): s for s in snapshot.services}
    admitting = _lifecycle(world, objects, services, snapshot.models, adder("lifecycle"), restat)
    _serving_drift(world, objects, admitting, adder("serving"))
    return [Nudge(*key, "; ".join(dict.fromkeys(reasons_))) for key, reasons_ in sorted(nudges.items())]


def _lifecycle(
    world: serving.World,
    objects: Mapping[AdapterKey, Obj],
    services: Mapping[Namespaced, Obj],
    models: frozenset[Namespaced],
    add: Callable[[AdapterKey, str, str], None],
    restat: str | None = None,
) -> set[AdapterKey]:
    """Deletions to finish, admissions to redo, observations to repeat; returns the adapters an
    earlier step owns now (their serving is judged once that step has ruled)."""
    waiting: set[AdapterKey] = set()
    for key, obj in sorted(objects.items()):
        if facts.deleting(obj):
            if facts.deletion_held(obj):
                add(key, "unload", "deleting and still carrying our finalizer")
            waiting.add(key)
            continue
        if key.kind == "sglang":
            target = world.adapters[key].target
            isvc = services.get((target.namespace, target.name)) if target is not None else None
            reason = admit_reason(obj, sglang=True) or target_changed(obj, isvc)
            if reason:
                add(key, "admit", reason)
                waiting.add(key)
            continue
        reason = admit_reason(obj, sglang=False)
        model = (key.namespace, str(facts.spec(obj).get("model")))
        ready = _conditions(obj).get(reasons.READY) or {}
        if reason is None and ready.get("reason") == reasons.MODEL_NOT_FOUND and model in models:
            reason = f"Model {model[1]} exists now"
        if reason:
            add(key, "admit", reason)
            waiting.add(key)
            continue
        if restat is not None:
            add(key, "stat", restat)
        serve = world.adapters[key].serve
        if serve == "drop" and not _failed_vllm(obj):
            add(key, "stat", "admitted but not Ready: files may have arrived unnoticed")
        elif serve == "hold":
            add(key, "stat", "a change is waiting for the integrity check (its verify may be lost)")
        frozen_reason = frozen_drift(obj)
        if frozen_reason:
            add(key, "stat", frozen_reason)
    return waiting


def frozen_drift(obj: Obj) -> str | None:
    """Why a vllm adapter's frozen sets need verify (reached through stat's reply): a retired
    set no pod serves waits to be deleted (verify deletes it once the grace period has passed),
    or a Ready adapter's verified set has no frozen copy (verified by a release before copies
    were frozen, or its record lost), so its pods still read the tenant's upload directory."""
    status = facts.status(obj)
    records = [r for r in status.get("frozen") or [] if isinstance(r, dict)]
    served = {s.get("fileSet") for s in status.get("served") or [] if isinstance(s, dict)}
    if any(r.get("retiredAt") and r.get("fileSet") not in served for r in records):
        return "a retired frozen file set no pod serves waits to be deleted"
    verified = status.get("fileSet")
    if (
        verified
        and facts.condition_true(obj, reasons.READY)
        and not any(r.get("fileSet") == verified and not r.get("retiredAt") for r in records)
    ):
        return "the verified file set has no frozen copy yet"
    return None


def _serving_drift(
    world: serving.World,
    objects: Mapping[AdapterKey, Obj],
    waiting: set[AdapterKey],
    add: Callable[[AdapterKey, str, str], None],
) -> None:
    desire = serving.desired(world)
    lacking: dict[AdapterKey, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for action in serving.plan(world, desire, Scope(load=True, unload=True)):
        if action.adapter in waiting:
            continue
        if action.op == "unload":
            add(action.adapter, "unload", f"loaded in {action.target.name} which should not serve it")
        else:
            what = "missing in" if action.op == "load" else "an older file set in"
            where = (
                f"{action.target.name}/{action.pod}"
                if action.target.kind == "ModelDeployment"
                else action.pod
            )
            lacking[action.adapter][what].append(where)
    for key, found in sorted(lacking.items()):
        for what, pods in sorted(found.items()):
            more = f" and {len(pods) - 5} more" if len(pods) > 5 else ""
            add(key, "load", f"{what} Ready pod(s) {', '.join(pods[:5])}{more}")
    for key, obj in sorted(objects.items()):
        adapter = world.adapters[key]
        if key in waiting or adapter.serve == "hold":
            continue
        stale = stale_status(world, desire, key, obj, only_used_by=key in lacking)
        if stale:
            add(key, "load", stale)


def stale_status(
    world: serving.World, desire: serving.Desire, key: AdapterKey, obj: Obj, only_used_by: bool = False
) -> str | None:
    """What of the serving status differs from what load would write now (None: nothing).

    `only_used_by`: a pod lacks the adapter, so load rewrites the rest anyway. A Ready pod that
    did not answer is not judged: its own Pod events reload it. A verdict about the adapter's
    files is load's to keep (resync reads no files). A True Loaded is compared with its message
    (which counts the pods); a False one by status and reason (a failure's message quotes an
    engine answer resync does not ask for), unless it is a left-out one (EngineCapacityExceeded):
    its message counts what the target wants and is compared too.
    """
    adapter = world.adapters[key]
    report = serving.serving_report(world, desire, key)
    status = facts.status(obj)
    have = _conditions(obj).get(reasons.LOADED) or {}
    if key.kind == "vllm":
        ready = report if adapter.serve == "serve" else None
        used = [t.name for t in desire.targets_of.get(key, ())]
        fields = loaded.vllm_serving(ready, used, adapter.serve, bool(have))
        if sorted(status.get("usedBy") or []) != fields.used_by:
            return f"usedBy is stale (should be {fields.used_by})"
        served = fields.served if fields.served is not None else status.get("served") or []
        want = _loaded(fields.loaded, have)
        missing_load_time = False  # vLLM's status has no load time
    else:
        serves = adapter.serve == "serve"
        # what sglang_status would write, without building it (a tick judges 10,000s of them)
        state = loaded.sglang_loaded(report, serving.redacted(adapter), serves, bool(have))
        served = []
        want = _loaded(state, have)
        missing_load_time = loaded.stamps_load_time(status, report, serves) and not status.get("lastLoadedAt")
    unjudged = any(p.state == "unreachable" for t in report.targets for p in t.pods)
    if only_used_by or unjudged or have.get("reason") in reasons.CONFIG_VERDICTS:
        return None
    if missing_load_time:
        return "lastLoadedAt is missing though a pod serves it"
    if key.kind == "vllm" and adapter.serve == "serve":
        differs = _served_differ(status, served)
        if differs:
            return differs
    return _loaded_differs(have, want)


def _served_differ(status: Mapping[str, Any], served: list[Obj]) -> str | None:
    recorded = status.get("served") or []
    # load writes them sorted: equal lists are the common case
    if recorded == served:
        return None
    have, want = _served(status), _served({"served": served})
    if have == want:
        return None
    if [r[:2] for r in have] == [r[:2] for r in want]:
        return "served records' residency differs from what the pods' capacity and listings say"
    return "served records differ from the pods' listings"


def _loaded_differs(have: Mapping[str, Any], want: Mapping[str, Any]) -> str | None:
    """What of the Loaded condition `have` differs from the one load would write (`want`)."""
    if want.get("reason") == reasons.NOT_REFERENCED and have.get("reason") != reasons.NOT_REFERENCED:
        # stale, or never written: the adapter.ready delivery that would have said so was lost
        return "Loaded is stale or missing: no ModelDeployment names it"
    if (have.get("status"), have.get("reason")) != (want.get("status"), want.get("reason")):
        now, then = f"{have.get('status')}/{have.get('reason')}", f"{want.get('status')}/{want.get('reason')}"
        return f"Loaded is {now}, load would write {then}"
    # a left-out message counts the claims and pods, which change without a word to the adapter
    counted = want.get("status") == "True" or want.get("reason") == reasons.ENGINE_CAPACITY_EXCEEDED
    if counted and have.get("message") != want.get("message"):
        return f"Loaded says {have.get('message')!r}, load would write {want.get('message')!r}"
    return None


def _loaded(state: loaded.LoadedState | None, have: Mapping[str, Any]) -> Mapping[str, Any]:
    """The Loaded condition load writes (`state` None: the one there is, untouched)."""
    if state is None:
        return have
    message = state.message[: conditions.MESSAGE_MAX]
    return {"status": state.status, "reason": state.reason, "message": message}


def _served(status: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    return sorted(
        (str(s.get("pod")), str(s.get("fileSet")), str(s.get("residency") or ""))
        for s in status.get("served") or []
        if isinstance(s, dict)
    )
