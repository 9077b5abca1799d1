"""Freezing a verified file set where only loraflow writes, and deleting retired copies.

verify calls `freeze` once the declared MD5s match, before it says Ready: the declared files are
copied server-side (the filer's `cp.from`, S3 CopyObject; bench/freeze.py measured the choices)
to `/loraflow-frozen/{ns}/{model}/{name}/{digest}/`, and the copies' bytes are hashed by
streaming and compared with the declared MD5s once more. That second check closes the window
between verification and copy (a file replaced meanwhile is refused, not frozen), and catches a
copy someone else put at that path. The engines then load the frozen directory: what they read
later (vLLM after an eviction, a restarted pod, a reload) is the verified set, whatever becomes
of the upload directory.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import NamedTuple

from functions.adapters.concurrency import bounded_map
from functions.logic import frozen
from functions.observability import FROZEN_BYTES
from functions.ports import StoragePort
from functions.resources.rackai import FrozenSet

FREEZE_FAILED = "FreezeFailed"
"""Ready False (not terminal, so resync nudges it again): the frozen copy could not be made or
did not hash to the declared MD5s."""


COPIES_AT_ONCE = 4
"""A set's files are copied (and hashed) a few at a time: many small files pay their round trips
side by side, while large ones share the filer's bandwidth either way."""


class Refusal(NamedTuple):
    reason: str
    message: str


def freeze(
    storage: StoragePort,
    namespace: str,
    model: str,
    name: str,
    upload_dir: str,
    declared: Mapping[str, str],
    sizes: Mapping[str, int],
    file_set: str,
    hash_limit: int,
    now: datetime,
) -> FrozenSet | Refusal:
    """Copy the declared files to the set's frozen directory and check every copy's MD5.

    A copy already there (an earlier attempt that crashed, a redelivery) is kept when it hashes
    right; anything else in that directory (a file nobody declared, a copy that does not match)
    makes it start again from an empty directory, once.
    """
    plan = frozen.plan(namespace, model, name, upload_dir, declared, file_set)
    targets = {c.target for c in plan.copies}
    listed = {f.path: f for f in storage.stat_dir(plan.directory)}
    if set(listed) - targets:
        storage.delete_tree(plan.directory)  # foreign files: not a set loraflow froze
        listed = {}
    wrong: list[str] = []
    for _ in range(2):
        missing = [
            c for c in plan.copies if (there := listed.get(c.target)) is None or there.size != sizes[c.source]
        ]
        copied = bounded_map(
            missing, lambda c: storage.copy_file(c.source, c.target, sizes[c.source], c.md5), COPIES_AT_ONCE
        )
        for copy, done in copied:
            if done:
                FROZEN_BYTES.labels("frozen").inc(sizes[copy.source])
        refused = [copy.source for copy, done in copied if not done]
        if refused:
            message = f"{refused[0]} changed, went, or no longer hashes to its declared MD5"
            return Refusal(FREEZE_FAILED, message + " while it was being frozen")
        # a storage that checks Content-MD5 hashed the bytes it stored; the copies kept from an
        # earlier attempt, or any storage that does not check, are hashed here
        checked = {c.target for c in missing} if storage.copy_checks_md5 else set()
        hashed = bounded_map(
            [c for c in plan.copies if c.target not in checked],
            lambda c: _md5_of(storage, c.target, hash_limit),
            COPIES_AT_ONCE,
        )
        wrong = [c.source for c, md5 in hashed if md5 != c.md5]
        if not wrong:
            size = sum(sizes[c.source] for c in plan.copies)
            return FrozenSet(file_set=file_set, path=plan.directory, size=size, frozen_at=frozen.stamp(now))
        storage.delete_tree(plan.directory)
        listed = {}
    shown = ", ".join(wrong[:5]) + (f" and {len(wrong) - 5} more" if len(wrong) > 5 else "")
    return Refusal(
        FREEZE_FAILED,
        f"the frozen copy of {shown} does not hash to the declared MD5 (changed while being frozen?)",
    )


def _md5_of(storage: StoragePort, path: str, limit: int) -> str | None:
    return storage.hash_file(path, limit) if limit > 0 else None


def collect(
    storage: StoragePort,
    records: list[FrozenSet],
    served: Mapping[str, str],
    now: datetime,
    grace: timedelta,
) -> list[FrozenSet]:
    """Delete the retired copies no pod serves once `grace` has passed; the records left."""
    gone = frozen.collectable(records, served, now, grace)
    for record in gone:
        storage.delete_tree(record.path)
        FROZEN_BYTES.labels("deleted").inc(record.size)
    names = {r.file_set for r in gone}
    return [r for r in records if r.file_set not in names]
