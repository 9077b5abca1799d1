"""JSON merge patch (RFC 7386) between two JSON documents (pure).

The status writer sends the difference between the current and the desired status:
changed members, and `null` for members the desired status no longer has. Lists are
replaced whole, as merge patch does, so `conditions` always travels complete.
"""

from __future__ import annotations

from typing import Any


def diff(current: Any, desired: Any) -> Any:
    """The merge patch that turns `current` into `desired` ({} when they are equal)."""
    if not isinstance(current, dict) or not isinstance(desired, dict):
        return desired
    patch: dict[str, Any] = {}
    for key, value in desired.items():
        if key not in current:
            patch[key] = value
        elif current[key] != value:
            patch[key] = diff(current[key], value) if isinstance(value, dict) else value
    for key in current:
        if key not in desired:
            patch[key] = None
    return patch
