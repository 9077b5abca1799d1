"""Reliability suite: the functions harness (`world`, from tests/conftest.py) and one embedded
stack per module (`rstack`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from devstack.seaweedfs import shared
from devstack.stack import Stack
from tests.support.convergence import PING_PERIOD_S


@pytest.fixture(scope="module")
def rstack() -> Iterator[Stack]:
    """One embedded stack per module: a fast resync tick, fast broker backoffs."""
    with Stack(ping_period=PING_PERIOD_S, time_scale=0.05, seaweed=shared()) as running:
        yield running
