"""One way to wait for the truth: poll a check until it holds, never a fixed sleep."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class NotReached(AssertionError):
    """The check did not hold in time. An AssertionError, so pytest reports a failed test."""


def eventually(
    check: Callable[[], T], timeout: float = 20.0, what: str = "condition", interval: float = 0.1
) -> T:
    """Call `check` every `interval` seconds until it returns something truthy, and return that.

    After `timeout` seconds, one last call decides; if it is still falsy, NotReached names `what`
    and the last value seen."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise NotReached(f"{what}: not reached within {timeout:g}s (last: {value!r})")
        time.sleep(interval)
