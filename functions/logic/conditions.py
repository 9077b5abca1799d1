"""metav1.Condition bookkeeping, as meta.SetStatusCondition does it (pure).

lastTransitionTime moves only when `status` flips (or the condition is new); reason,
message and observedGeneration are updated in place. Lists are kept sorted by type so
that diffs stay stable and a no-op write can be detected by equality.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

from functions.resources.meta import Condition, ConditionStatus

MESSAGE_MAX = 32768


def timestamp(now: datetime) -> str:
    """RFC 3339 in UTC, truncated to seconds, as the apiserver serialises metav1.Time."""
    return now.astimezone(UTC).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def find(conditions: Sequence[Condition] | None, type_: str) -> Condition | None:
    return next((c for c in conditions or () if c.type == type_), None)


def is_true(conditions: Sequence[Condition] | None, type_: str) -> bool:
    found = find(conditions, type_)
    return found is not None and found.status == "True"


def set_condition(
    conditions: Sequence[Condition] | None,
    type_: str,
    status: ConditionStatus,
    reason: str,
    message: str,
    generation: int | None,
    now: datetime,
) -> list[Condition]:
    """Return a new list with `type_` set; the input is not modified."""
    previous = find(conditions, type_)
    moved = previous is None or previous.status != status
    updated = Condition(
        type=type_,
        status=status,
        reason=reason,
        message=message[:MESSAGE_MAX],
        observed_generation=generation,
        last_transition_time=timestamp(now) if moved or previous is None else previous.last_transition_time,
    )
    others = [c for c in conditions or () if c.type != type_]
    return sort([*others, updated])


def remove(conditions: Sequence[Condition] | None, type_: str) -> list[Condition]:
    return [c for c in conditions or () if c.type != type_]


def sort(conditions: Iterable[Condition]) -> list[Condition]:
    return sorted(conditions, key=lambda c: c.type)
