"""The convergence invariant, checked from a fresh full observation of the world.

At quiescence, for both LoRAAdapter kinds:
1. every Ready (seed 1) / Available (seed 2) adapter is loaded in exactly the Ready pods of
   the targets that should serve it, with the right path, and no pod holds an adapter of ours
   (seed 1: loaded from under `{mount_root}/loraadapters/`; seed 2: named like a seed-2 adapter
   of the InferenceService, or loaded from under the mount root) that it should not serve;
2. every status field equals what a fresh full observation would write: the production pure
   decisions (admit, stat, verify, load) are re-run on fresh data (Kubernetes objects, the
   storage listing, the engines' own `GET /v1/models`) and the result is compared with the
   stored status, ignoring only timestamps (`lastTransitionTime`, `lastLoadedAt`, which must
   be set when the adapter is loaded somewhere);
3. no finalizer of ours is left on a deleted adapter, and every live adapter carries it;
4. no adapter still referenced was unloaded (a desired adapter missing from a Ready pod).

The engines are only observed (`execute(..., load=False)`): the check has no side effects.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from functions import _serving, admit, stat, verify
from functions._edge import Deps
from functions._serving import Fleet
from functions.logic import adapter_config, integrity, loading, targets
from functions.logic.paths import STORAGE_ROOT, is_under
from functions.resources.inference import InferenceService, SGLangAdapter
from functions.resources.kinds import (
    FINALIZER,
    INFERENCE_SERVICE,
    MODEL,
    MODEL_DEPLOYMENT,
    SGLANG_ADAPTER,
    VLLM_ADAPTER,
)
from functions.resources.rackai import LoRAAdapter
from functions.settings import Settings

Obj = dict[str, Any]
NOW = datetime(2030, 1, 1, tzinfo=UTC)
IGNORED_STATUS_FIELDS = frozenset({"lastLoadedAt"})
IGNORED_CONDITION_FIELDS = frozenset({"lastTransitionTime"})
NOT_READY_LOADED_REASONS = frozenset({loading.R_NOT_READY, loading.R_NOT_REFERENCED, loading.R_UNLOADED})
"""Seed 1, not Ready: unload's clean-up and load's verdict both say "not loaded"; either is true."""


@dataclass(frozen=True)
class Violation:
    rule: str
    """missing | surplus | wrong-path | unreachable | status | finalizer | last-loaded-at"""
    subject: str
    detail: str

    def __str__(self) -> str:
        return f"[{self.rule}] {self.subject}: {self.detail}"


# -- the world ---------------------------------------------------------------------------------
def deps_for(source: Any) -> Deps:
    """Production clients pointed at a running Stack (admin kubeconfig: RBAC is not the point)."""
    if isinstance(source, Deps):
        return source
    settings = Settings(
        filer_url=source.filer.url,
        mount_root=str(source.mount_root),
        kubeconfig=str(source.admin_kubeconfig),
        engine_timeout=5.0,
    )
    return Deps(settings)


@dataclass
class World:
    v1: list[Obj]
    v2: list[Obj]
    deployments: list[Obj]
    services: list[Obj]
    models: set[tuple[str, str]]


def observe(deps: Deps, namespaces: Iterable[str] | None = None) -> World:
    wanted = set(namespaces) if namespaces is not None else None
    kube = deps.kube

    def keep(obj: Obj) -> bool:
        return wanted is None or targets.namespace_of(obj) in wanted

    return World(
        v1=[a for a in kube.iter(VLLM_ADAPTER) if keep(a)],
        v2=[a for a in kube.iter(SGLANG_ADAPTER) if keep(a)],
        deployments=[d for d in kube.iter(MODEL_DEPLOYMENT) if keep(d)],
        services=[s for s in kube.iter(INFERENCE_SERVICE) if keep(s)],
        models={(targets.namespace_of(m), targets.name_of(m)) for m in kube.iter(MODEL)},
    )


def _path(obj: Mapping[str, Any]) -> str:
    return f"{targets.namespace_of(obj)}/{targets.name_of(obj)}"


# -- status comparison -------------------------------------------------------------------------
def _normal(status: Mapping[str, Any] | None) -> Obj:
    out: Obj = {}
    for key, value in (status or {}).items():
        if key in IGNORED_STATUS_FIELDS or value in (None, "", [], {}):
            continue
        if key == "conditions":
            value = sorted(
                (
                    {k: v for k, v in c.items() if k not in IGNORED_CONDITION_FIELDS}
                    for c in value
                    if isinstance(c, dict)
                ),
                key=lambda c: str(c.get("type")),
            )
        out[key] = value
    return out


def _short(value: Any, limit: int = 300) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def diff_status(subject: str, stored: Mapping[str, Any] | None, fresh: Mapping[str, Any]) -> list[Violation]:
    have, want = _normal(stored), _normal(fresh)
    out: list[Violation] = []
    for key in sorted(set(have) | set(want)):
        if key == "conditions":
            continue
        if have.get(key) != want.get(key):
            detail = f"{key} is {_short(have.get(key))}, a fresh observation writes {_short(want.get(key))}"
            out.append(Violation("status", subject, detail))
    have_c = {c.get("type"): c for c in have.get("conditions") or []}
    want_c = {c.get("type"): c for c in want.get("conditions") or []}
    for type_ in sorted(set(have_c) | set(want_c), key=str):
        if have_c.get(type_) != want_c.get(type_):
            detail = (
                f"condition {type_} is {_short(have_c.get(type_))}, "
                f"a fresh observation writes {_short(want_c.get(type_))}"
            )
            out.append(Violation("status", subject, detail))
    return out


# -- seed 1 --------------------------------------------------------------------------------------
def fresh_status_v1(deps: Deps, fleet: Fleet, world: World, obj: Obj) -> Obj:
    """admit -> stat -> verify -> load, as each would write on fresh data (no engine calls)."""
    namespace, name = targets.namespace_of(obj), targets.name_of(obj)
    adapter = LoRAAdapter.model_validate(obj)
    model = adapter.spec.model
    exists = admit.model_name_valid(model) and (namespace, model) in world.models
    adapter = adapter.model_copy(update={"status": admit.decide_rackai(adapter, exists, NOW)})
    directory = stat.listing_dir(adapter)
    if directory is not None:
        listing = deps.storage.stat_dir(directory)
        adapter = adapter.model_copy(update={"status": stat.decide(adapter, listing, NOW)})
    observed = verify.observed_files(adapter)
    limit = deps.settings.hash_max_bytes
    hashed = {
        path: deps.storage.hash_file(path, limit) if limit > 0 else None
        for path in integrity.to_hash(verify.declared(adapter), observed)
    }
    wire = verify.decide(adapter, hashed, NOW).to_wire()
    generation = (obj.get("metadata") or {}).get("generation")
    deployments = [d for d in world.deployments if targets.namespace_of(d) == namespace]
    used = targets.used_by(name, deployments)
    after = {**obj, "status": wire}
    if not targets.ready_v1(after):
        return loading.status_v1(wire, used, None, generation, NOW, not_ready=True)
    plans = _serving.plan_v1(fleet, after, deployments)
    _serving.execute(fleet, plans, load=False)
    return loading.status_v1(wire, used, [p.result() for p in plans], generation, NOW)


def check_status_v1(deps: Deps, fleet: Fleet, world: World, obj: Obj) -> list[Violation]:
    subject = f"LoRAAdapter(rackai) {_path(obj)}"
    fresh = fresh_status_v1(deps, fleet, world, obj)
    stored = dict(obj.get("status") or {})
    if not targets.ready_v1({**obj, "status": fresh}):
        # not Ready: Loaded must not claim anything; which "not loaded" reason is a matter of
        # which step wrote last (load: AdapterNotReady, unload: NotReferenced/Unloaded)
        def loaded_of(status: Obj) -> Obj | None:
            return next((c for c in status.get("conditions") or [] if c.get("type") == loading.LOADED), None)

        have, want = loaded_of(stored), loaded_of(fresh)
        if have is not None and (
            have.get("status") != "False" or have.get("reason") not in NOT_READY_LOADED_REASONS
        ):
            return [
                *diff_status(subject, _without_loaded(stored), _without_loaded(fresh)),
                Violation("status", subject, f"not Ready but condition Loaded is {_short(have)}"),
            ]
        del want
        return diff_status(subject, _without_loaded(stored), _without_loaded(fresh))
    return diff_status(subject, stored, fresh)


def _without_loaded(status: Obj) -> Obj:
    conds = [c for c in status.get("conditions") or [] if c.get("type") != loading.LOADED]
    return {**status, "conditions": conds}


def check_engines_v1(deps: Deps, fleet: Fleet, world: World) -> list[Violation]:
    out: list[Violation] = []
    mount = deps.settings.mount_root
    ours = posixpath.join(mount, STORAGE_ROOT.strip("/"))
    by_ns: dict[str, dict[str, Obj]] = {}
    for adapter in world.v1:
        by_ns.setdefault(targets.namespace_of(adapter), {})[targets.name_of(adapter)] = adapter
    for md in world.deployments:
        namespace, md_name = targets.namespace_of(md), targets.name_of(md)
        adapters = by_ns.get(namespace, {})
        desired = targets.desired_v1(md, adapters, mount)
        for lora in list(desired):
            raw = fleet.config(adapters[lora])
            if not adapter_config.check(raw, targets.max_rank(md, deps.settings.max_lora_rank)).ok:
                del desired[lora]  # refused before any engine call: must not be loaded
        endpoints = fleet.endpoints(MODEL_DEPLOYMENT, namespace, md_name)
        listings = fleet.listings(endpoints)
        for ep in endpoints:
            out += _compare_pod(
                f"ModelDeployment {namespace}/{md_name}",
                ep.pod,
                listings[ep.pod],
                desired,
                lambda lora, root: is_under(root, ours),
            )
    return out


# -- seed 2 --------------------------------------------------------------------------------------
def fresh_status_v2(fleet: Fleet, world: World, obj: Obj) -> Obj:
    adapter = SGLangAdapter.model_validate(obj)
    namespace, name = targets.isvc_ref(obj)
    found = next(
        (s for s in world.services if (targets.namespace_of(s), targets.name_of(s)) == (namespace, name)),
        None,
    )
    target = InferenceService.model_validate(found) if found is not None else None
    wire = admit.decide_sglang(adapter, target, NOW).to_wire()
    after = {**obj, "status": wire}
    if not targets.available_v2(after):
        return wire
    plan = _serving.plan_v2(fleet, after)
    _serving.execute(fleet, [plan], load=False)
    generation = (obj.get("metadata") or {}).get("generation")
    path = str((obj.get("spec") or {}).get("path") or "")
    return loading.status_v2(wire, plan.result(), path, generation, NOW)


def check_status_v2(fleet: Fleet, world: World, obj: Obj) -> list[Violation]:
    subject = f"LoRAAdapter(sglang) {_path(obj)}"
    fresh = fresh_status_v2(fleet, world, obj)
    stored = dict(obj.get("status") or {})
    out = diff_status(subject, stored, fresh)
    if fresh.get("loadedPath") and not stored.get("lastLoadedAt"):
        out.append(Violation("last-loaded-at", subject, "loaded in a Ready pod but lastLoadedAt is not set"))
    return out


def check_engines_v2(deps: Deps, fleet: Fleet, world: World) -> list[Violation]:
    out: list[Violation] = []
    mount = deps.settings.mount_root
    for isvc in world.services:
        namespace, name = targets.namespace_of(isvc), targets.name_of(isvc)
        candidates = [a for a in world.v2 if targets.targets_isvc(a, namespace, name)]
        desired = targets.desired_v2(isvc, candidates)
        endpoints = fleet.endpoints(INFERENCE_SERVICE, namespace, name)
        listings = fleet.listings(endpoints)
        for ep in endpoints:
            out += _compare_pod(
                f"InferenceService {namespace}/{name}",
                ep.pod,
                listings[ep.pod],
                desired,
                lambda lora, root, i=isvc, c=candidates: (
                    targets.managed_v2(lora, i, c) or is_under(root, mount)
                ),
            )
    return out


# -- shared --------------------------------------------------------------------------------------
def _compare_pod(
    target: str,
    pod: str,
    listing: Mapping[str, str] | None,
    desired: Mapping[str, targets.Wanted],
    ours: Any,
) -> list[Violation]:
    subject = f"{target} pod {pod}"
    if listing is None:
        return [Violation("unreachable", subject, "Ready pod whose engine does not answer GET /v1/models")]
    out: list[Violation] = []
    for lora, wanted in sorted(desired.items()):
        if lora not in listing:
            out.append(Violation("missing", subject, f"{lora} should be loaded here and is not"))
        elif listing[lora] and listing[lora].rstrip("/") != wanted.lora_path.rstrip("/"):
            out.append(
                Violation(
                    "wrong-path", subject, f"{lora} loaded from {listing[lora]}, wanted {wanted.lora_path}"
                )
            )
    for lora, root in sorted(listing.items()):
        if lora not in desired and ours(lora, root):
            out.append(Violation("surplus", subject, f"{lora} ({root}) is loaded here and should not be"))
    return out


def check_finalizer(obj: Obj, kind: str) -> list[Violation]:
    meta = obj.get("metadata") or {}
    finalizers = meta.get("finalizers") or []
    subject = f"LoRAAdapter({kind}) {_path(obj)}"
    if meta.get("deletionTimestamp"):
        if FINALIZER in finalizers:
            return [Violation("finalizer", subject, f"deleted but {FINALIZER} is still set")]
        return []
    if FINALIZER not in finalizers:
        return [Violation("finalizer", subject, f"live adapter without {FINALIZER} (never admitted?)")]
    return []


def check(source: Any, namespaces: Iterable[str] | None = None) -> list[Violation]:
    """Every violation of the invariant (empty list: converged). `source`: a Stack or a Deps.

    Faults must be stopped and the system quiescent: this reads, it does not wait."""
    deps = deps_for(source)
    world = observe(deps, namespaces)
    fleet = Fleet(deps)
    out: list[Violation] = []
    out += check_engines_v1(deps, fleet, world)
    out += check_engines_v2(deps, fleet, world)
    for obj in world.v1:
        out += check_finalizer(obj, "rackai")
        if not targets.is_deleting(obj):
            out += check_status_v1(deps, fleet, world, obj)
    for obj in world.v2:
        out += check_finalizer(obj, "sglang")
        if not targets.is_deleting(obj):
            out += check_status_v2(fleet, world, obj)
    return out


def report(violations: list[Violation], limit: int = 20) -> str:
    lines = [str(v) for v in violations[:limit]]
    if len(violations) > limit:
        lines.append(f"... and {len(violations) - limit} more")
    return "\n".join(lines)
