"""admit: accept a LoRAAdapter's spec, set its storage path and finalizer, say what is wrong.

Trigger: `dev.knative.apiserver.resource.add|update` for kind LoRAAdapter (either apiVersion);
    `io.loraflow.adapter.drifted.v1` with extension `loraflowstep=admit`;
    `dev.knative.apiserver.resource.add` for kind Model: the vllm adapters of its namespace
    that wait for it (Ready False `ModelNotFound`) are admitted again at once.
Reads: the adapter (re-read by name; the event data is only a reference), except for an update
    whose object shows its generation admitted and our finalizer on it (a later step's status
    write): 204 from the event, no read (`admitted`), and an add or update that shows a
    deletion (`pass_on_deletion`); vllm: the Model
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
    `io.loraflow.adapter.deleting.v1`, from the event, no read, when its object shows a
    deletion held by our finalizer: unload takes the adapter out of the engines. Every update
    of an adapter comes here anyway, so a status write wakes one function, not admit and
    unload both; unload re-reads the adapter, and resync nudges it if this reply is lost.
Outcomes: 200 + admitted or deleting; 204 nothing changed / object gone / deleted without our
    finalizer / another kind; 400 malformed event or names; 503 Kubernetes API unavailable or
    conflicts that outlasted the bounded re-reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from functools import partial
from typing import Any

from cloudevents.http import CloudEvent

from events.domain import (
    ADAPTER_ADMITTED,
    ADAPTER_DELETING,
    ADAPTER_DRIFTED,
    AdapterAdmitted,
    AdapterDeleting,
    AdapterRef,
)
from events.external import API_ADD, API_UPDATE
from functions.edge import messages, shell
from functions.edge.bootstrap import Deps
from functions.edge.inputs import adapter_ref, kube_object, stored
from functions.errors import KubeConflict
from functions.logic import admission, drift, facts, phase
from functions.logic.admission import accepted as accepted
from functions.logic.admission import decide_sglang as decide_sglang
from functions.logic.admission import decide_vllm as decide_vllm
from functions.logic.admission import model_name_valid as model_name_valid
from functions.ports import Written
from functions.resources.inference import InferenceService, SGLangAdapter
from functions.resources.kinds import (
    ADAPTER_KINDS,
    FINALIZER,
    INFERENCE_SERVICE,
    MODEL,
    VLLM_ADAPTER,
    Kind,
    by_api_version_and_kind,
)
from functions.resources.rackai import LoRAAdapter

NAME = "admit"
ACCEPTS = (API_ADD, API_UPDATE, ADAPTER_DRIFTED)
WARNING_REASONS = phase.ADMIT_FAILURES | phase.ADMIT_ERRORS
READ_ROUNDS = 3
"""Times the spec may name another Model or InferenceService under one admission before it
answers 503 (each change is its own update event, which admits it again anyway)."""

Obj = dict[str, Any]


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
    if kind is None or kind not in ADAPTER_KINDS.values():
        return None
    if facts.deleting(obj):
        return pass_on_deletion(deps, kind, obj)
    if event["type"] == API_UPDATE and admitted(kind, obj):
        return None
    return admit_one(deps, kind, obj["metadata"]["namespace"], obj["metadata"]["name"])


def pass_on_deletion(deps: Deps, kind: Kind, obj: Obj) -> CloudEvent | None:
    """The deletion an add or update shows, passed on to unload while our finalizer holds it
    (without it, nothing of ours waits on the adapter)."""
    if not facts.deletion_held(obj):
        return None
    namespace, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
    return messages.reply(
        ADAPTER_DELETING,
        NAME,
        kind.path(namespace, name),
        AdapterDeleting(adapter=_ref(kind, namespace, name)),
        schema_base_url=deps.settings.schema_base_url,
    )


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

    # each write starts from the object the request before it returned: no GET between them
    added = kube.write_finalizers(kind, namespace, name, finalizers, current=obj)
    if added is None:
        return None
    written = write_admission(deps, kind, namespace, name, added.obj, now)
    if written is None:
        return None
    before = written.before if written.before is not None else written.obj
    after = _ready_reason(kind, written.obj)
    if after in WARNING_REASONS and after != _ready_reason(kind, before) and written.changed:
        message = _condition_message(kind, written.obj)
        kube.record_event(written.obj, "Warning", after, message, NAME, now)
    if not (written.changed or added.changed):
        return None
    generation = int(facts.meta(written.obj).get("generation") or 0)
    return messages.reply(
        ADAPTER_ADMITTED,
        NAME,
        kind.path(namespace, name),
        AdapterAdmitted(adapter=_ref(kind, namespace, name), generation=generation),
        schema_base_url=deps.settings.schema_base_url,
    )


def _ref(kind: Kind, namespace: str, name: str) -> AdapterRef:
    return AdapterRef.model_validate({"apiVersion": kind.api_version, "namespace": namespace, "name": name})


def write_admission(
    deps: Deps, kind: Kind, namespace: str, name: str, seen: Obj, now: datetime
) -> Written | None:
    """The status write, with the Model or InferenceService read before it from `seen` (the
    adapter as the finalizer write left it, which the write starts from: its resourceVersion
    guards the patch). A newer object met after a 409 that names another one is left alone:
    that one is read, and the write starts again."""
    roots = deps.settings.sglang_root_paths()
    found = admission.Found()
    parsed: dict[str, LoRAAdapter | SGLangAdapter] = {}

    def adapter_of(obj: Obj) -> LoRAAdapter | SGLangAdapter:
        # validated once per resourceVersion: a status listing many files is costly to validate
        version = str(facts.meta(obj).get("resourceVersion") or "")
        if not version:
            return _parse(kind, obj)
        if version not in parsed:
            parsed.clear()
            parsed[version] = _parse(kind, obj)
        return parsed[version]

    def desired(current: Obj, found: admission.Found, missing: list[Obj]) -> Obj | None:
        if facts.deleting(current):
            return None
        decided = admission.decide(adapter_of(current), found, now, roots)
        if isinstance(decided, admission.Lookup):
            missing.append(current)
            return None
        return decided.to_wire()

    for _ in range(READ_ROUNDS):
        lookup = None if facts.deleting(seen) else admission.lookup_of(adapter_of(seen))
        if lookup is not None and not found.knows(lookup):
            found = read(deps, lookup, found)
        missing: list[Obj] = []
        written = deps.kube.write_status(
            kind, namespace, name, partial(desired, found=found, missing=missing), current=seen
        )
        if written is None or not missing:
            return written
        seen = missing[-1]
    raise KubeConflict(f"{kind.plural}/{name}: its spec kept naming other objects while it was admitted")


def read(deps: Deps, lookup: admission.Lookup, found: admission.Found) -> admission.Found:
    """`found` with what `lookup` names as the API server has it now."""
    if lookup.kind == "Model":
        exists = deps.kube.get(MODEL, lookup.namespace, lookup.name) is not None
        return found._replace(models={**found.models, lookup: exists})
    obj = deps.kube.get(INFERENCE_SERVICE, lookup.namespace, lookup.name)
    service = stored(InferenceService, obj) if obj is not None else None
    return found._replace(services={**found.services, lookup: service})


def _condition_message(kind: Kind, obj: Obj) -> str:
    found = _verdict(kind, obj)
    return str(found.get("message") or "") if found is not None else ""


admit = shell.function(NAME, ACCEPTS, handle)
