"""Declared MD5s (spec.integrity.md5) against what storage reported (pure).

A file counts as matching only when an MD5 is known for it (reported by the backend, or
computed by streaming it) and equals the declared one, case-insensitively. A missing MD5
never counts as a match.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from functions.logic import phase
from functions.resources.meta import ConditionStatus

SHOWN = 20
"""How many paths a message lists before it says `and N more`."""


class Observed(NamedTuple):
    md5: str | None
    size: int | None


class Verdict(NamedTuple):
    status: ConditionStatus
    reason: str
    message: str
    upload_complete: bool


def to_hash(expected: Mapping[str, str] | None, observed: Mapping[str, Observed]) -> list[str]:
    """Declared files that are in storage but came without an MD5 (sorted)."""
    return sorted(p for p in expected or {} if p in observed and not observed[p].md5)


def _listing(items: list[str]) -> str:
    shown = ", ".join(items[:SHOWN])
    return shown + (f" and {len(items) - SHOWN} more" if len(items) > SHOWN else "")


def compare(
    expected: Mapping[str, str] | None,
    observed: Mapping[str, Observed],
    hashed: Mapping[str, str | None],
) -> Verdict:
    """The Ready verdict of the integrity check.

    Order: mismatch (IntegrityCheckFailed) > unhashable (Md5Unavailable) > missing
    (AwaitingFiles) > all match (IntegrityVerified); nothing declared -> AwaitingIntegrity.
    """
    if not expected:
        return Verdict("False", phase.AWAITING_INTEGRITY, "No MD5 declared in spec.integrity.md5 yet", False)
    mismatched: list[str] = []
    unavailable: list[str] = []
    missing: list[str] = []
    for path in sorted(expected):
        want = expected[path].strip().lower()
        seen = observed.get(path)
        if seen is None:
            missing.append(path)
            continue
        got = (seen.md5 or hashed.get(path) or "").lower()
        if not got:
            unavailable.append(path)
        elif got != want:
            mismatched.append(f"{path} (expected {want}, observed {got})")
    if mismatched:
        return Verdict(
            "False",
            phase.INTEGRITY_CHECK_FAILED,
            f"MD5 mismatch for {len(mismatched)} file(s): {_listing(mismatched)}",
            False,
        )
    if unavailable:
        return Verdict(
            "False",
            phase.MD5_UNAVAILABLE,
            f"Storage reported no MD5 and the file could not be hashed (too large or gone): "
            f"{_listing(unavailable)}",
            False,
        )
    if missing:
        return Verdict(
            "False",
            phase.AWAITING_FILES,
            f"Waiting for {len(missing)} declared file(s): {_listing(missing)}",
            False,
        )
    return Verdict("True", phase.INTEGRITY_VERIFIED, f"All {len(expected)} declared file(s) match", True)
