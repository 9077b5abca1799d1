"""What verify writes, from the adapter and the storage work done beforehand (pure).

verify streams the MD5s storage did not report, freezes a verified set and deletes retired
frozen copies before its guarded status write, never inside it: the write's callback may run
again after a 409 with a newer object, and it only decides. Should that newer object need work
that was not done (another file to hash, another set to freeze, another copy to delete),
`status_for` answers with the `Needs`, and verify does it and writes again.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import NamedTuple, Protocol

from functions.logic import conditions, facts, integrity, phase, reasons
from functions.logic import frozen as logic_frozen
from functions.resources.rackai import FrozenSet, LoRAAdapter, LoRAAdapterStatus

HashKey = tuple[str, int | None, str | None]
"""(path, size, version) of a declared file storage listed without an MD5: what its hash is of."""


class NotFrozen(Protocol):
    """Why a verified set could not be frozen (functions.freeze.Refusal)."""

    @property
    def reason(self) -> str: ...

    @property
    def message(self) -> str: ...


class Gathered(NamedTuple):
    """The storage work done for the status write, kept across its attempts."""

    hashes: Mapping[HashKey, str | None] = {}
    """MD5s computed by streaming (None: larger than the limit, or gone)."""
    frozen: Mapping[str, FrozenSet | NotFrozen] = {}
    """By file set: the frozen copy made, or why it could not be."""
    deleted: frozenset[str] = frozenset()
    """File sets of the retired frozen copies deleted."""


class Needs(NamedTuple):
    """The storage work an adapter's status needs that `Gathered` lacks, in the order it is done
    (what is verified depends on the hashes)."""

    hashes: tuple[HashKey, ...] = ()
    freeze: str | None = None
    """The verified file set to freeze."""
    collect: tuple[FrozenSet, ...] = ()
    """Retired frozen copies to delete."""


def observed_files(adapter: LoRAAdapter) -> dict[str, integrity.Observed]:
    return {path: integrity.Observed(md5=f.md5, size=f.size) for path, f in adapter.recorded_files().items()}


def declared(adapter: LoRAAdapter) -> dict[str, str]:
    return adapter.declared_md5s()


def verdict_for(adapter: LoRAAdapter, hashed: Mapping[str, str | None]) -> integrity.Verdict:
    return integrity.compare(declared(adapter), observed_files(adapter), hashed)


def hash_keys(adapter: LoRAAdapter) -> dict[str, HashKey]:
    """The declared files storage listed without an MD5, each with what its hash is of."""
    recorded = adapter.recorded_files()
    return {
        path: (path, recorded[path].size, recorded[path].version)
        for path in integrity.to_hash(declared(adapter), observed_files(adapter))
    }


def collectable(adapter: LoRAAdapter, now: datetime, grace: timedelta) -> list[FrozenSet]:
    """The retired frozen copies no pod serves whose grace has passed."""
    status = adapter.status or LoRAAdapterStatus()
    served = {r.pod: r.file_set for r in status.served or []}
    return logic_frozen.collectable(list(status.frozen or []), served, now, grace)


def status_for(
    adapter: LoRAAdapter, gathered: Gathered, now: datetime, grace: timedelta
) -> LoRAAdapterStatus | Needs:
    """The whole status with the integrity verdict, or the storage work it still needs.

    The verified set is the status's current frozen record, else the copy made now; retired
    copies are deleted once no pod serves them and `grace` has passed (their records go)."""
    keys = hash_keys(adapter)
    unhashed = tuple(key for key in keys.values() if key not in gathered.hashes)
    if unhashed:
        return Needs(hashes=unhashed)
    hashed = {path: gathered.hashes[key] for path, key in keys.items()}
    status = adapter.status or LoRAAdapterStatus()
    made: FrozenSet | NotFrozen | None = None
    if verdict_for(adapter, hashed).status == "True":
        file_set = facts.file_set(declared(adapter))
        made = logic_frozen.current(status.frozen, file_set) or gathered.frozen.get(file_set)
        if made is None:
            return Needs(freeze=file_set)
    gone = collectable(adapter, now, grace)
    undeleted = tuple(r for r in gone if r.file_set not in gathered.deleted)
    if undeleted:
        return Needs(collect=undeleted)
    names = {r.file_set for r in gone}
    records = [r for r in status.frozen or [] if r.file_set not in names]
    return decide(adapter, hashed, now, made, records)


def decide(
    adapter: LoRAAdapter,
    hashed: Mapping[str, str | None],
    now: datetime,
    frozen: FrozenSet | NotFrozen | None = None,
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
    refusal = frozen if frozen is not None and not isinstance(frozen, FrozenSet) else None
    holding = verdict.status == "True" and refusal is not None
    if refusal is not None and holding:
        # not Ready, and not failed: the pods keep the set verified before (if any) while the
        # next stat or resync nudge tries the freeze again
        verdict = integrity.Verdict("Unknown", refusal.reason, refusal.message, True)
    kept = status.frozen if records is None else records
    served = status.served
    unfrozen_served = False
    if verdict.status == "True" and isinstance(frozen, FrozenSet):
        if logic_frozen.current(status.frozen, frozen.file_set) is None:
            # frozen just now: a pod serving this set read it from elsewhere (the upload
            # directory, under a release before sets were frozen, or a copy since deleted), so
            # load must list it and replace that copy with the frozen one
            unfrozen_served = any(r.file_set == frozen.file_set for r in served or ())
            served = [r for r in served or () if r.file_set != frozen.file_set] or None
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
        why = _why_loaded_stops(verdict, verified, status.file_set, file_set, unfrozen_served)
        if why is not None:
            conds = conditions.set_condition(
                conds, reasons.LOADED, "False", *why, adapter.metadata.generation, now
            )
    phase_, ready = phase.summarize(conds, bool(observed) or bool(status.files))
    return status.model_copy(
        update={
            "conditions": conds,
            "file_set": file_set,
            "frozen": kept or None,
            "served": served,
            "upload_complete": verdict.upload_complete,
            "phase": phase_,
            "ready": ready,
        }
    )


def _why_loaded_stops(
    verdict: integrity.Verdict,
    verified: bool,
    served_set: str | None,
    file_set: str | None,
    unfrozen_served: bool,
) -> tuple[str, str] | None:
    """Why Loaded stops saying True, if it does: it does in the write that changes what the pods
    should serve. No verified set any more (unload answers adapter.failed and takes the copies
    back), or a newer one, or the verified one frozen just now (load replaces the copies, then
    says True again)."""
    if not verified:
        return reasons.ADAPTER_NOT_READY, f"not Ready ({verdict.reason}): the adapter is being unloaded"
    if served_set and file_set != served_set:
        return (
            reasons.UPDATING,
            "a newer verified file set is being loaded into the pods that serve this adapter",
        )
    if unfrozen_served:
        return (
            reasons.UPDATING,
            "the pods that serve this adapter are being moved to the frozen copy of its verified set",
        )
    return None
