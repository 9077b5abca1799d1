"""The convergence invariant, checked from a fresh full observation of the world.

At quiescence, for both LoRAAdapter kinds:
1. every pod serves exactly what the serving planner (functions/logic/serving.py) says its
   target should serve: each wanted adapter from the adapter's own path and, for vllm, from the
   current verified file set (a pod serving an older set is `stale`); no copy of ours that is
   not wanted (`surplus`); no name served from another adapter's path (`takeover`) or from a
   path that is no adapter's (`wrong-path`); every Ready pod answers its listing;
2. every status field equals what a fresh full observation would write: the production pure
   decisions (admit, stat, verify, then the serving report) are re-run on fresh data
   (Kubernetes objects, the storage listing, the engines' own `GET /v1/models`) and the result
   is compared with the stored status, ignoring only timestamps (`lastTransitionTime`,
   `lastLoadedAt`, which must be set when the adapter is loaded somewhere);
3. no finalizer of ours is left on a deleted adapter, and every live adapter carries it;
4. capacity: no pod is asked to hold more than its engine can (`over-capacity`: what it lists
   plus what the planner would still load passes its capacity), an adapter left out by capacity
   is not `missing`, and where the engine is a stand-in (its `/_devstack/state` answers) no
   SGLang engine evicted an adapter (`evicted`: a load made it put out a wanted one) and no name
   was loaded twice since the engine's last start while it evicted (`load-evict-loop`);
5. integrity: where a vLLM engine is a stand-in, the weights it holds for a request to use
   (its CPU cache's current entries, with the MD5s of the files it read) of a Ready adapter's
   copy are the adapter's verified set, spec.integrity.md5 (`unverified`): whatever happened
   to the frozen copy since it was made, what is served is what verify accepted.

The engines are only listed: the check has no side effects.
"""

from __future__ import annotations

import json
import tempfile
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from contextlib import ExitStack, closing, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from functions import admit, stat, verify
from functions.adapters import fleet
from functions.adapters.kube import Kube, connect
from functions.edge.bootstrap import Deps
from functions.logic import facts, integrity, loaded, reasons, serving
from functions.logic.serving import AdapterKey, ListingFailure, TargetKey
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
NOT_READY_LOADED_REASONS = frozenset({reasons.ADAPTER_NOT_READY, reasons.NOT_REFERENCED, reasons.UNLOADED})
"""vllm, not Ready: unload's clean-up and load's verdict both say "not loaded"; either is true."""


@dataclass(frozen=True)
class Violation:
    rule: str
    """missing | stale | surplus | takeover | wrong-path | unreachable | status | finalizer |
    last-loaded-at | over-capacity | evicted | load-evict-loop | unverified"""
    subject: str
    detail: str

    def __str__(self) -> str:
        return f"[{self.rule}] {self.subject}: {self.detail}"


# -- the world ---------------------------------------------------------------------------------
@contextmanager
def deps_for(source: Any) -> Iterator[Deps]:
    """Production clients pointed at a running Stack (admin kubeconfig: RBAC is not the point);
    on a Testbed, the functions' own (they run in this process, configured by its environment);
    a Deps as it is given (its owner closes it). What this builds is closed when the block ends,
    and the Testbed's admin kubeconfig is written into a directory removed then."""
    if isinstance(source, Deps):
        yield source
        return
    with ExitStack() as opened:
        if not hasattr(source, "admin_kubeconfig"):  # a Testbed: the functions' settings, as admin
            from functions.edge.bootstrap import deps

            directory = Path(opened.enter_context(tempfile.TemporaryDirectory(prefix="loraflow-invariant-")))
            admin = source.kube.write_kubeconfig(directory / "admin.kubeconfig", source.kube.admin_token)
            settings = deps().settings.model_copy(update={"kubeconfig": str(admin)})
        else:
            settings = Settings(
                filer_url=source.filer.url,
                mount_root=str(source.mount_root),
                kubeconfig=str(source.admin_kubeconfig),
                engine_timeout=5.0,
                loopback_engines="allow",
            )
        # the Kubernetes client as Deps builds it, given here: Deps.close() closes what it built,
        # and functions.adapters.kube.Kube has no close() of its own (its KubeApi has)
        kube = Kube(opened.enter_context(closing(connect(settings.kubeconfig))))
        yield opened.enter_context(closing(Deps(settings, kube=kube)))


def observe(
    deps: Deps, namespaces: Iterable[str] | None = None
) -> tuple[fleet.Observed, set[tuple[str, str]]]:
    """Every adapter, target, Ready pod, listing and config (of `namespaces`), and the Models."""
    wanted = set(namespaces) if namespaces is not None else None
    kube = deps.kube

    def keep(obj: Obj) -> bool:
        return wanted is None or facts.namespace_of(obj) in wanted

    adapters = frozenset(
        [
            AdapterKey("vllm", facts.namespace_of(o), facts.name_of(o))
            for o in kube.iter(VLLM_ADAPTER)
            if keep(o)
        ]
        + [
            AdapterKey("sglang", facts.namespace_of(o), facts.name_of(o))
            for o in kube.iter(SGLANG_ADAPTER)
            if keep(o)
        ]
    )
    targets = frozenset(
        [
            TargetKey("ModelDeployment", facts.namespace_of(o), facts.name_of(o))
            for o in kube.iter(MODEL_DEPLOYMENT)
            if keep(o)
        ]
        + [
            TargetKey("InferenceService", facts.namespace_of(o), facts.name_of(o))
            for o in kube.iter(INFERENCE_SERVICE)
            if keep(o)
        ]
    )
    request = fleet.Request(adapters=adapters, targets=targets, load=False, every_deployment=True)
    models = {(facts.namespace_of(m), facts.name_of(m)) for m in kube.iter(MODEL)}
    return fleet.observe(deps, request), models


def _path(obj: Mapping[str, Any]) -> str:
    return f"{facts.namespace_of(obj)}/{facts.name_of(obj)}"


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


# -- fresh statuses ------------------------------------------------------------------------------
def fresh_admission(deps: Deps, observed: fleet.Observed, models: set[tuple[str, str]], obj: Obj) -> Obj:
    """The object with the status admit (and for vllm stat, verify) would write on fresh data."""
    namespace = facts.namespace_of(obj)
    if obj.get("apiVersion") == SGLANG_ADAPTER.api_version:
        adapter = SGLangAdapter.model_validate(obj)
        key = facts.isvc_ref(obj)
        found = observed.targets.get(key)
        target = InferenceService.model_validate(found) if found is not None else None
        return {**obj, "status": admit.decide_sglang(adapter, target, NOW).to_wire()}
    vllm = LoRAAdapter.model_validate(obj)
    exists = admit.model_name_valid(vllm.spec.model) and (namespace, vllm.spec.model) in models
    vllm = vllm.model_copy(update={"status": admit.decide_vllm(vllm, exists, NOW)})
    directory = stat.listing_dir(vllm)
    if directory is not None:
        vllm = vllm.model_copy(update={"status": stat.decide(vllm, deps.storage.stat_dir(directory), NOW)})
    observed_files = verify.observed_files(vllm)
    limit = deps.settings.hash_max_bytes
    hashed = {
        path: deps.storage.hash_file(path, limit) if limit > 0 else None
        for path in integrity.to_hash(verify.declared(vllm), observed_files)
    }
    return {**obj, "status": verify.decide(vllm, hashed, NOW).to_wire()}


def fresh_world(
    deps: Deps, observed: fleet.Observed, models: set[tuple[str, str]]
) -> tuple[serving.World, dict[AdapterKey, Obj]]:
    """The observed world with each adapter as its fresh admission status makes it."""
    fresh: dict[AdapterKey, Obj] = {}
    adapters = dict(observed.world.adapters)
    for key, obj in observed.objects.items():
        if facts.deleting(obj):
            continue
        fresh[key] = after = fresh_admission(deps, observed, models, obj)
        before = adapters[key]
        if key.kind == "vllm":
            adapters[key] = facts.vllm_adapter(after, deps.settings.mount_root, before.config)._replace(
                served=before.served
            )
        else:
            adapters[key] = facts.sglang_adapter(after)
    return observed.world._replace(adapters=adapters), fresh


def fresh_status(world: serving.World, desire: serving.Desire, key: AdapterKey, obj: Obj) -> Obj:
    adapter = world.adapters[key]
    report = serving.serving_report(world, desire, key)
    status = dict(facts.status(obj))
    generation = facts.meta(obj).get("generation")
    if key.kind == "vllm":
        used = [t.name for t in desire.targets_of.get(key, ())]
        return loaded.vllm_status(
            status, report if adapter.serve == "serve" else None, used, adapter.serve, generation, NOW
        )
    served = adapter.serve == "serve"
    return loaded.sglang_status(
        status, report, adapter.lora_path, generation, NOW, serving.redacted(adapter), served
    )


def check_status(
    world: serving.World, desire: serving.Desire, key: AdapterKey, stored: Obj, fresh_obj: Obj
) -> list[Violation]:
    subject = f"LoRAAdapter({key.kind}) {key}"
    fresh = fresh_status(world, desire, key, fresh_obj)
    have = dict(facts.status(stored))
    if key.kind == "vllm" and world.adapters[key].serve == "drop":
        # not Ready: Loaded must not claim anything; which "not loaded" reason is a matter of
        # which step wrote last (load: AdapterNotReady, unload: NotReferenced/Unloaded)
        found = next((c for c in have.get("conditions") or [] if c.get("type") == reasons.LOADED), None)
        out = diff_status(subject, _without_loaded(have), _without_loaded(fresh))
        if found is not None and (
            found.get("status") != "False" or found.get("reason") not in NOT_READY_LOADED_REASONS
        ):
            out.append(Violation("status", subject, f"not Ready but condition Loaded is {_short(found)}"))
        return out
    out = diff_status(subject, have, fresh)
    if (
        key.kind == "sglang"
        and fresh.get("loadedPath")
        and not have.get("lastLoadedAt")
        and world.adapters[key].serve == "serve"
    ) and any(
        p.state == "serving" for t in serving.serving_report(world, desire, key).targets for p in t.pods
    ):
        out.append(Violation("last-loaded-at", subject, "loaded in a Ready pod but lastLoadedAt is not set"))
    return out


def _without_loaded(status: Obj) -> Obj:
    conds = [c for c in status.get("conditions") or [] if c.get("type") != reasons.LOADED]
    return {**status, "conditions": conds}


# -- engines -------------------------------------------------------------------------------------
def check_engines(world: serving.World, desire: serving.Desire) -> list[Violation]:
    out: list[Violation] = []
    for target, pods in sorted(world.pods.items()):
        claims = desire.wanted.get(target, {})
        for pod in pods:
            subject = f"{target.kind} {target} pod {pod.name}"
            listing = pod.listing
            if isinstance(listing, ListingFailure) or listing is None:
                out.append(
                    Violation("unreachable", subject, "Ready pod whose engine does not answer GET /v1/models")
                )
                continue
            room = serving.room(world, desire, pod)
            for lora, claim in sorted(claims.items()):
                state = serving.pod_state(world, claim, listing, pod.name)
                root = listing.get(lora, "")
                if state == "absent" and room.fits is not None and lora not in room.fits:
                    continue  # left out by capacity: its status says so (checked with the others)
                if state == "absent" and claim.load:
                    out.append(Violation("missing", subject, f"{lora} should be loaded here and is not"))
                elif state == "stale" and claim.load:
                    out.append(
                        Violation("stale", subject, f"{lora} serves an older file set than {claim.file_set}")
                    )
                elif state == "occupied":
                    owner = serving.owner_of_copy(world, target, lora, root)
                    rule = "takeover" if owner is not None and owner != claim.adapter else "wrong-path"
                    out.append(
                        Violation(
                            rule,
                            subject,
                            f"{lora} is served from {root}, wanted {claim.lora_path} ({claim.adapter})",
                        )
                    )
            for lora, root in sorted(listing.items()):
                owner = serving.owner_of_copy(world, target, lora, root)
                wanted = claims.get(lora)
                if owner is not None and (wanted is None or wanted.adapter != owner):
                    out.append(
                        Violation("surplus", subject, f"{lora} ({root}) is loaded here and should not be")
                    )
    return out


PodKey = tuple[TargetKey, str]


def stand_in_states(observed: fleet.Observed) -> dict[PodKey, Obj]:
    """Each Ready pod's `/_devstack/state` where its engine is a stand-in (read once per check)."""
    out: dict[PodKey, Obj] = {}
    for target, pods in observed.world.pods.items():
        for pod in pods:
            endpoint = observed.endpoints.get((target, pod.name))
            state = _stand_in_state(endpoint.url) if endpoint is not None else None
            if state is not None:
                out[(target, pod.name)] = state
    return out


def check_capacity(
    observed: fleet.Observed, desire: serving.Desire, states: Mapping[PodKey, Obj]
) -> list[Violation]:
    """Rule 4: what the planner asks of each bounded pod fits it; stand-in engines say whether
    they evicted or reloaded in a loop."""
    out: list[Violation] = []
    world = observed.world
    for target, pods in sorted(world.pods.items()):
        for pod in pods:
            subject = f"{target.kind} {target} pod {pod.name}"
            cap = pod.capacity
            listing = pod.listing
            if (
                cap is not None
                and cap.slots is not None
                and cap.evicts_listed
                and isinstance(listing, Mapping)
            ):
                actions = serving.plan_pod(world, desire, pod, serving.Scope())
                held = (
                    len(listing)
                    + sum(a.op == "load" for a in actions)
                    - sum(a.op == "unload" for a in actions)
                )
                if held > cap.slots:
                    detail = (
                        f"would hold {held} adapter(s), its engine holds at most {cap.slots} ({cap.source})"
                    )
                    out.append(Violation("over-capacity", subject, detail))
            state = states.get((target, pod.name))
            if state is None or state.get("engine") != "sglang":
                continue
            if state.get("evictions"):
                detail = f"the engine evicted {state['evictions']} adapter(s) to make room for a load"
                out.append(Violation("evicted", subject, detail))
            since = float(state.get("restarted_at") or 0.0)
            counts: dict[str, int] = {}
            for load in state.get("loads") or []:
                if load.get("ok") and float(load.get("start") or 0.0) >= since:
                    counts[str(load.get("name"))] = counts.get(str(load.get("name")), 0) + 1
            looping = sorted(n for n, c in counts.items() if c > 1)
            if looping and state.get("evictions"):
                detail = f"loaded more than once since its start while evicting: {', '.join(looping[:10])}"
                out.append(Violation("load-evict-loop", subject, detail))
    return out


def verified_files(obj: Obj, adapter: serving.Adapter) -> dict[str, str] | None:
    """The verified set as an engine reads it from the adapter's directory (file name -> MD5),
    when the adapter is served from the set its spec declares; None otherwise (a held set's
    MD5s are no longer declared anywhere, and `stale` covers pods serving one)."""
    if adapter.serve != "serve":
        return None
    declared = LoRAAdapter.model_validate(obj).declared_md5s()
    directory = facts.storage_dir(obj)
    if not declared or directory is None or facts.file_set(declared) != adapter.file_set:
        return None
    base = directory.rstrip("/") + "/"
    out: dict[str, str] = {}
    for path, md5 in declared.items():
        rel = path[len(base) :] if path.startswith(base) else ""
        if rel and "/" not in rel:  # the engines read the directory's own files, not its subdirectories
            out[rel] = md5.strip().lower()
    return out


def check_integrity(observed: fleet.Observed, states: Mapping[PodKey, Obj]) -> list[Violation]:
    """Rule 5: each stand-in vLLM engine's cached weights of a Ready adapter's copy are its
    verified files, byte for byte as their MD5s say."""
    expected: dict[str, tuple[AdapterKey, dict[str, str]]] = {}
    for key, obj in observed.objects.items():
        adapter = observed.world.adapters.get(key)
        if key.kind != "vllm" or adapter is None or facts.deleting(obj):
            continue
        files = verified_files(obj, adapter)
        if files is not None:
            expected[adapter.lora_path] = (key, files)
    out: list[Violation] = []
    for (target, pod), state in sorted(states.items()):
        if state.get("engine") != "vllm":
            continue
        memory = state.get("memory") or {}
        for entry in memory.get("cpu") or []:
            found = expected.get(str(entry.get("path")))
            if not entry.get("current") or found is None:
                continue
            key, want = found
            have = {str(k): str(v) for k, v in (entry.get("md5s") or {}).items()}
            if have == want:
                continue
            wrong = sorted(n for n in set(have) | set(want) if have.get(n) != want.get(n))
            detail = (
                f"{entry.get('name')} ({key}) holds weights read from {entry.get('path')} that are not its "
                f"verified set: {', '.join(f'{n} MD5 {have.get(n)}, verified {want.get(n)}' for n in wrong)}"
            )
            out.append(Violation("unverified", f"{target.kind} {target} pod {pod}", detail))
    return out


def _stand_in_state(url: str) -> Obj | None:
    """A stand-in engine's `/_devstack/state` (None for a real engine, or no answer)."""
    try:
        with urllib.request.urlopen(url + "/_devstack/state", timeout=5) as answer:
            state = json.loads(answer.read())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


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
    with deps_for(source) as deps:
        return _check(deps, namespaces)


def _check(deps: Deps, namespaces: Iterable[str] | None) -> list[Violation]:
    observed, models = observe(deps, namespaces)
    states = stand_in_states(observed)
    out = check_engines(observed.world, serving.desired(observed.world))
    out += check_capacity(observed, serving.desired(observed.world), states)
    out += check_integrity(observed, states)
    world, fresh = fresh_world(deps, observed, models)
    desire = serving.desired(world)
    for key, obj in sorted(observed.objects.items()):
        out += check_finalizer(obj, "rackai" if key.kind == "vllm" else "sglang")
        if key in fresh:
            out += check_status(world, desire, key, obj, fresh[key])
    return out


def report(violations: list[Violation], limit: int = 20) -> str:
    lines = [str(v) for v in violations[:limit]]
    if len(violations) > limit:
        lines.append(f"... and {len(violations) - limit} more")
    return "\n".join(lines)
