"""How pytest-xdist deals the server tiers out to its processes (a plugin: `-p tests.support.scheduling`).

A module's tests stay in one process, as with `--dist loadfile`, because their servers are
module fixtures; the benchmark smoke rows each start their own servers, so each goes apart
instead of keeping one process busy for all of them while the others idle at the end.
"""

from __future__ import annotations

import pytest
from xdist.remote import Producer
from xdist.scheduler import LoadFileScheduling

EACH_TEST_APART = frozenset({"tests/bench/test_bench_smoke.py"})
"""Modules whose tests share no fixture wider than a test."""


class ModuleScheduling(LoadFileScheduling):  # type: ignore[misc]  # its base class is untyped
    """`loadfile`, but a test of EACH_TEST_APART is a unit of its own, and units go out in
    collection order: the benchmark rows, the longest units, are collected first."""

    def __init__(self, config: pytest.Config, log: Producer | None = None) -> None:
        super().__init__(config, log)
        # xdist's default order (most tests first) would leave the one-test units for last.
        config.option.loadscopereorder = False

    def _split_scope(self, nodeid: str) -> str:
        if nodeid.partition("::")[0] in EACH_TEST_APART:
            return nodeid
        return str(super()._split_scope(nodeid))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> ModuleScheduling | None:
    """Only for `--dist loadfile`: any other mode asked for on the command line is honoured."""
    if config.getvalue("dist") != "loadfile":
        return None
    return ModuleScheduling(config, log)
