"""End-to-end harness: the embedded stack, with the broker routing by the real Triggers."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from devstack.demo import Cluster
from devstack.stack import Stack


def eventually(check: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    """Poll until `check()` is truthy; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not reached within {timeout:.0f}s")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with Stack(ping_period=2.0, time_scale=0.1) as running:
        yield running


@pytest.fixture
def cluster(stack: Stack) -> Cluster:
    """A fresh namespace on the module's stack, so tests never see each other's objects."""
    namespace = f"e2e-{secrets.token_hex(3)}"
    stack.core.create_namespace({"metadata": {"name": namespace}})
    return Cluster(stack, namespace)
