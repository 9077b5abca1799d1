"""The composition root: a Deps closes the clients it built, never the ones it was given, and
`reset_deps` closes the process's Deps before forgetting them (an environment change must not
leave the old clients' connections open)."""

from __future__ import annotations

from typing import Any

import pytest

from functions.edge.bootstrap import Deps, deps, reset_deps
from functions.settings import Settings


class Closable:
    def __init__(self) -> None:
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> Closable:
    """What `Deps` builds for its engines port in these tests."""
    engines = Closable()
    monkeypatch.setattr(Deps, "_build_engines", lambda self: engines)
    return engines


def test_a_deps_closes_what_it_built_once_and_leaves_what_it_was_given(built: Closable) -> None:
    given = Closable()
    made = Deps(Settings(), kube=given)  # type: ignore[arg-type]
    engines: Any = made.engines
    kube: Any = made.kube
    assert engines is built and kube is given
    made.close()
    made.close()
    assert (built.closed, given.closed) == (1, 0)


def test_a_port_never_used_is_never_built_nor_closed(built: Closable) -> None:
    Deps(Settings()).close()
    assert built.closed == 0


def test_reset_deps_closes_the_process_deps_and_the_next_call_builds_anew(built: Closable) -> None:
    first = deps("probe")
    assert first.engines is built  # type: ignore[comparison-overlap]
    assert deps("probe") is first
    reset_deps()
    assert built.closed == 1
    assert deps("probe") is not first
    reset_deps()
