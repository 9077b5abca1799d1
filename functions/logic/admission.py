"""What admit writes, from the adapter and what was read of the world beforehand (pure).

admit reads the object its adapter's spec names (the Model of a vllm adapter, the
InferenceService of an sglang one) before its guarded status write, never inside it: the write's
callback may run again after a 409 with a newer object, and it only decides. Should that newer
object name something else than was read (the spec changed meanwhile), `decide` answers with the
`Lookup` it lacks, and admit reads it and writes again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Literal, NamedTuple

from functions.errors import Reject
from functions.logic import conditions, facts, phase, serving
from functions.logic.paths import adapter_dir, check_label, check_subdomain, is_under
from functions.resources.inference import InferenceService, SGLangAdapter, SGLangAdapterStatus
from functions.resources.meta import ConditionStatus
from functions.resources.rackai import LoRAAdapter, LoRAAdapterStatus, StorageRef


class Lookup(NamedTuple):
    """The object admitting an adapter depends on, besides the adapter."""

    kind: Literal["Model", "InferenceService"]
    namespace: str
    name: str


class Found(NamedTuple):
    """What was read for the lookups: whether each Model exists, each InferenceService as stored."""

    models: Mapping[Lookup, bool] = {}
    services: Mapping[Lookup, InferenceService | None] = {}

    def knows(self, lookup: Lookup) -> bool:
        return lookup in (self.models if lookup.kind == "Model" else self.services)


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


def lookup_of(adapter: LoRAAdapter | SGLangAdapter) -> Lookup | None:
    """What admitting this spec reads; None when the name it gives cannot exist (absent unread)."""
    namespace = adapter.metadata.namespace or ""
    if isinstance(adapter, LoRAAdapter):
        model = adapter.spec.model
        return Lookup("Model", namespace, model) if model_name_valid(model) else None
    ref = adapter.spec.inference_service_ref
    where, name = ref.namespace or namespace, ref.name
    if _valid(check_label, where) and _valid(check_subdomain, name):
        return Lookup("InferenceService", where, name)
    return None


def decide(
    adapter: LoRAAdapter | SGLangAdapter, found: Found, now: datetime, roots: Sequence[str] = ("/",)
) -> LoRAAdapterStatus | SGLangAdapterStatus | Lookup:
    """The whole status after admission, or the lookup it needs that `found` lacks."""
    lookup = lookup_of(adapter)
    if lookup is not None and not found.knows(lookup):
        return lookup
    if isinstance(adapter, LoRAAdapter):
        return decide_vllm(adapter, lookup is not None and found.models[lookup], now)
    target = found.services[lookup] if lookup is not None else None
    return decide_sglang(adapter, target, now, roots)


def decide_vllm(adapter: LoRAAdapter, model_exists: bool, now: datetime) -> LoRAAdapterStatus:
    """The whole vllm status after admission (other steps' fields kept as they are)."""
    meta = adapter.metadata
    status = adapter.status or LoRAAdapterStatus()
    directory: str | None = None
    if model_name_valid(adapter.spec.model):
        try:
            directory = adapter_dir(meta.namespace or "", adapter.spec.model, meta.name or "")
        except Reject:
            directory = None
    conds = status.conditions
    verdict = _vllm_ready(adapter, status, directory, model_exists)
    if verdict is not None:
        conds = conditions.set_condition(conds, phase.READY, *verdict, meta.generation, now)
    phase_, ready = phase.summarize(conds, bool(status.files))
    return status.model_copy(
        update={
            "conditions": conds,
            "storage_ref": StorageRef(path=directory) if directory else None,
            "observed_generation": meta.generation,
            "phase": phase_,
            "ready": ready,
        }
    )


def _vllm_ready(
    adapter: LoRAAdapter, status: LoRAAdapterStatus, directory: str | None, model_exists: bool
) -> tuple[ConditionStatus, str, str] | None:
    """Ready as admission sets it (status, reason, message); None leaves it to the other steps."""
    model, namespace = adapter.spec.model, adapter.metadata.namespace or ""
    declared_md5s = adapter.declared_md5s()
    if directory is None or not model_exists:
        return "False", phase.MODEL_NOT_FOUND, f"Model {model!r} not found in namespace {namespace!r}"
    outside = [k for k in sorted(declared_md5s) if not is_under(k, directory)]
    if outside:
        more = f" and {len(outside) - 20} more" if len(outside) > 20 else ""
        listed = ", ".join(outside[:20]) + more
        message = f"spec.integrity.md5 keys must lie under {directory}: {listed}"
        return "False", phase.INTEGRITY_PATH_OUTSIDE_ADAPTER, message
    current = conditions.find(status.conditions, phase.READY)
    if current is None or current.reason in phase.ADMIT_FAILURES or current.reason == phase.ADMITTED:
        return (
            "Unknown",
            phase.ADMITTED,
            "Spec accepted; waiting for the storage observation and the integrity check",
        )
    if (
        current.status == "True"
        and status.file_set
        and status.file_set != facts.file_set(dict(declared_md5s))
    ):
        # spec.integrity changed after verify accepted a set: Ready is not True for MD5s the spec
        # no longer declares; the pods keep serving the verified set until verify rules
        return (
            "Unknown",
            phase.AWAITING_VERIFICATION,
            "spec.integrity.md5 changed; waiting for the integrity check",
        )
    return None


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
