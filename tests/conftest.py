"""Fixtures more than one tier uses. Helpers live in tests/support; fixtures live in conftest."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path, PurePath

import pytest

from devstack.kubernetes import SEEDED
from tests.support.testbed import Testbed, testbed

TESTS = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def world() -> Iterator[Testbed]:
    """The stand-ins and every function over real HTTP, started once per test session (for
    tests/functions and tests/reliability); each test takes a fresh namespace, so tests never
    see each other's objects."""
    with testbed(Testbed) as started:
        yield started


def pytest_configure(config: pytest.Config) -> None:
    """The session starts many control planes with the same manifests: each set is installed
    once, into an etcd the others start from (devstack.kubernetes.prepared)."""
    os.environ.setdefault(SEEDED, "1")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test with its tier, the folder under tests/ it lives in (`--strict-markers`
    fails the run for a folder whose marker pyproject.toml does not register)."""
    for item in items:
        where = _under_tests(item)
        if where is None:
            continue  # a test collected from outside tests/ belongs to no tier
        if len(where.parts) > 1:
            item.add_marker(where.parts[0])


def _under_tests(item: pytest.Item) -> PurePath | None:
    try:
        return item.path.resolve().relative_to(TESTS)
    except ValueError:
        return None
