"""I/O shared by load, reload and unload: targets' Ready pods, their listings, fanned-out calls.

Handlers never import each other; this module is their common shell (like `_edge`). All
decisions are in `functions.logic.targets`, `.adapter_config` and `.loading`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from events.domain import AdapterRef
from functions._edge import Deps
from functions.errors import EngineUnavailable
from functions.logic import adapter_config, loading, targets
from functions.logic.loading import PodResult, TargetResult
from functions.logic.pods import Endpoint, Runtime, endpoint
from functions.resources.kinds import (
    INFERENCE_SERVICE,
    INFERENCE_SERVICE_LABEL,
    MODEL_DEPLOYMENT,
    MODEL_DEPLOYMENT_LABEL,
    POD,
    SGLANG_ADAPTER,
    VLLM_ADAPTER,
    Kind,
)

Obj = dict[str, Any]
UNREACHABLE = PodResult("", False, "EngineUnreachable", "GET /v1/models failed", retryable=True)


@dataclass
class Fleet:
    """One invocation's view of target pods and what each engine lists (each read once)."""

    deps: Deps
    _endpoints: dict[tuple[str, str, str], list[Endpoint]] = field(default_factory=dict)
    _listings: dict[str, dict[str, str] | None] = field(default_factory=dict)
    _configs: dict[str, bytes | None] = field(default_factory=dict)

    def endpoints(self, kind: Kind, namespace: str, name: str) -> list[Endpoint]:
        key = (kind.plural, namespace, name)
        if key not in self._endpoints:
            label = MODEL_DEPLOYMENT_LABEL if kind == MODEL_DEPLOYMENT else INFERENCE_SERVICE_LABEL
            runtime: Runtime = "vllm" if kind == MODEL_DEPLOYMENT else "sglang"
            pods = self.deps.kube.list_all(POD, namespace, f"{label}={name}")
            found = [endpoint(p, runtime) for p in pods]
            self._endpoints[key] = sorted((e for e in found if e is not None), key=lambda e: e.pod)
        return self._endpoints[key]

    def listings(self, endpoints: Sequence[Endpoint]) -> dict[str, dict[str, str] | None]:
        todo = [e for e in endpoints if e.url not in self._listings]
        for ep, listing in self.deps.engines.fan_out(todo, self.deps.engines.listing):
            self._listings[ep.url] = listing
        return {e.pod: self._listings[e.url] for e in endpoints}

    def listing(self, ep: Endpoint) -> dict[str, str] | None:
        """One pod's listing, read once per invocation (callers serialise per endpoint)."""
        if ep.url not in self._listings:
            self._listings[ep.url] = self.deps.engines.listing(ep)
        return self._listings[ep.url]

    def config(self, adapter: Obj) -> bytes | None:
        """The adapter's `adapter_config.json`: once per invocation, and from the process's
        content cache when stat recorded its MD5 (`Deps.configs`)."""
        path = targets.config_path(adapter)
        if path not in self._configs:
            self._configs[path] = self.deps.configs.get(path, targets.config_md5(adapter))
        return self._configs[path]

    def prefetch_configs(self, adapters: Sequence[Obj]) -> None:
        """Read the configs of many adapters concurrently (bounded) instead of one after another."""
        todo = {targets.config_path(a): a for a in adapters if targets.config_path(a) not in self._configs}
        self.deps.engines.fan_out(list(todo.values()), self.config)  # each call stores its config

    def note_loaded(self, ep: Endpoint, lora_name: str, path: str) -> None:
        listing = self._listings.get(ep.url)
        if listing is not None:
            listing[lora_name] = path

    def note_unloaded(self, ep: Endpoint, lora_name: str) -> None:
        listing = self._listings.get(ep.url)
        if listing is not None:
            listing.pop(lora_name, None)


@dataclass
class Plan:
    """What one adapter needs from one target: a verdict, or per-pod results / pods to observe."""

    adapter: Obj
    target: str
    wanted: targets.Wanted | None
    verdict: str | None = None
    message: str = ""
    results: dict[str, PodResult] = field(default_factory=dict)
    observe: list[tuple[Endpoint, bool]] = field(default_factory=list)
    """(endpoint, mine): pods `execute` lists, and loads into when mine and missing."""
    loaded: list[Endpoint] = field(default_factory=list)
    """Pods this invocation loaded into (see `undo_if_deleted`)."""

    def result(self) -> TargetResult:
        return TargetResult(
            self.target, self.verdict, self.message, tuple(self.results[p] for p in sorted(self.results))
        )


def plan_pods(fleet: Fleet, plan: Plan, endpoints: list[Endpoint], pods_of: set[str] | None = None) -> None:
    """Observe every endpoint; only pods in `pods_of` (all when None) get loads and may ask for a retry.

    The others are still observed so that the status stays a statement about every Ready pod.
    No I/O here: `execute` lists each pod and loads what it lacks, pod by pod (pipelined).
    """
    assert plan.wanted is not None
    for ep in endpoints:
        plan.observe.append((ep, pods_of is None or ep.pod in pods_of))


def execute(fleet: Fleet, plans: Sequence[Plan], load: bool = True, new: bool = False) -> None:
    """List every observed pod and load what it lacks; a failing pod never blocks the others.

    Pipelined per pod (`Engines.pipeline`): a pod's loads are queued as soon as its own
    listing is in, so they overlap the other pods' listings instead of waiting for all of them.
    `new`: the adapter was just verified or admitted, so no pod should have it yet. A pod asked
    for it alone is then not listed: its load call answers the same question ("already loaded"
    is a success) one round-trip sooner, which is what a fan-out into many pods waits on.
    """
    groups: dict[str, tuple[Endpoint, list[tuple[Plan, bool]]]] = {}
    for plan in plans:
        for ep, mine in plan.observe:
            groups.setdefault(ep.url, (ep, []))[1].append((plan, mine))
        plan.observe = []

    def load_one(plan: Plan, ep: Endpoint) -> None:
        assert plan.wanted is not None
        outcome = fleet.deps.engines.load(ep, plan.wanted.lora_name, plan.wanted.lora_path)
        result = PodResult(ep.pod, outcome.ok, outcome.reason, outcome.message, outcome.retryable)
        if result.ok:
            fleet.note_loaded(ep, plan.wanted.lora_name, plan.wanted.lora_path)
        if result.loaded_now:
            plan.loaded.append(ep)
        elif result.ok:  # "already loaded": the engine had it, as a listing would have said
            result = PodResult(ep.pod, True, loading.PRESENT)
        plan.results[ep.pod] = result

    def pod(group: tuple[Endpoint, list[tuple[Plan, bool]]]) -> list[Callable[[], None]]:
        ep, members = group
        if new and load and len(members) == 1 and members[0][1]:
            return [partial(load_one, members[0][0], ep)]
        listing = fleet.listing(ep)
        todo: list[Plan] = []
        for plan, mine in members:
            assert plan.wanted is not None
            if listing is None:
                plan.results[ep.pod] = PodResult(ep.pod, False, UNREACHABLE.reason, UNREACHABLE.message, mine)
            elif plan.wanted.lora_name in listing:
                plan.results[ep.pod] = PodResult(ep.pod, True, loading.PRESENT)
            elif not mine:
                plan.results[ep.pod] = PodResult(ep.pod, False, loading.NOT_LOADED, "not loaded (yet)")
            elif not load:
                plan.results[ep.pod] = PodResult(ep.pod, False, loading.NOT_LOADED, "not loaded")
            else:
                todo.append(plan)
        return [partial(load_one, plan, ep) for plan in todo]

    fleet.deps.engines.pipeline(groups.values(), pod)
    if load:
        undo_if_deleted(fleet, plans)


def undo_if_deleted(fleet: Fleet, plans: Sequence[Plan]) -> None:
    """Take back what this invocation loaded for an adapter that is being deleted meanwhile.

    unload sweeps every pod once the deletionTimestamp is set, then drops the finalizer; a load
    already in flight can land after that sweep and outlive the adapter. Re-reading the adapter
    after our own loads closes the window: if it is now deleting or gone, the sweep we raced
    may have missed our copy, so we remove it ourselves ("not found" counts as done).
    """
    loaded = [plan for plan in plans if plan.loaded and plan.wanted is not None]
    alive = still_alive(fleet.deps, {identity(plan.adapter) for plan in loaded})
    for plan in loaded:
        assert plan.wanted is not None
        if identity(plan.adapter) in alive:
            continue
        lora = plan.wanted.lora_name
        fleet.deps.engines.fan_out(plan.loaded, lambda ep, name=lora: fleet.deps.engines.unload(ep, name))
        plan.loaded = []


Identity = tuple[Kind, str, str]


def identity(adapter: Obj) -> Identity:
    return kind_of(adapter), targets.namespace_of(adapter), targets.name_of(adapter)


def still_alive(deps: Deps, adapters: set[Identity]) -> set[Identity]:
    """Which of `adapters` exist and are not being deleted, read now: one GET for a single
    adapter, one list per kind and namespace for several (a restart reloads 50 at once)."""
    groups: dict[tuple[Kind, str], set[str]] = {}
    for kind, namespace, name in adapters:
        groups.setdefault((kind, namespace), set()).add(name)
    alive: set[Identity] = set()
    for (kind, namespace), names in groups.items():
        if len(names) == 1:
            (name,) = names
            current = deps.kube.get(kind, namespace, name)
            found = [current] if current is not None else []
        else:
            found = [obj for obj in deps.kube.list_all(kind, namespace) if targets.name_of(obj) in names]
        alive |= {(kind, namespace, targets.name_of(obj)) for obj in found if not targets.is_deleting(obj)}
    return alive


# -- seed 1 ---------------------------------------------------------------------------------------
def plan_v1(
    fleet: Fleet, adapter: Obj, deployments: Sequence[Obj], pods_of: set[str] | None = None
) -> list[Plan]:
    """One Plan per deployment naming the adapter (verdicts for model/config problems)."""
    deps = fleet.deps
    name = targets.name_of(adapter)
    config: list[bytes | None] = []
    plans: list[Plan] = []
    for md in sorted(deployments, key=targets.name_of):
        if not targets.references(md, name):
            continue
        md_name = targets.name_of(md)
        if not targets.model_matches(adapter, md):
            message = (
                f"{md_name} serves model {(md.get('spec') or {}).get('model')!r}, "
                f"adapter is for {(adapter.get('spec') or {}).get('model')!r}"
            )
            plans.append(Plan(adapter, md_name, None, loading.R_MODEL_MISMATCH, message))
            continue
        if not config:
            config.append(fleet.config(adapter))
        verdict = adapter_config.check(config[0], targets.max_rank(md, deps.settings.max_lora_rank))
        if not verdict.ok:
            plans.append(Plan(adapter, md_name, None, verdict.reason, verdict.message))
            continue
        plan = Plan(adapter, md_name, targets.wanted_v1(adapter, deps.settings.mount_root))
        endpoints = fleet.endpoints(MODEL_DEPLOYMENT, targets.namespace_of(md), md_name)
        plan_pods(fleet, plan, endpoints, pods_of)
        plans.append(plan)
    return plans


def plan_v2(fleet: Fleet, adapter: Obj, pods_of: set[str] | None = None) -> Plan:
    namespace, name = targets.isvc_ref(adapter)
    label = f"{namespace}/{name}"
    isvc = fleet.deps.kube.get(INFERENCE_SERVICE, namespace, name)
    if isvc is None:
        return Plan(adapter, label, None, loading.R_TARGET_NOT_FOUND, f"InferenceService {label} not found")
    if not targets.isvc_serves(isvc):
        runtime = (isvc.get("spec") or {}).get("runtime")
        message = f"InferenceService {label} runs {runtime!r}, this adapter kind needs sglang"
        return Plan(adapter, label, None, loading.R_RUNTIME_MISMATCH, message)
    plan = Plan(adapter, label, targets.wanted_v2(adapter))
    endpoints = fleet.endpoints(INFERENCE_SERVICE, namespace, name)
    plan_pods(fleet, plan, endpoints, pods_of)
    return plan


# -- status ---------------------------------------------------------------------------------------
def write_v1(
    deps: Deps, adapter: Obj, used: list[str], results: list[TargetResult] | None, fresh: bool = False
) -> None:
    """Write the adapter's status. `fresh`: `adapter` was just read (a GET or a list of this
    invocation), so start from it instead of re-reading; a 409 still re-reads and recomputes."""
    not_ready = results is None and not targets.ready_v1(adapter)

    def desired(obj: Obj) -> Obj:
        generation = (obj.get("metadata") or {}).get("generation")
        return loading.status_v1(obj.get("status") or {}, used, results, generation, deps.clock(), not_ready)

    namespace, name = targets.namespace_of(adapter), targets.name_of(adapter)
    if fresh:
        deps.kube.write_status(VLLM_ADAPTER, namespace, name, desired, current=adapter)
    else:
        deps.kube.write_status(VLLM_ADAPTER, namespace, name, desired)


def write_v2(deps: Deps, adapter: Obj, result: TargetResult, fresh: bool = False) -> None:
    path = str((adapter.get("spec") or {}).get("path") or "")

    def desired(obj: Obj) -> Obj:
        generation = (obj.get("metadata") or {}).get("generation")
        return loading.status_v2(obj.get("status") or {}, result, path, generation, deps.clock())

    namespace, name = targets.namespace_of(adapter), targets.name_of(adapter)
    if fresh:
        deps.kube.write_status(SGLANG_ADAPTER, namespace, name, desired, current=adapter)
    else:
        deps.kube.write_status(SGLANG_ADAPTER, namespace, name, desired)


def write_loaded(deps: Deps, kind: Kind, adapter: Obj, build: Callable[[Obj, int | None], Obj]) -> None:
    def desired(obj: Obj) -> Obj:
        return build(obj.get("status") or {}, (obj.get("metadata") or {}).get("generation"))

    deps.kube.write_status(kind, targets.namespace_of(adapter), targets.name_of(adapter), desired)


def warn(deps: Deps, obj: Obj, reason: str, message: str, component: str) -> None:
    deps.kube.record_event(obj, "Warning", reason, message, component, deps.clock())


def ref_of(adapter: Obj) -> AdapterRef:
    return AdapterRef.model_validate(
        {
            "apiVersion": adapter.get("apiVersion"),
            "namespace": targets.namespace_of(adapter),
            "name": targets.name_of(adapter),
        }
    )


def kind_of(adapter: Obj) -> Kind:
    return SGLANG_ADAPTER if adapter.get("apiVersion") == SGLANG_ADAPTER.api_version else VLLM_ADAPTER


def raise_if_retryable(results: Sequence[TargetResult], what: str) -> None:
    if loading.retryable(results):
        raise EngineUnavailable(f"{what}: {loading.describe_failures(results)}")
