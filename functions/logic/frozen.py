"""Frozen file sets (pure): where a verified set is copied, which records a status keeps, and
which retired copies may be deleted.

Once verify accepts a file set it is copied to `/loraflow-frozen/{ns}/{model}/{name}/{digest}/`
(`paths.frozen_dir`), which only loraflow writes, and the engines load from there: what they
read later (vLLM after an eviction, a restarted pod) is then the set that was verified, whatever
happens to the upload directory. A record per frozen set lives in `status.frozen`: the current
one, then retired ones until no pod serves them and `grace` has passed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from functions.errors import Reject
from functions.logic.facts import file_set as file_set_of
from functions.logic.paths import FROZEN_ROOT, frozen_dir, frozen_path
from functions.resources.rackai import FrozenSet

TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


class Copy(NamedTuple):
    source: str
    target: str
    md5: str


class Plan(NamedTuple):
    directory: str
    copies: tuple[Copy, ...]


def plan(
    namespace: str, model: str, name: str, upload_dir: str, declared: Mapping[str, str], file_set: str
) -> Plan:
    """The copies that freeze `declared` (path -> MD5) as `file_set`; Reject for a declared path
    outside the upload directory or names that cannot make a path (admit refuses both)."""
    directory = frozen_dir(namespace, model, name, file_set)
    copies: list[Copy] = []
    for path, md5 in sorted(declared.items()):
        target = frozen_path(upload_dir, directory, path)
        if target is None:
            raise Reject(f"declared file {path!r} is not under {upload_dir!r}")
        copies.append(Copy(path, target, md5.strip().lower()))
    return Plan(directory, tuple(copies))


def stamp(now: datetime) -> str:
    return now.strftime(TIME_FORMAT)


def current(records: Sequence[FrozenSet] | None, file_set: str | None) -> FrozenSet | None:
    """The record of `file_set` when it is frozen and not retired."""
    return next((r for r in records or () if r.file_set == file_set and r.retired_at is None), None)


def with_current(
    records: Sequence[FrozenSet] | None, record: FrozenSet | None, now: datetime
) -> list[FrozenSet]:
    """The records once `record` is the verified set: every other one retired (from now, unless
    it already was), `record` first; None retires them all (nothing is verified)."""
    out = [record] if record is not None else []
    for other in records or ():
        if record is not None and other.file_set == record.file_set:
            continue
        out.append(other if other.retired_at else other.model_copy(update={"retired_at": stamp(now)}))
    return out


def collectable(
    records: Iterable[FrozenSet], served: Mapping[str, str], now: datetime, grace: timedelta
) -> list[FrozenSet]:
    """Retired records whose copy may be deleted: no pod is recorded serving their file set, and
    `grace` has passed since they were retired (a pod loading it when they retired has long
    reported it by then, and status.served names it)."""
    serving = set(served.values())
    found: list[FrozenSet] = []
    for record in records:
        if record.retired_at is None or record.file_set in serving:
            continue
        try:
            retired = datetime.strptime(record.retired_at, TIME_FORMAT).replace(tzinfo=now.tzinfo)
        except ValueError:
            continue  # a hand-edited time: kept, never deleted on a guess
        if now - retired >= grace:
            found.append(record)
    return found


def total_bytes(records: Iterable[FrozenSet]) -> int:
    return sum(r.size for r in records)


def problem(
    record: FrozenSet,
    upload_dir: str,
    declared: Mapping[str, str],
    sizes: Mapping[str, int | None],
    listing: Iterable[tuple[str, int, str | None]],
    md5_kept: bool = False,
) -> str | None:
    """Why the frozen copy `record` is no longer the verified set, from a listing of its
    directory ((path, size, md5 or None) per file); None when every declared file is there with
    its size (and its MD5, when storage reports one) and nothing else is. `md5_kept`: storage
    keeps an MD5 for every copy loraflow makes (the filer, written with Content-MD5), so a copy
    listed without one was rewritten since (appends leave none).

    The frozen area is loraflow's; a change there (a deletion behind its back, a write that got
    through) means the copy can no longer be vouched for, and verify makes it again.
    """
    found = {path: (size, md5) for path, size, md5 in listing}
    wanted: set[str] = set()
    for path, md5 in sorted(declared.items()):
        target = frozen_path(upload_dir, record.path, path)
        if target is None:
            return f"declared file {path} is not under {upload_dir}"
        wanted.add(target)
        seen = found.get(target)
        if seen is None:
            return f"{target} is gone from the frozen copy"
        size, got = seen
        if sizes.get(path) is not None and size != sizes[path]:
            return f"{target} changed size in the frozen copy"
        if got is not None and got.lower() != md5.strip().lower():
            return f"{target} no longer has the verified MD5"
        if got is None and md5_kept:
            return f"{target} was rewritten in the frozen copy (it has no MD5 any more)"
    extra = sorted(set(found) - wanted)
    if extra:
        return f"{extra[0]} was written into the frozen copy" + (
            f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
        )
    return None


class Orphan(NamedTuple):
    directory: str
    size: int
    why: str


def orphaned(
    files: Iterable[tuple[str, int]], adapters: Mapping[tuple[str, str], Mapping[str, Any] | None]
) -> list[Orphan]:
    """The frozen directories no adapter accounts for, from a listing of the frozen area
    ((path, size) per file) and the vllm adapters named there ((namespace, name) -> the object,
    None when it is gone).

    An orphan is a set whose adapter is gone (deleted, its copies unloaded) or is now for
    another model, or a set its adapter neither records (`status.frozen`) nor declares now (a
    crash between the copy and the status write; a set its spec declares now may be being
    frozen this very moment, so it is left to verify).
    """
    sets: dict[tuple[str, str, str, str], int] = {}
    for path, size in files:
        parts = path.split("/")
        # ['', 'loraflow-frozen', ns, model, name, digest, file...]
        if len(parts) < 7 or "/" + parts[1] != FROZEN_ROOT:
            continue
        key = (parts[2], parts[3], parts[4], parts[5])
        sets[key] = sets.get(key, 0) + size
    found: list[Orphan] = []
    for (namespace, model, name, digest), size in sorted(sets.items()):
        directory = f"{FROZEN_ROOT}/{namespace}/{model}/{name}/{digest}/"
        obj = adapters.get((namespace, name))
        if obj is None:
            found.append(Orphan(directory, size, "its LoRAAdapter is gone"))
            continue
        spec = obj.get("spec") if isinstance(obj.get("spec"), Mapping) else {}
        status = obj.get("status") if isinstance(obj.get("status"), Mapping) else {}
        if str((spec or {}).get("model") or "") != model:
            found.append(Orphan(directory, size, "its LoRAAdapter is for another model now"))
            continue
        recorded = {
            str(r.get("fileSet") or "").removeprefix("md5set:")
            for r in (status or {}).get("frozen") or []
            if isinstance(r, Mapping)
        }
        integrity = (spec or {}).get("integrity")
        declared = integrity.get("md5") if isinstance(integrity, Mapping) else None
        declared_set = file_set_of(declared if isinstance(declared, Mapping) else {})
        if digest not in recorded and digest != declared_set.removeprefix("md5set:"):
            found.append(Orphan(directory, size, "no status records it (left by a crash)"))
    return found
