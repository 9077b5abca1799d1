"""verify: compare the declared MD5s with what storage reported; say Ready or why not.

Trigger: `io.loraflow.adapter.statcompleted.v1`; `io.loraflow.adapter.admitted.v1` (a
    spec.integrity declared or changed after the upload).
Reads: the vllm adapter (re-read): spec.integrity.md5 and status.integrity.files; storage,
    only to hash (streaming, at most `LORAFLOW_HASH_MAX_BYTES`) a declared file whose backend
    reported no MD5.
Writes: one status write: uploadComplete, Ready (True `IntegrityVerified`; False
    `IntegrityCheckFailed` / `Md5Unavailable` / `AwaitingFiles` / `AwaitingIntegrity`;
    admit's verdicts `ModelNotFound` / `IntegrityPathOutsideAdapter` are kept), phase, ready.
    A Warning Event is recorded on a transition into `IntegrityCheckFailed`.
Replies: `io.loraflow.adapter.ready.v1` when the verdict became Ready,
    `io.loraflow.adapter.failed.v1` when it became a failure; nothing otherwise.
Outcomes: 200 + ready/failed; 204 verdict unchanged / sglang adapter / adapter gone or being
    deleted; 400 malformed event; 503 storage (while hashing) or Kubernetes API unavailable.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from cloudevents.http import CloudEvent

from events.domain import (
    ADAPTER_ADMITTED,
    ADAPTER_FAILED,
    ADAPTER_READY,
    ADAPTER_STAT_COMPLETED,
    AdapterFailed,
    AdapterReady,
    AdapterRef,
)
from functions.edge import messages, shell
from functions.edge.bootstrap import Deps
from functions.edge.inputs import adapter_ref, stored
from functions.freeze import Refusal, collect, freeze
from functions.logic import conditions, facts, integrity, phase, reasons
from functions.logic import frozen as logic_frozen
from functions.resources.kinds import VLLM_ADAPTER
from functions.resources.rackai import FrozenSet, LoRAAdapter, LoRAAdapterStatus

NAME = "verify"
ACCEPTS = (ADAPTER_STAT_COMPLETED, ADAPTER_ADMITTED)

Obj = dict[str, Any]


# -- pure ------------------------------------------------------------------------------------
def observed_files(adapter: LoRAAdapter) -> dict[str, integrity.Observed]:
    return {path: integrity.Observed(md5=f.md5, size=f.size) for path, f in adapter.recorded_files().items()}


def declared(adapter: LoRAAdapter) -> dict[str, str]:
    return adapter.declared_md5s()


def verdict_for(adapter: LoRAAdapter, hashed: Mapping[str, str | None]) -> integrity.Verdict:
    return integrity.compare(declared(adapter), observed_files(adapter), hashed)


def decide(
    adapter: LoRAAdapter,
    hashed: Mapping[str, str | None],
    now: datetime,
    frozen: FrozenSet | Refusal | None = None,
    records: list[FrozenSet] | None = None,
) -> LoRAAdapterStatus:
    """The whole status with the integrity verdict; `hashed` holds MD5s computed by streaming.

    `frozen` is the frozen copy of the verified set (or why it could not be made): a verified
    set is Ready only once frozen, and then it is the current record of `status.frozen`, the
    others retired; a set that could not be frozen leaves Ready Unknown (`FreezeFailed`) and
    the set verified before in place, so the pods keep serving it. `records` are the frozen
    records to start from (status.frozen, less what was just deleted); a failed verdict
    retires them all.
    """
    status = adapter.status or LoRAAdapterStatus()
    observed = observed_files(adapter)
    verdict = integrity.compare(declared(adapter), observed, hashed)
    holding = verdict.status == "True" and isinstance(frozen, Refusal)
    if isinstance(frozen, Refusal) and holding:
        # not Ready, and not failed: the pods keep the set verified before (if any) while the
        # next stat or resync nudge tries the freeze again
        verdict = integrity.Verdict("Unknown", frozen.reason, frozen.message, True)
    kept = status.frozen if records is None else records
    if verdict.status == "True" and isinstance(frozen, FrozenSet):
        kept = logic_frozen.with_current(kept, frozen, now)
    elif verdict.status != "True" and not holding:
        kept = logic_frozen.with_current(kept, None, now)  # nothing verified: no pod keeps it
    conds = status.conditions
    current = conditions.find(conds, phase.READY)
    if current is None or current.reason not in phase.ADMIT_FAILURES:
        conds = conditions.set_condition(
            conds,
            phase.READY,
            verdict.status,
            verdict.reason,
            verdict.message,
            adapter.metadata.generation,
            now,
        )
    ready_now = conditions.find(conds, phase.READY)
    verified = ready_now is not None and ready_now.status == "True"
    file_set = facts.file_set(declared(adapter)) if verified else (status.file_set if holding else None)
    loaded_now = conditions.find(conds, reasons.LOADED)
    if loaded_now is not None and loaded_now.status == "True" and not holding:
        # Loaded stops saying True in the write that changes what the pods should serve: no
        # verified set any more (unload answers adapter.failed and takes the copies back), or a
        # newer one (load replaces the old copies, then says True again)
        if not verified:
            taken_back = (
                reasons.ADAPTER_NOT_READY,
                f"not Ready ({verdict.reason}): the adapter is being unloaded",
            )
        elif status.file_set and file_set != status.file_set:
            taken_back = (
                reasons.UPDATING,
                "a newer verified file set is being loaded into the pods that serve this adapter",
            )
        else:
            taken_back = None
        if taken_back is not None:
            conds = conditions.set_condition(
                conds, reasons.LOADED, "False", *taken_back, adapter.metadata.generation, now
            )
    phase_, ready = phase.summarize(conds, bool(observed) or bool(status.files))
    return status.model_copy(
        update={
            "conditions": conds,
            "file_set": file_set,
            "frozen": kept or None,
            "upload_complete": verdict.upload_complete,
            "phase": phase_,
            "ready": ready,
        }
    )


def frozen_for(
    deps: Deps,
    adapter: LoRAAdapter,
    upload_dir: str,
    observed: Mapping[str, integrity.Observed],
    made: dict[str, FrozenSet | Refusal],
    now: datetime,
) -> FrozenSet | Refusal:
    """The frozen copy of the adapter's declared set: the status's record, else one made now
    (once per invocation: a 409 re-read does not copy again)."""
    wanted = declared(adapter)
    file_set = facts.file_set(wanted)
    status = adapter.status or LoRAAdapterStatus()
    recorded = logic_frozen.current(status.frozen, file_set)
    if recorded is not None:
        return recorded
    if file_set not in made:
        meta = adapter.metadata
        sizes = {p: int(observed[p].size or 0) for p in wanted}
        made[file_set] = freeze(
            deps.storage,
            meta.namespace or "",
            adapter.spec.model,
            meta.name or "",
            upload_dir,
            wanted,
            sizes,
            file_set,
            deps.settings.hash_max_bytes,
            now,
        )
    return made[file_set]


def verdict_of(status: Obj | None) -> tuple[str, str] | None:
    """(status, reason) of the Ready condition in a wire status."""
    for c in (status or {}).get("conditions") or []:
        if isinstance(c, dict) and c.get("type") == phase.READY:
            return str(c.get("status")), str(c.get("reason"))
    return None


# -- shell -----------------------------------------------------------------------------------
def handle(event: CloudEvent, deps: Deps) -> CloudEvent | None:
    ref = adapter_ref(event)
    if ref.api_version != VLLM_ADAPTER.api_version:
        return None
    kube = deps.kube
    namespace, name = ref.namespace, ref.name
    obj = kube.get(VLLM_ADAPTER, namespace, name)
    if obj is None or facts.deleting(obj):
        return None
    now = deps.clock()
    limit = deps.settings.hash_max_bytes
    hashes: dict[tuple[str, int | None, str | None], str | None] = {}
    frozen_now: dict[str, FrozenSet | Refusal] = {}
    seen: dict[str, Obj] = {}

    def desired(current: Obj) -> Obj | None:
        seen["before"] = current
        if facts.deleting(current):
            return None
        adapter = stored(LoRAAdapter, current)
        observed = observed_files(adapter)
        versions = {p: f.version for p, f in adapter.recorded_files().items()}
        hashed: dict[str, str | None] = {}
        for path in integrity.to_hash(declared(adapter), observed):
            key = (path, observed[path].size, versions.get(path))
            if key not in hashes:
                hashes[key] = deps.storage.hash_file(path, limit) if limit > 0 else None
            hashed[path] = hashes[key]
        made: FrozenSet | Refusal | None = None
        if verdict_for(adapter, hashed).status == "True":
            made = frozen_for(deps, adapter, facts.storage_dir(current) or "", observed, frozen_now, now)
        status = adapter.status or LoRAAdapterStatus()
        served = {r.pod: r.file_set for r in status.served or []}
        grace = timedelta(seconds=deps.settings.frozen_grace)
        records = collect(deps.storage, list(status.frozen or []), served, now, grace)
        return decide(adapter, hashed, now, made, records).to_wire()

    # from the object just read: its resourceVersion guards the write (a 409 re-reads), so a
    # second GET of the whole object (its status lists up to 1,000 files) buys nothing
    written = kube.write_status(VLLM_ADAPTER, namespace, name, desired, current=obj)
    if written is None or not written.changed:
        return None
    before = verdict_of(seen["before"].get("status"))
    after = verdict_of(written.obj.get("status"))
    if after is None or after == before:
        return None
    condition = next(
        c for c in written.obj["status"]["conditions"] if isinstance(c, dict) and c.get("type") == phase.READY
    )
    out = AdapterRef.model_validate(
        {"apiVersion": VLLM_ADAPTER.api_version, "namespace": namespace, "name": name}
    )
    subject = VLLM_ADAPTER.path(namespace, name)
    if after[1] == phase.INTEGRITY_CHECK_FAILED:
        kube.record_event(written.obj, "Warning", after[1], str(condition.get("message") or ""), NAME, now)
    if after[0] == "True":
        return messages.reply(ADAPTER_READY, NAME, subject, AdapterReady(adapter=out))
    if after[0] == "False" and after[1] in phase.TERMINAL:
        failed = AdapterFailed(adapter=out, reason=after[1], message=str(condition.get("message") or ""))
        return messages.reply(ADAPTER_FAILED, NAME, subject, failed)
    return None


verify = shell.function(NAME, ACCEPTS, handle)
