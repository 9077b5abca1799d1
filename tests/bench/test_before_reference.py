"""Row 9's reference (bench/before.py, bench/throughput.py): the old code's own world in a
process of its own, burst by burst beside ours, each pair's ratio taken; or, when the old
world cannot be had, the filed figures and why: never a measured burst beside a filed one."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from bench import before, throughput


def old_tree(where: Path, figures: dict[str, float], bursts_before_dying: int | None = None) -> Path:
    """A stand-in for the old tree: its `.venv/bin/python` speaks bench/before_driver.py's
    protocol (ready, then one answer per burst) with these events per second per step."""
    python = where / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True, exist_ok=True)
    python.write_text(
        f"#!{sys.executable}\n"
        "import json, sys\n"
        f"figures, left = {figures!r}, {bursts_before_dying!r}\n"
        "print(json.dumps({'ready': True}), flush=True)\n"
        "for line in sys.stdin:\n"
        "    if left == 0:\n"
        "        sys.exit(1)\n"
        "    left = None if left is None else left - 1\n"
        "    ask = json.loads(line)\n"
        "    n = ask['count']\n"
        "    print(json.dumps({'events': n, 'answered': n, 'ok': n, 'events_per_s': figures[ask['step']],\n"
        "                      'function_cpu_ms_per_event': 9.0}), flush=True)\n"
    )
    python.chmod(0o755)
    return where


@pytest.fixture()
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(before, "tree", lambda: tmp_path)
    monkeypatch.setattr(before, "CACHE", tmp_path)
    return tmp_path


def test_a_smoke_run_uses_the_filed_figures() -> None:
    with before.OldStack(smoke=True, adapters=4) as old:
        assert old.burst("stat", 40) is None
    assert "filed" in old.says


def test_the_old_world_answers_each_burst_with_its_own_figures(tree: Path) -> None:
    old_tree(tree, {"stat": 80.0, "load": 50.0})
    with before.OldStack(smoke=False, adapters=20) as old:
        stat, load = old.burst("stat", 400), old.burst("load", 400)
    assert stat is not None and stat["events_per_s"] == 80.0 and stat["answered"] == 400
    assert load is not None and load["events_per_s"] == 50.0
    assert "own row 9 world" in old.says


def test_an_old_world_that_stops_answering_is_said_and_gives_nothing_more(tree: Path) -> None:
    old_tree(tree, {"stat": 80.0, "load": 50.0}, bursts_before_dying=1)
    with before.OldStack(smoke=False, adapters=20) as old:
        assert old.burst("stat", 400) is not None
        assert old.burst("load", 400) is None
        assert old.burst("stat", 400) is None  # gone for good: no later burst is measured
    assert "did not answer a load burst" in old.says


def test_an_old_world_that_never_sets_up_is_said(tree: Path) -> None:
    python = old_tree(tree, {}) / ".venv" / "bin" / "python"
    python.write_text(f"#!{sys.executable}\nimport sys\nsys.exit(3)\n")
    with before.OldStack(smoke=False, adapters=20) as old:
        assert old.burst("stat", 400) is None
    assert "did not set up its world" in old.says


def test_a_tree_that_cannot_be_built_is_said(monkeypatch: pytest.MonkeyPatch) -> None:
    def cannot() -> Path:
        raise OSError("no git here")

    monkeypatch.setattr(before, "tree", cannot)
    with before.OldStack(smoke=False, adapters=20) as old:
        assert old.burst("stat", 400) is None
    assert "could not be built (no git here)" in old.says


def test_the_ratio_is_the_median_of_the_pairs_ratios() -> None:
    figures = throughput.paired([300.0, 240.0, 330.0], [100.0, 100.0, 100.0])
    assert figures["pair_ratios"] == [3.0, 2.4, 3.3]
    assert figures["ratio"] == 3.0  # not 870/300: a slow spell in one pair moves one ratio
    assert (figures["events_per_s"], figures["before_events_per_s"]) == (300.0, 100.0)


def test_the_two_codes_take_turns_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ours first in every other pair: a drift within a pair favours neither code."""
    order: list[str] = []

    def ours(stack: Any, step: str, adapters: list[str], count: int) -> dict[str, Any]:
        order.append("ours")
        return {"events_per_s": 1.0}

    class Old:
        def burst(self, step: str, count: int) -> dict[str, Any]:
            order.append("old")
            return {"events_per_s": 1.0}

    monkeypatch.setattr(throughput, "_burst", ours)
    throughput._pairs(None, Old(), "load", ["a"], 10, 4)  # type: ignore[arg-type]
    assert order == ["old", "ours", "ours", "old", "old", "ours", "ours", "old"]


def test_the_driver_is_the_old_trees_own_script() -> None:
    """It imports nothing of ours: every module it uses comes from the tree it runs in."""
    source = before.DRIVER.read_text()
    assert 'import_module("bench.throughput")' in source
    assert not [line for line in source.splitlines() if line.startswith(("from bench", "from functions"))]
