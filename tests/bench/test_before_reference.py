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
    does."""
    python = where / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    result = where / "bench" / "results" / "throughput.json"
    result.parent.mkdir(parents=True)
    details = {"details": {"stat": {"events_per_s": stat}, "load": {"events_per_s": load}}}
    python.write_text(f"#!/bin/sh\necho '{json.dumps(details)}' > {result}\n")
    python.chmod(0o755)
    return where


def test_two_measured_runs_give_their_mean(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    where = old_tree(tmp_path, stat=80.0, load=50.0)
    monkeypatch.setattr(before, "tree", lambda: where)
    reference = before.Reference(smoke=False)
    reference.measure()
    old_tree(tmp_path / "second", stat=90.0, load=60.0)
    script = (tmp_path / "second" / ".venv" / "bin" / "python").read_text()
    (where / ".venv" / "bin" / "python").write_text(script.replace(str(tmp_path / "second"), str(where)))
    reference.measure()
    mean, runs = reference.figures()
    assert runs[0] == {"stat": 80.0, "load": 50.0}
    assert mean == {"stat": 85.0, "load": 55.0}
    assert "run before and after ours" in reference.says


def test_a_failed_run_makes_the_whole_reference_the_filed_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    where = old_tree(tmp_path, stat=80.0, load=50.0)
    monkeypatch.setattr(before, "tree", lambda: where)
    reference = before.Reference(smoke=False)
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
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    where = old_tree(tmp_path, stat=80.0, load=50.0)
    monkeypatch.setattr(before, "tree", lambda: where)
    reference = before.Reference(smoke=False)
    python = where / ".venv" / "bin" / "python"
    script = python.read_text()
    for stat in (80.0, 90.0, 70.0):  # the old code's stat figure in its three runs
        python.write_text(script.replace('"events_per_s": 80.0', f'"events_per_s": {stat}'))
        reference.measure()
    assert [b["stat"] for b in reference.brackets(2)] == [85.0, 80.0]
    assert reference.brackets(3) == [before.FILED] * 3  # a run short: nothing measured is mixed in
