"""load: put adapters into every Ready replica of the targets that should serve them.

Trigger: `adapter.ready`, `adapter.admitted`, `adapter.drifted` (loraflowstep=load); apiserver
add/update of a ModelDeployment or InferenceService; apiserver delete of a serving Pod (its
target's adapters now count one Ready pod fewer).
Reads: the adapter(s), ModelDeployments of the namespace / the InferenceService, target Pods,
`adapter_config.json` in storage (seed 1), each Ready pod's own `GET /v1/models`.
Writes: seed 1 `usedBy` + condition Loaded (Loaded, LoadFailed, NoReadyReplicas, ModelMismatch,
RankTooHigh, UnsupportedPeftType, AdapterConfigMissing, AdapterConfigInvalid, NotReferenced,
AdapterNotReady); seed 2 Loaded + Error, `loadedPath`, `lastLoadedAt`; Warning Event LoadFailed.
Outcomes: 200 + `adapter.loaded` (adapter-scoped, something loaded); 204 otherwise; 503 after
writing status when a pod failed retryably; 400 for malformed events.
"""

from __future__ import annotations

from typing import Any

from cloudevents.http import CloudEvent

from events.domain import (
    ADAPTER_ADMITTED,
    ADAPTER_DRIFTED,
    ADAPTER_LOADED,
    ADAPTER_READY,
    STEP_EXTENSION,
    AdapterLoaded,
    PodFailure,
)
from events.external import API_ADD, API_DELETE, API_TYPES, API_UPDATE
from functions import _edge, _inputs, _serving
from functions._edge import Deps
from functions._serving import Fleet, Plan
from functions.logic import targets
from functions.logic.loading import TargetResult, describe_failures
from functions.logic.paths import is_subdomain
from functions.resources.kinds import (
    INFERENCE_SERVICE,
    INFERENCE_SERVICE_LABEL,
    MODEL_DEPLOYMENT,
    MODEL_DEPLOYMENT_LABEL,
    POD,
    SGLANG_ADAPTER,
    VLLM_ADAPTER,
    by_api_version_and_kind,
)

NAME = "load"
ACCEPTS = (ADAPTER_READY, ADAPTER_ADMITTED, ADAPTER_DRIFTED, API_ADD, API_UPDATE, API_DELETE)


def handle(event: CloudEvent, deps: Deps) -> _edge.Reply:
    if event["type"] in API_TYPES:
        return on_object(deps, _inputs.kube_object(event), deleted=_inputs.is_deleted(event))
    if event["type"] == ADAPTER_DRIFTED and event.get(STEP_EXTENSION) != "load":
        return None
    ref = _inputs.adapter_ref(event)
    kind = _inputs.adapter_kind(ref)
    adapter = deps.kube.get(kind, ref.namespace, ref.name)
    if adapter is None:
        return None
    return on_adapter(deps, adapter, new=event["type"] != ADAPTER_DRIFTED)


def on_object(deps: Deps, obj: dict[str, Any], deleted: bool) -> _edge.Reply:
    """A target was added or changed, or one of its serving pods is gone: reconcile what the
    target serves (a scale-down's Loaded condition counts the Ready pods that are left)."""
    namespace, name = targets.namespace_of(obj), targets.name_of(obj)
    kind = by_api_version_and_kind(obj["apiVersion"], obj["kind"])
    if kind == POD:
        if not deleted:
            return None  # a pod that starts or turns Ready is reload's
        labels = (obj.get("metadata") or {}).get("labels") or {}
        md, isvc = labels.get(MODEL_DEPLOYMENT_LABEL), labels.get(INFERENCE_SERVICE_LABEL)
        # the event's last state names the target; a label that is no object name names none
        if isinstance(md, str) and is_subdomain(md):
            return on_deployment(deps, namespace, md)
        if isinstance(isvc, str) and is_subdomain(isvc):
            return on_isvc(deps, namespace, isvc)
        return None
    if deleted:
        return None  # a deleted target's adapters are unload's
    if kind == MODEL_DEPLOYMENT:
        return on_deployment(deps, namespace, name)
    if kind == INFERENCE_SERVICE:
        return on_isvc(deps, namespace, name)
    return None


def on_adapter(deps: Deps, adapter: dict[str, object], new: bool) -> _edge.Reply:
    """`new`: announced ready or admitted (no pod should have it yet), not found drifted."""
    fleet = Fleet(deps)
    if _serving.kind_of(adapter) == SGLANG_ADAPTER:
        if not targets.available_v2(adapter):
            return None
        plans = [_serving.plan_v2(fleet, adapter)]
    else:
        deployments = deps.kube.list_all(MODEL_DEPLOYMENT, targets.namespace_of(adapter))
        if not targets.ready_v1(adapter):
            _serving.write_v1(deps, adapter, targets.used_by(targets.name_of(adapter), deployments), None)
            return None
        plans = _serving.plan_v1(fleet, adapter, deployments)
        used = targets.used_by(targets.name_of(adapter), deployments)
    _serving.execute(fleet, plans, new=new)
    results = [p.result() for p in plans]
    # `adapter` was read by this invocation: the write starts from it (a 409 re-reads)
    if _serving.kind_of(adapter) == SGLANG_ADAPTER:
        _serving.write_v2(deps, adapter, results[0], fresh=True)
    else:
        _serving.write_v1(deps, adapter, used, results, fresh=True)
    return finish(deps, adapter, results)


def finish(deps: Deps, adapter: dict[str, object], results: list[TargetResult]) -> _edge.Reply:
    """Warn, ask for a retry when a pod may still succeed, else reply when something loaded."""
    failed = [PodFailure(pod=p.pod, reason=p.reason, message=p.message) for r in results for p in r.failed]
    if failed:
        _serving.warn(deps, adapter, "LoadFailed", describe_failures(results), NAME)
    _serving.raise_if_retryable(results, f"load {targets.namespace_of(adapter)}/{targets.name_of(adapter)}")
    loaded = sorted({p.pod for r in results for p in r.pods if p.loaded_now})
    if not loaded:
        return None
    ref = _serving.ref_of(adapter)
    subject = _serving.kind_of(adapter).path(ref.namespace, ref.name)
    return _edge.reply(ADAPTER_LOADED, NAME, subject, AdapterLoaded(adapter=ref, pods=loaded, failed=failed))


def on_deployment(deps: Deps, namespace: str, name: str) -> _edge.Reply:
    """Re-read the deployment; reconcile every adapter it names (one status write each)."""
    md = deps.kube.get(MODEL_DEPLOYMENT, namespace, name)
    if md is None:
        return None
    deployments = deps.kube.list_all(MODEL_DEPLOYMENT, namespace)
    fleet = Fleet(deps)
    work: list[tuple[dict[str, object], list[Plan]]] = []
    for adapter_name in sorted(set((md.get("spec") or {}).get("loraAdapters") or [])):
        adapter = deps.kube.get(VLLM_ADAPTER, namespace, adapter_name)
        if adapter is None:
            continue
        if not targets.ready_v1(adapter):
            _serving.write_v1(deps, adapter, targets.used_by(adapter_name, deployments), None)
            continue
        work.append((adapter, _serving.plan_v1(fleet, adapter, deployments)))
    _serving.execute(fleet, [p for _, plans in work for p in plans])
    all_results: list[TargetResult] = []
    for adapter, plans in work:
        results = [p.result() for p in plans]
        all_results += results
        _serving.write_v1(deps, adapter, targets.used_by(targets.name_of(adapter), deployments), results)
        if any(r.failed for r in results):
            _serving.warn(deps, adapter, "LoadFailed", describe_failures(results), NAME)
    _serving.raise_if_retryable(all_results, f"load into ModelDeployment {namespace}/{name}")
    return None


def on_isvc(deps: Deps, namespace: str, name: str) -> _edge.Reply:
    """Re-read the InferenceService; reconcile every Available seed-2 adapter that targets it."""
    if deps.kube.get(INFERENCE_SERVICE, namespace, name) is None:
        return None
    adapters = [
        a
        for a in deps.kube.iter(SGLANG_ADAPTER)
        if targets.targets_isvc(a, namespace, name) and targets.available_v2(a)
    ]
    fleet = Fleet(deps)
    plans = [_serving.plan_v2(fleet, a) for a in adapters]
    _serving.execute(fleet, plans)
    results = [p.result() for p in plans]
    for plan, result in zip(plans, results, strict=True):
        _serving.write_v2(deps, plan.adapter, result)
        if result.failed:
            _serving.warn(deps, plan.adapter, "LoadFailed", describe_failures([result]), NAME)
    _serving.raise_if_retryable(results, f"load into InferenceService {namespace}/{name}")
    return None


load = _edge.function(NAME, ACCEPTS, handle)
