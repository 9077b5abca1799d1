"""Row 9's reference (bench/before.py): measured runs of the old code, or, when any of them
cannot be had, the filed figures and why: never a mean of a measured and a filed figure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import before


def test_a_smoke_run_uses_the_filed_figures() -> None:
    reference = before.Reference(smoke=True)
    reference.measure()
    assert reference.figures() == (before.FILED, [])
    assert "filed" in reference.says


def old_tree(where: Path, stat: float, load: float) -> Path:
    """A stand-in for the old tree: its `.venv/bin/python` writes row 9's JSON as the old bench
    does (called again on the same tree: its next runs give these figures)."""
    python = where / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True, exist_ok=True)
    result = where / "bench" / "results" / "throughput.json"
    result.parent.mkdir(parents=True, exist_ok=True)
    details = {"details": {"stat": {"events_per_s": stat}, "load": {"events_per_s": load}}}
    python.write_text(f"#!/bin/sh\necho '{json.dumps(details)}' > {result}\n")
    python.chmod(0o755)
    return where


@pytest.fixture()
def measuring(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, before.Reference]:
    """A reference over an old tree whose runs give stat 80, load 50 (until `old_tree` again)."""
    where = old_tree(tmp_path, stat=80.0, load=50.0)
    monkeypatch.setattr(before, "tree", lambda: where)
    return where, before.Reference(smoke=False)


def test_two_measured_runs_give_their_mean(measuring: tuple[Path, before.Reference]) -> None:
    where, reference = measuring
    reference.measure()
    old_tree(where, stat=90.0, load=60.0)
    reference.measure()
    mean, runs = reference.figures()
    assert runs[0] == {"stat": 80.0, "load": 50.0}
    assert mean == {"stat": 85.0, "load": 55.0}
    assert "run before and after ours" in reference.says


def test_a_failed_run_makes_the_whole_reference_the_filed_one(
    measuring: tuple[Path, before.Reference],
) -> None:
    where, reference = measuring
    reference.measure()
    (where / ".venv" / "bin" / "python").write_text("#!/bin/sh\nexit 1\n")
    reference.measure()
    assert reference.figures() == (before.FILED, [])
    assert "failed" in reference.says


def test_a_tree_that_cannot_be_built_is_said(monkeypatch: pytest.MonkeyPatch) -> None:
    def cannot() -> Path:
        raise OSError("no git here")

    monkeypatch.setattr(before, "tree", cannot)
    reference = before.Reference(smoke=False)
    reference.measure()
    assert reference.figures() == (before.FILED, [])
    assert "could not be built (no git here)" in reference.says


def test_each_round_is_held_to_the_runs_on_either_side(
    measuring: tuple[Path, before.Reference],
) -> None:
    where, reference = measuring
    for stat in (80.0, 90.0, 70.0):  # the old code's stat figure in its three runs
        old_tree(where, stat=stat, load=50.0)
        reference.measure()
    assert [b["stat"] for b in reference.brackets(2)] == [85.0, 80.0]
    assert reference.brackets(3) == [before.FILED] * 3  # a run short: nothing measured is mixed in
