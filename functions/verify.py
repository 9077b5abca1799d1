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

from datetime import datetime, timedelta
from functools import partial
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
from functions.errors import KubeConflict
from functions.freeze import Refusal, collect, freeze
from functions.logic import facts, phase, verification
from functions.logic.verification import decide as decide
from functions.logic.verification import declared as declared
from functions.logic.verification import observed_files as observed_files
from functions.logic.verification import verdict_for as verdict_for
from functions.ports import Written
from functions.resources.kinds import VLLM_ADAPTER
from functions.resources.rackai import FrozenSet, LoRAAdapter

NAME = "verify"
ACCEPTS = (ADAPTER_STAT_COMPLETED, ADAPTER_ADMITTED)
WORK_ROUNDS = 3
"""Times a newer object met after a 409 may need storage work the write lacks before verify
answers 503 (the stat or nudge that follows such a change verifies it again anyway)."""

Obj = dict[str, Any]


# -- pure ------------------------------------------------------------------------------------
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
    written = write_verdict(deps, namespace, name, obj, now)
    if written is None or not written.changed:
        return None
    before = verdict_of((written.before if written.before is not None else written.obj).get("status"))
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
    base = deps.settings.schema_base_url
    if after[1] == phase.INTEGRITY_CHECK_FAILED:
        kube.record_event(written.obj, "Warning", after[1], str(condition.get("message") or ""), NAME, now)
    if after[0] == "True":
        return messages.reply(ADAPTER_READY, NAME, subject, AdapterReady(adapter=out), schema_base_url=base)
    if after[0] == "False" and after[1] in phase.TERMINAL:
        failed = AdapterFailed(adapter=out, reason=after[1], message=str(condition.get("message") or ""))
        return messages.reply(ADAPTER_FAILED, NAME, subject, failed, schema_base_url=base)
    return None


def write_verdict(deps: Deps, namespace: str, name: str, obj: Obj, now: datetime) -> Written | None:
    """The status write, with the storage work it needs done before it from `obj` (the adapter
    as just read). A newer object met after a 409 that needs more is left alone: that work is
    done, and the write starts again."""
    grace = timedelta(seconds=deps.settings.frozen_grace)
    gathered = verification.Gathered()
    seen, adapter = obj, stored(LoRAAdapter, obj)

    def desired(current: Obj, gathered: verification.Gathered, missing: list[Obj]) -> Obj | None:
        if facts.deleting(current):
            return None
        # the first attempt is the object read above: validated once
        fresh = adapter if current is seen else stored(LoRAAdapter, current)
        decided = verification.status_for(fresh, gathered, now, grace)
        if isinstance(decided, verification.Needs):
            missing.append(current)
            return None
        return decided.to_wire()

    for _ in range(WORK_ROUNDS):
        if not facts.deleting(seen):
            gathered = gather(deps, seen, adapter, gathered, now, grace)
        missing: list[Obj] = []
        # from the object just read: its resourceVersion guards the write (a 409 re-reads), so a
        # second GET of the whole object (its status lists up to 1,000 files) buys nothing
        written = deps.kube.write_status(
            VLLM_ADAPTER, namespace, name, partial(desired, gathered=gathered, missing=missing), current=seen
        )
        if written is None or not missing:
            return written
        seen = missing[-1]
        adapter = stored(LoRAAdapter, seen)
    raise KubeConflict(f"{VLLM_ADAPTER.plural}/{name} kept needing new storage work while it was verified")


def gather(
    deps: Deps,
    obj: Obj,
    adapter: LoRAAdapter,
    gathered: verification.Gathered,
    now: datetime,
    grace: timedelta,
) -> verification.Gathered:
    """`gathered` with the storage work `adapter`'s status needs done: its MD5s streamed, its
    verified set frozen (once per invocation: a 409 re-read does not copy again), the retired
    copies no pod serves deleted."""
    limit = deps.settings.hash_max_bytes
    for _ in range(3):  # the hashes, then the freeze, then the retired copies: each at most once
        needs = verification.status_for(adapter, gathered, now, grace)
        if not isinstance(needs, verification.Needs):
            break
        if needs.hashes:
            hashed = {
                key: deps.storage.hash_file(key[0], limit) if limit > 0 else None for key in needs.hashes
            }
            gathered = gathered._replace(hashes={**gathered.hashes, **hashed})
        elif needs.freeze is not None:
            made = freeze_set(deps, obj, adapter, needs.freeze, now)
            gathered = gathered._replace(frozen={**gathered.frozen, needs.freeze: made})
        else:
            # each one is collectable already (no pod serves it, its grace has passed)
            collect(deps.storage, list(needs.collect), {}, now, grace)
            deleted = gathered.deleted | {r.file_set for r in needs.collect}
            gathered = gathered._replace(deleted=deleted)
    return gathered


def freeze_set(
    deps: Deps, obj: Obj, adapter: LoRAAdapter, file_set: str, now: datetime
) -> FrozenSet | Refusal:
    """The frozen copy of the adapter's declared set, copied from its upload directory."""
    wanted = declared(adapter)
    observed = observed_files(adapter)
    meta = adapter.metadata
    return freeze(
        deps.storage,
        meta.namespace or "",
        adapter.spec.model,
        meta.name or "",
        facts.storage_dir(obj) or "",
        wanted,
        {p: int(observed[p].size or 0) for p in wanted},
        file_set,
        deps.settings.hash_max_bytes,
        now,
    )


verify = shell.function(NAME, ACCEPTS, handle)
