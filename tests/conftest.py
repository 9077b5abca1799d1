"""Fixtures more than one tier uses. Helpers live in tests/support; fixtures live in conftest."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.testbed import Testbed, testbed


@pytest.fixture(scope="session")
def world() -> Iterator[Testbed]:
    """The stand-ins and every function over real HTTP, started once per test session (for
    tests/functions and tests/reliability); each test takes a fresh namespace, so tests never
    see each other's objects."""
    with testbed(Testbed) as started:
        yield started
