"""admit: accept a LoRAAdapter's spec, set its storage path and finalizer, say what is wrong.

Trigger: `dev.knative.apiserver.resource.add|update` for kind LoRAAdapter (either apiVersion);
    `io.loraflow.adapter.drifted.v1` with extension `loraflowstep=admit`;
    `dev.knative.apiserver.resource.add` for kind Model: the vllm adapters of its namespace
    that wait for it (Ready False `ModelNotFound`) are admitted again at once.
Reads: the adapter (re-read by name; the event data is only a reference), except for an update
    whose object shows its generation admitted and our finalizer on it (a later step's status
    write): 204 from the event, no read (`admitted`); vllm: the Model
    `spec.model` in the adapter's namespace; sglang: the InferenceService of
    `spec.inferenceServiceRef` (namespace defaults to the adapter's).
Writes: metadata.finalizers += `loraflow.io/unload` (first), then one status write.
    vllm: storageRef.path, observedGeneration, Ready (False `ModelNotFound` /
    `IntegrityPathOutsideAdapter`; Unknown `Admitted` when admission passes and no later
    step has a verdict yet), phase, ready. sglang: Available (True `InferenceServiceReady`;
    False `InferenceServiceNotFound` / `RuntimeMismatch`), Error (True with the same reason,
    else False `NoError`; Error reasons set by other steps are left alone).
    A Warning Event is recorded on a transition into a failure reason.
Replies: `io.loraflow.adapter.admitted.v1` only when a write changed something (first
    admission, new generation, a verdict that moved); our own status writes come back as
    update events and end here as no-ops.
    For a Model, each admitted event is published to the Broker (one reply carries one event).
Outcomes: 200 + admitted; 204 nothing changed / object gone / being deleted (unload owns it)
    / another kind; 400 malformed event or names; 503 Kubernetes API unavailable or conflicts
    that outlasted the bounded re-reads.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from cloudevents.http import CloudEvent

from events.domain import ADAPTER_ADMITTED, ADAPTER_DRIFTED, AdapterAdmitted, AdapterRef
from events.external import API_ADD, API_UPDATE
from functions.edge import messages, shell
from functions.edge.bootstrap import Deps
from functions.edge.inputs import adapter_ref, kube_object, stored
from functions.errors import Reject
from functions.logic import conditions, drift, facts, phase, serving
from functions.logic.paths import adapter_dir, check_label, check_subdomain, is_under
from functions.resources.inference import InferenceService, SGLangAdapter, SGLangAdapterStatus
from functions.resources.kinds import (
    ADAPTER_KINDS,
    FINALIZER,
    INFERENCE_SERVICE,
    MODEL,
    VLLM_ADAPTER,
    Kind,
    by_api_version_and_kind,
)
from functions.resources.rackai import LoRAAdapter, LoRAAdapterStatus, StorageRef

NAME = "admit"
ACCEPTS = (API_ADD, API_UPDATE, ADAPTER_DRIFTED)
WARNING_REASONS = phase.ADMIT_FAILURES | phase.ADMIT_ERRORS

Obj = dict[str, Any]


# -- pure ------------------------------------------------------------------------------------
def _valid(check: Callable[[str, str], str], value: str | None) -> bool:
    if not value:
        return False
    try:
        check(value, "name")
    except Reject:
        return False
    return True


def model_name_valid(model: str) -> bool:
    return _valid(check_subdomain, model)


def decide_vllm(adapter: LoRAAdapter, model_exists: bool, now: datetime) -> LoRAAdapterStatus:
    """The whole vllm status after admission (other steps' fields kept as they are)."""
    meta = adapter.metadata
    namespace, name, model = meta.namespace or "", meta.name or "", adapter.spec.model
    status = adapter.status or LoRAAdapterStatus()
    generation = meta.generation
    directory: str | None = None
    if model_name_valid(model):
        try:
            directory = adapter_dir(namespace, model, name)
        except Reject:
            directory = None
    declared_md5s = adapter.declared_md5s()
    declared = sorted(declared_md5s)
    outside = [k for k in declared if directory is None or not is_under(k, directory)]

    current = conditions.find(status.conditions, phase.READY)
    conds = status.conditions
    if directory is None or not model_exists:
        conds = conditions.set_condition(
            conds,
            phase.READY,
            "False",
            phase.MODEL_NOT_FOUND,
            f"Model {model!r} not found in namespace {namespace!r}",
            generation,
            now,
        )
    elif outside:
        conds = conditions.set_condition(
            conds,
            phase.READY,
            "False",
            phase.INTEGRITY_PATH_OUTSIDE_ADAPTER,
            f"spec.integrity.md5 keys must lie under {directory}: "
            + ", ".join(outside[:20])
            + (f" and {len(outside) - 20} more" if len(outside) > 20 else ""),
            generation,
            now,
        )
    elif current is None or current.reason in phase.ADMIT_FAILURES or current.reason == phase.ADMITTED:
        conds = conditions.set_condition(
            conds,
            phase.READY,
            "Unknown",
            phase.ADMITTED,
            "Spec accepted; waiting for the storage observation and the integrity check",
            generation,
            now,
        )
    elif (
        current.status == "True"
        and status.file_set
        and status.file_set != facts.file_set(dict(declared_md5s))
    ):
        # spec.integrity changed after verify accepted a set: Ready is not True for MD5s the spec
        # no longer declares; the pods keep serving the verified set until verify rules
        conds = conditions.set_condition(
            conds,
            phase.READY,
            "Unknown",
            phase.AWAITING_VERIFICATION,
            "spec.integrity.md5 changed; waiting for the integrity check",
            generation,
            now,
        )
    phase_, ready = phase.summarize(conds, bool(status.files))
    return status.model_copy(
        update={
            "conditions": conds,
            "storage_ref": StorageRef(path=directory) if directory else None,
            "observed_generation": generation,
            "phase": phase_,
            "ready": ready,
        }
    )


def decide_sglang(
    adapter: SGLangAdapter, target: InferenceService | None, now: datetime, roots: Sequence[str] = ("/",)
) -> SGLangAdapterStatus:
    """The whole sglang status after admission: Available and (admit's part of) Error.

    Consent and paths are the serving planner's rules (functions/logic/serving.py): an
    InferenceService in another namespace must accept this one, and spec.path must be absolute,
    normalised and under one of `roots` (LORAFLOW_SGLANG_ROOTS)."""
    meta = adapter.metadata
    ref = adapter.spec.inference_service_ref
    where = f"{ref.namespace or meta.namespace}/{ref.name}"
    status = adapter.status or SGLangAdapterStatus()
    generation = meta.generation
    reason: str
    if target is None:
        ok, reason, message = False, phase.INFERENCE_SERVICE_NOT_FOUND, f"InferenceService {where} not found"
    elif target.spec.runtime != "sglang":
        ok, reason = False, phase.RUNTIME_MISMATCH
        message = (
            f"InferenceService {where} runs runtime {target.spec.runtime!r}; this adapter kind needs 'sglang'"
        )
    elif (meta.namespace or "") != (ref.namespace or meta.namespace) and not accepted(
        target, meta.namespace or ""
    ):
        ok, reason = False, phase.REFERENCE_NOT_PERMITTED
        message = f"InferenceService {where} does not accept adapters from namespace {meta.namespace!r}"
    elif not serving.confined(adapter.spec.path, roots):
        ok, reason = False, phase.PATH_NOT_ALLOWED
        message = f"spec.path {adapter.spec.path!r} is not absolute and normalised under an allowed root"
    else:
        ok, reason, message = True, phase.INFERENCE_SERVICE_READY, f"InferenceService {where} runs sglang"
    conds = conditions.set_condition(
        status.conditions, phase.AVAILABLE, "True" if ok else "False", reason, message, generation, now
    )
    error = conditions.find(conds, phase.ERROR)
    if not ok:
        conds = conditions.set_condition(conds, phase.ERROR, "True", reason, message, generation, now)
    elif error is None or error.reason in phase.ADMIT_ERRORS:
        conds = conditions.set_condition(
            conds, phase.ERROR, "False", phase.NO_ERROR, "No reconcile step reports an error", generation, now
        )
    return status.model_copy(update={"conditions": conds})


def accepted(target: InferenceService, namespace: str) -> bool:
    allowed = facts.accepted_from(target.metadata.annotations)
    return serving.ACCEPT_ALL in allowed or namespace in allowed


# -- shell -----------------------------------------------------------------------------------
def _verdict(kind: Kind, obj: Obj | None) -> Mapping[str, Any] | None:
    """The adapter's Ready (vllm) or Available (sglang) condition."""
    return (
        None
        if obj is None
        else facts.condition(obj, phase.READY if kind == VLLM_ADAPTER else phase.AVAILABLE)
    )


def _ready_reason(kind: Kind, obj: Obj | None) -> str | None:
    found = _verdict(kind, obj)
    return None if found is None or found.get("status") == "True" else str(found.get("reason"))


def _parse(kind: Kind, obj: Obj) -> LoRAAdapter | SGLangAdapter:
    return stored(LoRAAdapter, obj) if kind == VLLM_ADAPTER else stored(SGLangAdapter, obj)


def handle(event: CloudEvent, deps: Deps) -> CloudEvent | None:
    if event["type"] == ADAPTER_DRIFTED:
        ref = adapter_ref(event)
        return admit_one(deps, ADAPTER_KINDS[ref.api_version], ref.namespace, ref.name)
    obj = kube_object(event)
    kind = by_api_version_and_kind(obj["apiVersion"], obj["kind"])
    if kind == MODEL and event["type"] == API_ADD:
        on_model(deps, obj)
        return None
    if kind is None or kind not in ADAPTER_KINDS.values() or facts.deleting(obj):
        return None
    if event["type"] == API_UPDATE and admitted(kind, obj):
        return None
    return admit_one(deps, kind, obj["metadata"]["namespace"], obj["metadata"]["name"])


def admitted(kind: Kind, obj: Obj) -> bool:
    """The update's object shows its generation admitted and our finalizer on it: the update is a
    later step's status write (stat, verify and load write three or more per adapter) or a
    metadata edit admission does not read, so it is answered without reading anything.

    Admission reads the spec (a new one bumps the generation, which this check sees) and the
    Model or InferenceService, whose changes reach admit through their own events and resync's
    drift check (the same rule: `drift.admit_reason`), never through the adapter's update. An
    old snapshot answered here cannot hide a newer spec: that spec's own update follows, and
    if it is lost the resync tick nudges admit. controller-runtime's GenerationChangedPredicate
    drops the same updates; re-reading would cost two GETs per status write of every adapter."""
    finalizers = facts.meta(obj).get("finalizers") or []
    return FINALIZER in finalizers and drift.admit_reason(obj, sglang=kind != VLLM_ADAPTER) is None


def on_model(deps: Deps, model: Obj) -> None:
    """A Model appeared: admit again the vllm adapters of its namespace that wait for it,
    publishing each admitted event (the resync tick would have found them later)."""
    namespace, name = model["metadata"]["namespace"], model["metadata"]["name"]
    for adapter in deps.kube.iter(VLLM_ADAPTER, namespace):
        waits = facts.spec(adapter).get("model") == name
        if waits and _ready_reason(VLLM_ADAPTER, adapter) == phase.MODEL_NOT_FOUND:
            admitted = admit_one(deps, VLLM_ADAPTER, namespace, adapter["metadata"]["name"])
            if admitted is not None:
                deps.broker.publish(admitted)


def admit_one(deps: Deps, kind: Kind, namespace: str, name: str) -> CloudEvent | None:
    """Finalizer, then the status admission decides; the admitted event when either changed."""
    kube = deps.kube
    obj = kube.get(kind, namespace, name)
    if obj is None or facts.deleting(obj):
        return None
    now = deps.clock()

    def finalizers(current: Obj) -> list[str] | None:
        present = list(facts.meta(current).get("finalizers") or [])
        return None if facts.deleting(current) or FINALIZER in present else [*present, FINALIZER]

    added = kube.write_finalizers(kind, namespace, name, finalizers)
    if added is None:
        return None

    models: dict[str, bool] = {}
    services: dict[tuple[str, str], InferenceService | None] = {}
    seen: dict[str, Obj] = {}

    def desired(current: Obj) -> Obj | None:
        seen["before"] = current
        if facts.deleting(current):
            return None
        adapter = _parse(kind, current)
        if isinstance(adapter, LoRAAdapter):
            model = adapter.spec.model
            if model not in models:
                models[model] = model_name_valid(model) and kube.get(MODEL, namespace, model) is not None
            return adapter_status_wire(decide_vllm(adapter, models[model], now))
        ref = adapter.spec.inference_service_ref
        key = (ref.namespace or namespace, ref.name)
        if key not in services:
            services[key] = None
            if _valid(check_label, key[0]) and _valid(check_subdomain, key[1]):
                found = kube.get(INFERENCE_SERVICE, key[0], key[1])
                services[key] = stored(InferenceService, found) if found is not None else None
        return adapter_status_wire(
            decide_sglang(adapter, services[key], now, deps.settings.sglang_root_paths())
        )

    written = kube.write_status(kind, namespace, name, desired)
    if written is None:
        return None
    before, after = _ready_reason(kind, seen.get("before")), _ready_reason(kind, written.obj)
    if after in WARNING_REASONS and after != before and written.changed:
        message = _condition_message(kind, written.obj)
        kube.record_event(written.obj, "Warning", after, message, NAME, now)
    if not (written.changed or added.changed):
        return None
    generation = int(facts.meta(written.obj).get("generation") or 0)
    ref_out = AdapterRef.model_validate(
        {"apiVersion": kind.api_version, "namespace": namespace, "name": name}
    )
    return messages.reply(
        ADAPTER_ADMITTED,
        NAME,
        kind.path(namespace, name),
        AdapterAdmitted(adapter=ref_out, generation=generation),
    )


def adapter_status_wire(status: LoRAAdapterStatus | SGLangAdapterStatus) -> Obj:
    return status.to_wire()


def _condition_message(kind: Kind, obj: Obj) -> str:
    found = _verdict(kind, obj)
    return str(found.get("message") or "") if found is not None else ""


admit = shell.function(NAME, ACCEPTS, handle)
