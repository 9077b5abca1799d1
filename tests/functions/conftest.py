"""Shared harness: the real functions-framework apps over real HTTP, against the stand-ins.

One testbed per test session (devstack.testbed: stand-ins start once); each test takes a fresh
namespace, so tests never see each other's objects.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from devstack.testbed import FUNCTIONS_USER, ROOT, Testbed, testbed

World = Testbed
__all__ = ["FUNCTIONS_USER", "ROOT", "World", "world"]


@pytest.fixture(scope="session")
def world() -> Iterator[World]:
    with testbed(World) as started:
        yield started
