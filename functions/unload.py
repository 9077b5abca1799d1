"""unload: take adapters out of engines when they are deleted or no longer wanted.

Trigger: apiserver update of a LoRAAdapter (acts only with deletionTimestamp + our finalizer);
apiserver update of a ModelDeployment / InferenceService; `adapter.drifted` (loraflowstep=unload);
`adapter.failed` (a Ready adapter whose files went bad must stop serving the old weights).
Reads: the adapter / target (re-read), target Pods and each Ready pod's `GET /v1/models`.
Writes: removes finalizer `loraflow.io/unload` once every Ready pod is clean; Loaded
(Unloaded / UnloadFailed / NotReferenced) and seed-1 usedBy of affected adapters; Warning Event
UnloadFailed. Only *managed* adapters are ever unloaded: seed 1 loaded from our own layout,
`{mount_root}/loraadapters/{namespace}/{model}/{name}` (even when the LoRAAdapter is gone: a load
that raced a deletion is cleaned up on resync's nudge); seed 2 named like the `spec.name` of a
seed-2 adapter targeting the InferenceService. Static adapters are never touched.
Outcomes: 200 + `adapter.unloaded` (adapter-scoped, something unloaded or finalized); 204 when
nothing to do; 503 when a Ready pod failed retryably (finalizer kept).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cloudevents.http import CloudEvent

from events.domain import ADAPTER_DRIFTED, ADAPTER_FAILED, ADAPTER_UNLOADED, STEP_EXTENSION, AdapterUnloaded
from events.external import API_UPDATE
from functions import _edge, _inputs, _serving
from functions._edge import Deps
from functions._serving import Fleet
from functions.errors import EngineUnavailable
from functions.logic import loading, targets
from functions.logic.loading import PodResult, TargetResult
from functions.logic.pods import Endpoint
from functions.resources.kinds import (
    FINALIZER,
    INFERENCE_SERVICE,
    MODEL_DEPLOYMENT,
    SGLANG_ADAPTER,
    VLLM_ADAPTER,
    by_api_version_and_kind,
)

NAME = "unload"
ACCEPTS = (API_UPDATE, ADAPTER_DRIFTED, ADAPTER_FAILED)
Obj = dict[str, Any]
Job = tuple[Endpoint, str]


def handle(event: CloudEvent, deps: Deps) -> _edge.Reply:
    if event["type"] in (ADAPTER_DRIFTED, ADAPTER_FAILED):
        if event["type"] == ADAPTER_DRIFTED and event.get(STEP_EXTENSION) != "unload":
            return None
        ref = _inputs.adapter_ref(event)
        adapter = deps.kube.get(_inputs.adapter_kind(ref), ref.namespace, ref.name)
        if adapter is None:
            return (
                on_orphan(deps, ref.namespace, ref.name)
                if ref.api_version == VLLM_ADAPTER.api_version
                else None
            )
        return on_adapter(deps, adapter, drift=True)
    obj = _inputs.kube_object(event)
    kind = by_api_version_and_kind(obj["apiVersion"], obj["kind"])
    namespace, name = targets.namespace_of(obj), targets.name_of(obj)
    if kind in (VLLM_ADAPTER, SGLANG_ADAPTER):
        adapter = deps.kube.get(kind, namespace, name)
        return on_adapter(deps, adapter, drift=False) if adapter is not None else None
    if kind == MODEL_DEPLOYMENT:
        return on_deployment(deps, namespace, name)
    if kind == INFERENCE_SERVICE:
        return on_isvc(deps, namespace, name)
    return None


# -- engine calls ---------------------------------------------------------------------------------
def run(fleet: Fleet, jobs: Sequence[Job]) -> list[PodResult]:
    def call(job: Job) -> PodResult:
        ep, lora = job
        outcome = fleet.deps.engines.unload(ep, lora)
        if outcome.ok:
            fleet.note_unloaded(ep, lora)
        return PodResult(ep.pod, outcome.ok, outcome.reason, f"{lora}: {outcome.message}", outcome.retryable)

    return [result for _, result in fleet.deps.engines.fan_out(jobs, call)]


def unreachable(fleet: Fleet, endpoints: Sequence[Endpoint]) -> list[PodResult]:
    listings = fleet.listings(endpoints)
    return [
        PodResult(e.pod, False, "EngineUnreachable", "GET /v1/models failed", True)
        for e in endpoints
        if listings[e.pod] is None
    ]


# -- adapter-scoped ---------------------------------------------------------------------------------
def candidate_endpoints(fleet: Fleet, adapter: Obj) -> list[Endpoint]:
    """Ready pods of every target that could hold the adapter."""
    if _serving.kind_of(adapter) == SGLANG_ADAPTER:
        namespace, name = targets.isvc_ref(adapter)
        return fleet.endpoints(INFERENCE_SERVICE, namespace, name)
    namespace = targets.namespace_of(adapter)
    deployments = fleet.deps.kube.list_all(MODEL_DEPLOYMENT, namespace)
    return [
        e for md in deployments for e in fleet.endpoints(MODEL_DEPLOYMENT, namespace, targets.name_of(md))
    ]


def holds(fleet: Fleet, adapter: Obj, ep: Endpoint, listing: dict[str, str]) -> str | None:
    """The engine name under which this pod holds *our* copy of the adapter, if it does."""
    if _serving.kind_of(adapter) == SGLANG_ADAPTER:
        lora = str((adapter.get("spec") or {}).get("name") or "")
        return lora if lora in listing else None
    lora = targets.name_of(adapter)
    root = listing.get(lora)
    namespace = targets.namespace_of(adapter)
    if root is None or not targets.managed_v1(lora, root, namespace, fleet.deps.settings.mount_root):
        return None
    return lora


def on_adapter(deps: Deps, adapter: Obj, drift: bool) -> _edge.Reply:
    deleting = targets.is_deleting(adapter)
    finalizers = list((adapter.get("metadata") or {}).get("finalizers") or [])
    if deleting and FINALIZER not in finalizers:
        return None
    if not deleting and not drift:
        return None
    fleet = Fleet(deps)
    endpoints = candidate_endpoints(fleet, adapter)
    failed = unreachable(fleet, endpoints)
    listings = fleet.listings(endpoints)
    keep = set() if deleting else wanted_pods(fleet, adapter)
    jobs: list[Job] = []
    for ep in endpoints:
        listing = listings[ep.pod]
        lora = holds(fleet, adapter, ep, listing) if listing is not None else None
        if lora is not None and ep.pod not in keep:
            jobs.append((ep, lora))
    results = run(fleet, jobs)
    failed += [r for r in results if not r.ok]
    unloaded = sorted(r.pod for r in results if r.ok)
    kind = _serving.kind_of(adapter)
    if failed:
        report = [TargetResult("pods", pods=tuple(failed))]
        message = loading.describe_failures(report)
        _serving.warn(deps, adapter, loading.R_UNLOAD_FAILED, message, NAME)
        _serving.write_loaded(
            deps,
            kind,
            adapter,
            lambda s, g: loading.status_loaded(s, "False", loading.R_UNLOAD_FAILED, message, g, deps.clock()),
        )
        if any(r.retryable for r in failed):
            raise EngineUnavailable(
                f"unload {targets.namespace_of(adapter)}/{targets.name_of(adapter)}: {message}"
            )
        return None
    if not deleting and unloaded:
        refresh(fleet, adapter, results)
    finalized = False
    if deleting:
        deps.kube.write_finalizers(
            kind,
            targets.namespace_of(adapter),
            targets.name_of(adapter),
            lambda obj: [f for f in (obj.get("metadata") or {}).get("finalizers") or [] if f != FINALIZER],
        )
        finalized = True
    if not unloaded and not finalized:
        return None
    ref = _serving.ref_of(adapter)
    data = AdapterUnloaded(adapter=ref, pods=unloaded, finalized=finalized)
    return _edge.reply(ADAPTER_UNLOADED, NAME, kind.path(ref.namespace, ref.name), data)


def refresh(fleet: Fleet, adapter: Obj, results: list[PodResult]) -> None:
    """Rewrite Loaded (and usedBy) of a live adapter we just took out of some pods."""
    if _serving.kind_of(adapter) == SGLANG_ADAPTER:
        namespace, name = targets.isvc_ref(adapter)
        _serving.write_loaded(
            fleet.deps, SGLANG_ADAPTER, adapter, unloaded_status(fleet.deps, f"{namespace}/{name}")
        )
        return
    deployments = fleet.deps.kube.list_all(MODEL_DEPLOYMENT, targets.namespace_of(adapter))
    refresh_v1(fleet, adapter, deployments, results)


def on_orphan(deps: Deps, namespace: str, name: str) -> _edge.Reply:
    """The LoRAAdapter is gone but engines still hold our copy (a load raced its deletion)."""
    fleet = Fleet(deps)
    endpoints = [
        e
        for md in deps.kube.list_all(MODEL_DEPLOYMENT, namespace)
        for e in fleet.endpoints(MODEL_DEPLOYMENT, namespace, targets.name_of(md))
    ]
    listings = fleet.listings(endpoints)
    jobs: list[Job] = [
        (ep, name)
        for ep in endpoints
        if (listing := listings[ep.pod]) is not None
        and name in listing
        and targets.managed_v1(name, listing[name], namespace, deps.settings.mount_root)
    ]
    results = run(fleet, jobs)
    finish(deps, f"orphan {namespace}/{name}", results)
    return None


def wanted_pods(fleet: Fleet, adapter: Obj) -> set[str]:
    """Pods that should keep a live adapter (drift clean-up removes it everywhere else)."""
    deps = fleet.deps
    if _serving.kind_of(adapter) == SGLANG_ADAPTER:
        namespace, name = targets.isvc_ref(adapter)
        isvc = deps.kube.get(INFERENCE_SERVICE, namespace, name)
        if isvc is None or not targets.desired_v2(isvc, [adapter]):
            return set()
        return {e.pod for e in fleet.endpoints(INFERENCE_SERVICE, namespace, name)}
    namespace = targets.namespace_of(adapter)
    return {
        e.pod
        for md in deps.kube.list_all(MODEL_DEPLOYMENT, namespace)
        if targets.serves_v1(md, adapter)
        for e in fleet.endpoints(MODEL_DEPLOYMENT, namespace, targets.name_of(md))
    }


# -- target-scoped ----------------------------------------------------------------------------------
def sweep(fleet: Fleet, endpoints: list[Endpoint], surplus: dict[str, list[str]]) -> list[PodResult]:
    jobs = [(ep, lora) for ep in endpoints for lora in surplus.get(ep.pod, [])]
    return unreachable(fleet, endpoints) + run(fleet, jobs)


def on_deployment(deps: Deps, namespace: str, name: str) -> _edge.Reply:
    md = deps.kube.get(MODEL_DEPLOYMENT, namespace, name)
    if md is None:
        return None
    adapters = {targets.name_of(a): a for a in deps.kube.list_all(VLLM_ADAPTER, namespace)}
    desired = targets.desired_v1(md, adapters, deps.settings.mount_root)
    fleet = Fleet(deps)
    endpoints = fleet.endpoints(MODEL_DEPLOYMENT, namespace, name)
    listings = fleet.listings(endpoints)
    surplus = {
        e.pod: targets.surplus_v1(listing, desired, namespace, deps.settings.mount_root)
        for e in endpoints
        if (listing := listings[e.pod]) is not None
    }
    results = sweep(fleet, endpoints, surplus)
    deployments = deps.kube.list_all(MODEL_DEPLOYMENT, namespace)
    touched = {lora for names in surplus.values() for lora in names}
    stale = {n for n, a in adapters.items() if name in ((a.get("status") or {}).get("usedBy") or [])}
    for lora in sorted((touched | stale) - set(desired)):
        if lora in adapters:  # an orphan (its LoRAAdapter is gone) has no status to refresh
            refresh_v1(fleet, adapters[lora], deployments, results)
    return finish(deps, f"ModelDeployment {namespace}/{name}", results)


def refresh_v1(fleet: Fleet, adapter: Obj, deployments: list[Obj], results: list[PodResult]) -> None:
    """usedBy, and Loaded: re-observed over the deployments that still name it (no loads), else
    NotReferenced / UnloadFailed."""
    deps = fleet.deps
    used = targets.used_by(targets.name_of(adapter), deployments)
    if used:
        observed = None
        if targets.ready_v1(adapter):
            plans = _serving.plan_v1(fleet, adapter, deployments, pods_of=set())
            _serving.execute(fleet, plans)  # observe only: no pod is ours to load into
            observed = [p.result() for p in plans]
        _serving.write_v1(deps, adapter, used, observed)
        return
    mine = [r for r in results if r.message.startswith(targets.name_of(adapter) + ":")]
    state, reason = (
        ("False", loading.R_UNLOAD_FAILED)
        if any(not r.ok for r in mine)
        else ("False", loading.R_NOT_REFERENCED)
    )
    message = "no ModelDeployment lists this adapter in spec.loraAdapters"
    _serving.write_loaded(
        deps,
        VLLM_ADAPTER,
        adapter,
        lambda s, g: loading.status_loaded(s, state, reason, message, g, deps.clock(), []),  # type: ignore[arg-type]
    )


def on_isvc(deps: Deps, namespace: str, name: str) -> _edge.Reply:
    isvc = deps.kube.get(INFERENCE_SERVICE, namespace, name)
    if isvc is None:
        return None
    adapters = [a for a in deps.kube.iter(SGLANG_ADAPTER) if targets.targets_isvc(a, namespace, name)]
    desired = targets.desired_v2(isvc, adapters)
    fleet = Fleet(deps)
    endpoints = fleet.endpoints(INFERENCE_SERVICE, namespace, name)
    listings = fleet.listings(endpoints)
    surplus = {
        e.pod: targets.surplus_v2(listing, desired, isvc, adapters)
        for e in endpoints
        if (listing := listings[e.pod]) is not None
    }
    results = sweep(fleet, endpoints, surplus)
    touched = {lora for names in surplus.values() for lora in names}
    for adapter in adapters:
        if (adapter.get("spec") or {}).get("name") in touched:
            _serving.write_loaded(deps, SGLANG_ADAPTER, adapter, unloaded_status(deps, f"{namespace}/{name}"))
    return finish(deps, f"InferenceService {namespace}/{name}", results)


def unloaded_status(deps: Deps, target: str) -> Any:
    message = f"unloaded from {target}: the adapter is not Available there"

    def build(status: Obj, generation: int | None) -> Obj:
        return loading.status_loaded(status, "False", loading.R_UNLOADED, message, generation, deps.clock())

    return build


def finish(deps: Deps, what: str, results: list[PodResult]) -> _edge.Reply:
    failed = [r for r in results if not r.ok]
    if any(r.retryable for r in failed):
        raise EngineUnavailable(
            f"unload from {what}: {loading.describe_failures([TargetResult(what, pods=tuple(failed))])}"
        )
    return None


unload = _edge.function(NAME, ACCEPTS, handle)
