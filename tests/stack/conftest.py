"""End-to-end harness: the embedded stack, with the broker routing by the real Triggers."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest

from devstack.seaweedfs import shared
from devstack.stack import Stack
from tests.support.cluster import Cluster


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with Stack(ping_period=2.0, time_scale=0.1, seaweed=shared()) as running:
        yield running


@pytest.fixture
def cluster(stack: Stack) -> Cluster:
    """A fresh namespace on the module's stack, so tests never see each other's objects."""
    namespace = f"e2e-{secrets.token_hex(3)}"
    stack.core.create_namespace({"metadata": {"name": namespace}})
    return Cluster(stack, namespace)
