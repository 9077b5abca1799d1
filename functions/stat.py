"""stat: list an adapter's storage directory and record what is there.

Trigger: `io.loraflow.adapter.admitted.v1`; `io.loraflow.file.changed.v1` (subject = the
    full storage path); `io.loraflow.adapter.drifted.v1` with `loraflowstep=stat`.
Reads: the vllm adapter (re-read; for file.changed the adapter is found from the path
    `/loraadapters/{ns}/{model}/{name}/...` and must have that `spec.model`); storage
    (`stat_dir` of `status.storageRef.path`, else the computed directory).
Writes: one status write: files [{path, size}], size (BinarySI Quantity of the total,
    "0" when empty), integrity.files {path: {md5 (hex, omitted when the backend reported
    none), size, version (for a file without an MD5: what changes with its bytes)}}
    whenever at least one file was seen (removed when none); phase/ready
    re-derived (files seen moves Pending to Processing). files and integrity.files record at
    most `LORAFLOW_STATUS_MAX_FILES` files: every declared one (spec.integrity.md5) first,
    then the others in path order; size is always the total of all. A Warning Event
    `StatusFilesTruncated` says so when the observation changes.
Replies: `io.loraflow.adapter.statcompleted.v1` when the observation changed, and always on a
    resync nudge (which means a verify was lost).
Outcomes: 200 + statcompleted; 204 nothing changed / sglang adapter / no adapter at that
    path / adapter gone or being deleted; 400 a path not normalised or not under
    /loraadapters/, malformed event; 503 storage or Kubernetes API unavailable (status is
    left untouched: never a half-true observation).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from cloudevents.http import CloudEvent

from events.domain import (
    ADAPTER_ADMITTED,
    ADAPTER_DRIFTED,
    ADAPTER_STAT_COMPLETED,
    FILE_CHANGED,
    AdapterRef,
    AdapterStatCompleted,
    FileChanged,
)
from functions.edge import messages, shell
from functions.edge.bootstrap import Deps
from functions.edge.inputs import adapter_ref, stored
from functions.errors import KubeRefused, Reject
from functions.logic import conditions, facts, file_events, frozen, phase, reasons
from functions.logic.paths import STORAGE_ROOT, adapter_dir, adapter_of_path, check_storage_path, is_under
from functions.logic.quantity import format_bytes
from functions.ports import StoredFile
from functions.resources.kinds import VLLM_ADAPTER
from functions.resources.rackai import (
    FileInfo,
    FileStatus,
    IntegrityStatus,
    LoRAAdapter,
    LoRAAdapterStatus,
)

NAME = "stat"
ACCEPTS = (ADAPTER_ADMITTED, FILE_CHANGED, ADAPTER_DRIFTED)
OBSERVATION = ("files", "size", "integrity", "frozen")
TRUNCATED = reasons.EVENT_FILES_TRUNCATED

Obj = dict[str, Any]


# -- pure ------------------------------------------------------------------------------------
STATUS_BYTES = 512 << 10
"""What the recorded files may cost in a status (each path twice, an MD5, sizes): a third of
etcd's 1.5 MiB default request limit, whatever the count (450 files of 1.7 KB paths are over)."""
FILE_OVERHEAD = 96
"""JSON around one file in `files` and `integrity.files` besides its path (twice)."""


def recorded(
    adapter: LoRAAdapter, listing: Sequence[StoredFile], max_files: int, max_bytes: int = STATUS_BYTES
) -> list[StoredFile]:
    """The files the status records, in path order: every declared one, then the others, at
    most `max_files` and `max_bytes` of them.

    A status is stored whole in etcd, whose requests are at most 1.5 MiB by default: each
    file costs ~100-300 bytes twice (files and integrity.files), so 10,000 files would make
    the API server refuse every write (500 "etcdserver: request is too large"). Verify needs
    only the declared files, which the spec itself bounds.
    """
    declared = set(adapter.declared_md5s())
    ordered = sorted(listing, key=lambda f: f.path)
    chosen = [f for f in ordered if f.path in declared]
    budget = max_bytes - sum(2 * len(f.path) + FILE_OVERHEAD for f in chosen)
    for f in ordered:
        if len(chosen) >= max_files:
            break
        cost = 2 * len(f.path) + FILE_OVERHEAD
        if f.path not in declared and cost <= budget:
            chosen.append(f)
            budget -= cost
    return sorted(chosen, key=lambda f: f.path)


def decide(
    adapter: LoRAAdapter,
    listing: Sequence[StoredFile],
    now: datetime,
    max_files: int = 1000,
    max_bytes: int = STATUS_BYTES,
    frozen_problem: str | None = None,
) -> LoRAAdapterStatus:
    """The whole status with the new storage observation.

    A declared file whose observation changed (MD5 or size, or it came or went) while Ready is
    True takes Ready back to Unknown in this same write: the status never says Ready for files
    verify has not ruled on. The pods keep serving the verified set (status.fileSet) meanwhile.
    `frozen_problem` says why the frozen copy of that set is no longer it (`frozen.problem`):
    its record is dropped and Ready goes back to Unknown the same way, so that verify freezes it
    again from the upload (or fails the adapter with the reason).
    """
    status = adapter.status or LoRAAdapterStatus()
    files = recorded(adapter, listing, max_files, max_bytes)
    total = sum(f.size for f in listing)
    integrity = (status.integrity or IntegrityStatus()).model_copy(
        update={
            "files": {f.path: FileStatus(md5=f.md5, size=f.size, version=f.version) for f in files} or None
        }
    )
    conds = status.conditions
    current = conditions.find(conds, phase.READY)
    kept = status.frozen
    if frozen_problem is not None:
        kept = [r for r in status.frozen or [] if r.file_set != status.file_set] or None
    if current is not None and current.status == "True" and frozen_problem is not None:
        message = f"freezing the verified set: {frozen_problem}"
        generation = adapter.metadata.generation
        conds = conditions.set_condition(
            conds, phase.READY, "Unknown", phase.AWAITING_VERIFICATION, message[:1024], generation, now
        )
    elif current is not None and current.status == "True" and declared_changed(adapter, listing):
        message = "storage reported a change to a declared file; waiting for the integrity check"
        generation = adapter.metadata.generation
        conds = conditions.set_condition(
            conds, phase.READY, "Unknown", phase.AWAITING_VERIFICATION, message, generation, now
        )
    phase_, ready = phase.summarize(conds, bool(listing))
    return status.model_copy(
        update={
            "conditions": conds,
            "files": [FileInfo(path=f.path, size=f.size) for f in files] or None,
            "frozen": kept,
            "size": format_bytes(total),
            "integrity": integrity,
            "phase": phase_,
            "ready": ready,
        }
    )


def declared_changed(adapter: LoRAAdapter, listing: Sequence[StoredFile]) -> bool:
    """A declared file is observed with another MD5, size or version than the status recorded,
    or it came or went. The version (chunk ids, inode and mtime; the S3 ETag) of a file listed
    without an MD5 changes with its bytes, so a replacement of the same size is judged again."""
    declared = set(adapter.declared_md5s())
    before = {p: (f.md5, f.size, f.version) for p, f in adapter.recorded_files().items() if p in declared}
    after = {f.path: (f.md5, f.size, f.version) for f in listing if f.path in declared}
    return before != after


def frozen_problem(deps: Deps, adapter: LoRAAdapter, directory: str) -> str | None:
    """Why the frozen copy of the verified set (status.fileSet) is no longer it, listing its
    directory once; None when it is, or when there is none to check (not Ready). A Ready
    adapter whose verified set has no frozen copy (verified before copies were frozen) has
    none to serve from: verify freezes it, as it would a lost one."""
    status = adapter.status
    ready = conditions.find(status.conditions, phase.READY) if status is not None else None
    if status is None or status.file_set is None or ready is None or ready.status != "True":
        return None  # only while Ready: the recorded sizes are then the verified set's
    if facts.file_set(adapter.declared_md5s()) != status.file_set:
        return None  # the spec declares another set now: verify rules on it first
    record = frozen.current(status.frozen, status.file_set)
    if record is None:
        return "it has no frozen copy yet (verified before copies were frozen, or its record was lost)"
    sizes = {p: f.size for p, f in adapter.recorded_files().items()}
    listed = [(f.path, f.size, f.md5) for f in deps.storage.stat_dir(record.path)]
    kept = deps.storage.copy_checks_md5
    return frozen.problem(record, directory, adapter.declared_md5s(), sizes, listed, kept)


def listing_dir(adapter: LoRAAdapter) -> str | None:
    """Where the adapter's files live: status.storageRef.path, else the vllm layout."""
    ref = adapter.status.storage_ref if adapter.status else None
    if ref is not None and ref.path and is_under(ref.path, STORAGE_ROOT):
        return ref.path.rstrip("/") + "/"
    meta = adapter.metadata
    try:
        return adapter_dir(meta.namespace or "", adapter.spec.model, meta.name or "")
    except Reject:
        return None  # a model name that cannot be a path: admit says ModelNotFound


def observation(status: Obj | None) -> dict[str, Any]:
    return {k: (status or {}).get(k) for k in OBSERVATION}


# -- shell -----------------------------------------------------------------------------------
def _targets(event: CloudEvent) -> list[tuple[str, str, str | None]]:
    """(namespace, name, required spec.model or None) of the adapters this event is about."""
    if event["type"] != FILE_CHANGED:
        ref = adapter_ref(event)
        if ref.api_version != VLLM_ADAPTER.api_version:
            return []
        return [(ref.namespace, ref.name, None)]
    data = event.get_data()
    path = data.get("path") if isinstance(data, dict) else None
    if not isinstance(path, str):
        path = event.get("subject")
    if not isinstance(path, str):
        raise Reject("file.changed names no path (data.path or subject)")
    check_storage_path(file_events.check_path(path, "path"))
    changed = messages.data_as(event, FileChanged)
    out: list[tuple[str, str, str | None]] = []
    for candidate in (changed.path, changed.new_path):
        if candidate and is_under(candidate, STORAGE_ROOT):
            owner = adapter_of_path(candidate)
            if owner is not None and (owner[0], owner[2], owner[1]) not in out:
                out.append((owner[0], owner[2], owner[1]))
    return out


def _one(deps: Deps, namespace: str, name: str, model: str | None, nudged: bool = False) -> CloudEvent | None:
    """Observe one adapter's directory; reply when the observation changed or resync nudged.

    A resync nudge means the adapter is stuck short of a verdict, most likely because the
    verify delivery after an earlier observation was lost: the observation is then unchanged,
    so the reply must not depend on a change or nothing would ever run verify again.
    """
    kube = deps.kube
    obj = kube.get(VLLM_ADAPTER, namespace, name)
    if obj is None or facts.deleting(obj):
        return None
    adapter = stored(LoRAAdapter, obj)
    if model is not None and adapter.spec.model != model:
        return None
    directory = listing_dir(adapter)
    if directory is None:
        return None
    listing = deps.storage.stat_dir(directory)
    problem = frozen_problem(deps, adapter, directory)
    now = deps.clock()
    budget = STATUS_BYTES

    def desired(current: Obj) -> Obj | None:
        nonlocal listing
        # the first attempt is the object read above: validated once (a tenth of the event's CPU)
        fresh = adapter if current is obj else stored(LoRAAdapter, current)
        if facts.deleting(current) or listing_dir(fresh) != directory:
            return None  # moved under us: the next nudge lists the right place
        if current is not obj:
            # re-read after a 409: the write that beat ours may record a listing newer than
            # ours (another stat's), and an older observation must never overwrite a newer one
            listing = deps.storage.stat_dir(directory)
        # a 409's newer object may record another set: judged again only if it is the same one
        same = (
            fresh.status is not None
            and adapter.status is not None
            and fresh.status.file_set == adapter.status.file_set
        )
        found = problem if same else None
        return decide(fresh, listing, now, deps.settings.status_max_files, budget, found).to_wire()

    try:
        # from the object read above: its resourceVersion guards the patch (a 409 re-reads),
        # and an unchanged observation costs no second GET
        written = kube.write_status(VLLM_ADAPTER, namespace, name, desired, current=obj)
    except KubeRefused as err:
        if err.status not in (413, 422):
            raise
        # the API refused the size: record the declared files only, and say so
        budget = 0
        written = kube.write_status(VLLM_ADAPTER, namespace, name, desired)
        if written is not None:
            message = f"the API refused the status for its size ({err}); it records the declared files only"
            kube.record_event(written.obj, "Warning", reasons.EVENT_STATUS_SHRUNK, message[:1024], NAME, now)
    if written is None:
        return None
    before = written.before if written.before is not None else written.obj
    unchanged = not written.changed or observation(before.get("status")) == observation(
        written.obj.get("status")
    )
    if unchanged and not nudged:
        return None
    shown = len(facts.status(written.obj).get("files") or [])
    if shown < len(listing) and not unchanged:
        message = f"status lists {shown} of the {len(listing)} files in {directory} (declared ones first)"
        deps.kube.record_event(written.obj, "Warning", TRUNCATED, message, NAME, now)
    ref = AdapterRef.model_validate(
        {"apiVersion": VLLM_ADAPTER.api_version, "namespace": namespace, "name": name}
    )
    payload = AdapterStatCompleted(
        adapter=ref, files=len(listing), size=format_bytes(sum(f.size for f in listing))
    )
    subject = VLLM_ADAPTER.path(namespace, name)
    base = deps.settings.schema_base_url
    return messages.reply(ADAPTER_STAT_COMPLETED, NAME, subject, payload, schema_base_url=base)


def _first(replies: Iterable[CloudEvent | None]) -> CloudEvent | None:
    return next((r for r in replies if r is not None), None)


def handle(event: CloudEvent, deps: Deps) -> CloudEvent | None:
    # A rename between two adapters touches both; the reply (one per response) goes to the
    # adapter the file arrived in, the other one is repaired by the next nudge/resync.
    targets = _targets(event)
    nudged = event["type"] == ADAPTER_DRIFTED
    replies = [_one(deps, ns, name, model, nudged) for ns, name, model in targets]
    return _first(reversed(replies))


stat = shell.function(NAME, ACCEPTS, handle)
