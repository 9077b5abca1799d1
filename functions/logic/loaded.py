"""The serving part of an adapter's status, from a ServingReport (pure).

vllm owns `usedBy`, `served` and the Loaded condition; sglang owns Loaded, Error, `loadedPath`
and `lastLoadedAt`. Loaded is True only when every Ready pod of every target that should serve
the adapter serves it from the current file set, and never with zero pods.

An sglang adapter may live in another namespace than its InferenceService: its status then
never names that namespace's pods, paths or engine answers, only counts and reasons.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple

from functions.logic import conditions, reasons
from functions.logic.serving import PodReport, Serve, ServingReport, TargetReport
from functions.resources.meta import Condition, ConditionStatus

Obj = dict[str, Any]
MAX_NAMED = 10
FAILING = ("failed", "unreachable", "occupied")


class LoadedState(NamedTuple):
    status: ConditionStatus
    reason: str
    message: str
    error_reason: str = reasons.NO_ERROR
    """sglang's Error condition: NoError, or the reason of the first failure."""


def loaded_in(pods: int) -> str:
    """How a True Loaded condition's message starts (both kinds)."""
    return f"loaded in {pods} Ready pod(s)"


def _named(items: Sequence[str]) -> str:
    more = f" and {len(items) - MAX_NAMED} more" if len(items) > MAX_NAMED else ""
    return ", ".join(items[:MAX_NAMED]) + more


def _count(target: TargetReport) -> str:
    good = sum(1 for p in target.pods if p.state == "serving")
    return f"{target.target.name} {good}/{len(target.pods)}"


def _pod_line(pod: PodReport, redact: bool) -> str:
    if redact:
        return pod.reason
    return f"{pod.pod} ({pod.reason}: {pod.message})" if pod.message else pod.pod


def describe_failures(reports: Sequence[TargetReport], redact: bool = False) -> str:
    failing = [p for t in reports for p in t.pods if p.state in FAILING]
    if redact:
        total = sum(len(t.pods) for t in reports)
        kinds = sorted({p.reason for p in failing})
        return f"{len(failing)} of {total} pod(s) failed ({', '.join(kinds)})"
    return (
        f"{len(failing)} pod(s) failed: "
        + "; ".join(_pod_line(p, False) for p in failing[:MAX_NAMED])
        + (f" and {len(failing) - MAX_NAMED} more" if len(failing) > MAX_NAMED else "")
    )


def summarize(report: ServingReport, redact: bool = False) -> LoadedState:
    """(status, reason, message) of Loaded over the targets that name the adapter."""
    targets = report.targets
    if not targets:
        return LoadedState(
            "False", reasons.NOT_REFERENCED, "no ModelDeployment lists this adapter in spec.loraAdapters"
        )
    attempted = [t for t in targets if t.verdict is None]
    refused = [t for t in targets if t.verdict is not None]
    mismatched = [t for t in refused if t.verdict and t.verdict[0] == reasons.MODEL_MISMATCH]
    notes = "".join(f"; {t.target.name}: {t.verdict[1]}" for t in mismatched if t.verdict)
    pods = [p for t in attempted for p in t.pods]
    failing = [p for p in pods if p.state in FAILING]
    counts = ", ".join(_count(t) for t in attempted)
    where = "" if redact else f": {counts}"
    if failing:
        message = describe_failures(attempted, redact) + ("" if redact else notes)
        if all(p.state == "occupied" for p in failing):
            return LoadedState("False", reasons.NAME_CONFLICT, message, reasons.NAME_CONFLICT)
        if all(p.reason == reasons.ENGINE_CAPACITY_INVALID for p in failing):
            invalid = reasons.ENGINE_CAPACITY_INVALID
            return LoadedState("False", invalid, message, invalid)
        return LoadedState("False", reasons.LOAD_FAILED, message, failing[0].reason)
    left_out = [p for p in pods if p.state == "capacity"]
    if left_out:
        exceeded = reasons.ENGINE_CAPACITY_EXCEEDED
        shown = f"{len(left_out)} of {len(pods)} Ready pod(s)"
        if not redact:
            shown += f" ({_named([p.pod for p in left_out])})"
        return LoadedState("False", exceeded, f"left out in {shown}: {left_out[0].message}{where}", exceeded)
    stale = [p.pod for p in pods if p.state == "stale"]
    if stale:
        shown = f"{len(stale)} pod(s)" if redact else _named(stale)
        return LoadedState(
            "False",
            reasons.UPDATING,
            f"updating to the current file set{where}; an older one is still served by {shown}",
        )
    waiting = [p.pod for p in pods if p.state == "absent"]
    if waiting:
        shown = f"{len(waiting)} pod(s)" if redact else _named(waiting)
        return LoadedState("False", reasons.LOADING, f"loading{where}; waiting for {shown}")
    other = [t for t in refused if t not in mismatched]
    if other:
        first = other[0]
        assert first.verdict is not None
        reason, message = first.verdict
        return LoadedState("False", reason, f"not loaded into {first.target}: {message}", reason)
    if not attempted:
        return LoadedState(
            "False",
            reasons.MODEL_MISMATCH,
            "; ".join(f"{t.target.name}: {t.verdict[1]}" for t in mismatched if t.verdict),
        )
    if not pods:
        return LoadedState(
            "False",
            reasons.NO_READY_REPLICAS,
            f"no Ready pod in {', '.join(str(t.target) for t in attempted)}",
        )
    if redact:
        return LoadedState("True", reasons.LOADED_REASON, f"{loaded_in(len(pods))} of {attempted[0].target}")
    if report.adapter.kind == "sglang":
        return LoadedState("True", reasons.LOADED_REASON, f"{loaded_in(len(pods))} of {attempted[0].target}")
    return LoadedState("True", reasons.LOADED_REASON, f"{loaded_in(len(pods))}{where}{notes}")


def _conditions(status: Mapping[str, Any]) -> list[Condition]:
    return [Condition.model_validate(c) for c in status.get("conditions") or []]


def _wire(items: Sequence[Condition]) -> list[Obj]:
    return [c.to_wire() for c in items]


class VllmServing(NamedTuple):
    """The serving fields of a vllm status as load writes them (None: left as they are)."""

    used_by: list[str]
    served: list[Obj] | None
    """status.served; [] removes it; None (hold) keeps it."""
    loaded: LoadedState | None
    """Loaded to set; None: leave the conditions alone."""


def vllm_serving(
    report: ServingReport | None, used_by: Sequence[str], serve: Serve, has_loaded: bool
) -> VllmServing:
    """What load writes of a vllm status, decided once for `vllm_status` and resync's judge:
    usedBy always; while held nothing else; not Ready: no served records and Loaded=False
    AdapterNotReady once a Loaded condition was written; else served and Loaded from the report."""
    used = sorted(used_by)
    if serve == "hold":
        return VllmServing(used, None, None)  # verify is ruling: pods serve the last verified set
    if report is None:
        if not has_loaded:
            return VllmServing(used, [], None)
        return VllmServing(used, [], LoadedState("False", reasons.ADAPTER_NOT_READY, "adapter is not Ready"))
    served: list[Obj] = [
        {"pod": pod, "fileSet": fs, **_residency(report, pod)} for pod, fs in sorted(report.served.items())
    ]
    return VllmServing(used, served, summarize(report))


def _residency(report: ServingReport, pod: str) -> Obj:
    value = report.residency.get(pod)
    return {"residency": value} if value else {}


def sglang_served(report: ServingReport, redact: bool) -> list[Obj]:
    """sglang status.served: each pod serving the adapter now, from its path (a reload lists
    only its own pod and takes the others from these); none for an adapter in another
    namespace than its InferenceService (its status never names that namespace's pods)."""
    if redact:
        return []
    return [
        {"pod": pod, "path": path, **_residency(report, pod)} for pod, path in sorted(report.served.items())
    ]


def vllm_status(
    current: Mapping[str, Any],
    report: ServingReport | None,
    used_by: Sequence[str],
    serve: Serve,
    generation: int | None,
    now: datetime,
) -> Obj:
    """The whole desired status with the serving fields set (`report` None: not Ready, usedBy only
    and Loaded=False AdapterNotReady when a Loaded condition was written before)."""
    items = _conditions(current)
    fields = vllm_serving(report, used_by, serve, conditions.find(items, reasons.LOADED) is not None)
    status = dict(current)
    status["usedBy"] = fields.used_by
    if not fields.used_by:
        status.pop("usedBy")
    if fields.served is not None:
        if fields.served:
            status["served"] = fields.served
        else:
            status.pop("served", None)
    state = fields.loaded
    if state is None:
        return status
    items = conditions.set_condition(
        items, reasons.LOADED, state.status, state.reason, state.message, generation, now
    )
    status["conditions"] = _wire(items)
    return status


def sglang_status(
    current: Mapping[str, Any],
    report: ServingReport,
    path: str,
    generation: int | None,
    now: datetime,
    redact: bool,
    served: bool = True,
) -> Obj:
    """Loaded, Error, loadedPath (once every pod that has it serves `path`) and lastLoadedAt (a
    load call succeeded; or a pod serves it and none is recorded: the status write after its
    load was lost, and a redelivery finds it loaded). Not Available (`served` False): Loaded
    says why; Error is admit's."""
    before = _conditions(current)
    state = sglang_loaded(report, redact, served, conditions.find(before, reasons.LOADED) is not None)
    if state is None:
        return dict(current)  # never served: nothing to take back, Available says why
    items = conditions.set_condition(
        before, reasons.LOADED, state.status, state.reason, state.message, generation, now
    )
    if not served:
        return {**current, "conditions": _wire(items)}
    error: ConditionStatus = "False" if state.error_reason == reasons.NO_ERROR else "True"
    error_message = "no error" if error == "False" else state.message
    items = conditions.set_condition(
        items, reasons.ERROR, error, state.error_reason, error_message, generation, now
    )
    status = dict(current)
    status["conditions"] = _wire(items)
    pods = [p for t in report.targets for p in t.pods]
    if any(p.state == "serving" for p in pods) and not any(p.state == "stale" for p in pods):
        status["loadedPath"] = path
    served_records = sglang_served(report, redact)
    if served_records:
        status["served"] = served_records
    else:
        status.pop("served", None)
    if stamps_load_time(current, report, served):
        status["lastLoadedAt"] = conditions.timestamp(now)
    return status


def sglang_loaded(
    report: ServingReport, redact: bool, served: bool, loaded_before: bool
) -> LoadedState | None:
    """The Loaded condition `sglang_status` sets (None: it leaves Loaded as it is, for an
    adapter never served). Resync compares with this, not with a whole status built for it."""
    if not served and not loaded_before:
        return None
    return summarize(report, redact)


def stamps_load_time(current: Mapping[str, Any], report: ServingReport, served: bool) -> bool:
    """Whether `sglang_status` sets lastLoadedAt now."""
    if not served:
        return False
    serving = any(p.state == "serving" for t in report.targets for p in t.pods)
    return bool(report.loaded_now) or (serving and not current.get("lastLoadedAt"))


def unload_failed_status(
    current: Mapping[str, Any], message: str, generation: int | None, now: datetime
) -> Obj:
    """Loaded=False UnloadFailed (a deletion that could not take every copy back yet)."""
    items = conditions.set_condition(
        _conditions(current), reasons.LOADED, "False", reasons.UNLOAD_FAILED, message, generation, now
    )
    return {**current, "conditions": _wire(items)}
