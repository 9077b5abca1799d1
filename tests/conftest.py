"""Fixtures more than one tier uses. Helpers live in tests/support; fixtures live in conftest."""

from __future__ import annotations

import gc
import os
import warnings
from collections.abc import Iterator
from pathlib import Path, PurePath

import pytest

from devstack.kubernetes import SEEDED
from tests.support.testbed import Testbed, testbed

TESTS = Path(__file__).resolve().parent
LEAKY_TIERS = ("stack",)
"""The tier that still leaves a socket to the GC: the embedded stack in the test process."""
UNCLOSED_SOCKET = r"unclosed <(socket\.socket|ssl\.SSLSocket) "
LEFT_TO_THE_GC = tuple((f"{tier}/", UNCLOSED_SOCKET) for tier in LEAKY_TIERS)
"""(where, the ResourceWarning message) of what tests still leave for the garbage collector to
close: a client socket to one of the servers the stack runs, dropped by one of its parts. Not
an error there (every other warning is), until it is closed."""


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
        for message in _left_to_the_gc(item):
            item.add_marker(pytest.mark.filterwarnings(f"ignore:{message}:ResourceWarning"))


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The garbage those tests left is collected under their filters, before pytest collects the
    rest at exit (where only pyproject.toml's filters apply)."""
    messages = {message for item in session.items for message in _left_to_the_gc(item)}
    if messages:
        with warnings.catch_warnings():
            for message in messages:
                warnings.filterwarnings("ignore", message, ResourceWarning)
            gc.collect()


def _under_tests(item: pytest.Item) -> PurePath | None:
    try:
        return item.path.resolve().relative_to(TESTS)
    except ValueError:
        return None


def _left_to_the_gc(item: pytest.Item) -> list[str]:
    where = _under_tests(item)
    if where is None or os.environ.get("LORAFLOW_NO_GC_EXEMPTIONS"):
        return []  # the variable shows what a folder still leaves, to close it
    return [message for prefix, message in LEFT_TO_THE_GC if where.as_posix().startswith(prefix)]
