"""Row 9's reference: the code before issue 20, its own row 9 run beside ours in the same run.

The figures the issue was filed with (stat 152, load 116 events/s) were measured on a faster
day: this machine's speed drifts by up to 1.7x within an hour, and the old code slows more than
ours when it does (it spends more CPU per event). So the reference is measured again, here:
the tree of `BEFORE_COMMIT` is taken from git (`git archive`, no worktree is registered), given
its own virtualenv by its own Makefile (`make venv`, once, kept under .bench-cache/), and its
`python -m bench --only throughput` runs before ours and after each of our rounds; each round is
held to the mean of the two runs that bracket it, which cancels a drift that is linear in time.
Where the old tree cannot be built (no git history, no registry), the row falls back to the
filed figures and says why.
"""

from __future__ import annotations

import json
import subprocess
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEFORE_COMMIT = "93b319a"
"""The last commit before issue 20's work (its README row 9 is the filed 152 and 116)."""
FILED = {"stat": 152.0, "load": 116.0}
CACHE = ROOT / ".bench-cache"
BUILD_TIMEOUT_S = 1200
RUN_TIMEOUT_S = 600


def tree() -> Path:
    """The old tree, extracted and set up once (its `.venv` made by its own `make venv`)."""
    where = CACHE / f"before-{BEFORE_COMMIT}"
    if not (where / ".venv" / ".installed").exists():
        CACHE.mkdir(exist_ok=True)
        if not (where / "Makefile").exists():
            with tempfile.TemporaryFile() as archive:
                subprocess.run(
                    ["git", "-C", str(ROOT), "archive", "--format=tar", BEFORE_COMMIT],
                    stdout=archive,
                    check=True,
                    timeout=120,
                )
                archive.seek(0)
                with tarfile.open(fileobj=archive) as tar:
                    tar.extractall(where, filter="data")
        subprocess.run(
            ["make", "venv"],
            cwd=where,
            check=True,
            timeout=BUILD_TIMEOUT_S,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
    return where


def measure(where: Path) -> dict[str, float]:
    """One run of the old row 9: events per second of its stat and load bursts."""
    subprocess.run(
        [str(where / ".venv" / "bin" / "python"), "-m", "bench", "--only", "throughput"],
        cwd=where,
        check=True,
        timeout=RUN_TIMEOUT_S,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    details = json.loads((where / "bench" / "results" / "throughput.json").read_text())["details"]
    return {step: float(details[step]["events_per_s"]) for step in FILED}


class Reference:
    """Row 9's reference for one run: `measure()` before ours and after each of our rounds,
    then `brackets()` (each round's reference) and `figures()` (the runs, and their mean). Any
    failure (the tree cannot be built, a run of it fails) turns the whole reference into the
    filed figures, with the reason in `says`: a mean of a measured and a filed figure means
    nothing."""

    def __init__(self, smoke: bool) -> None:
        self.runs: list[dict[str, float]] = []
        self._where: Path | None = None
        self.says = f"{BEFORE_COMMIT}'s own row 9, run before and after ours"
        if smoke:
            self.says = "the filed figures (smoke run)"
            return
        try:
            self._where = tree()
        except (OSError, subprocess.SubprocessError) as err:
            self.says = f"the filed figures: the tree of {BEFORE_COMMIT} could not be built ({err})"

    def measure(self) -> None:
        if self._where is None:
            return
        try:
            self.runs.append(measure(self._where))
        except (OSError, subprocess.SubprocessError, KeyError, ValueError) as err:
            self._where = None
            self.says = f"the filed figures: a run of {BEFORE_COMMIT}'s row 9 failed ({err})"

    def figures(self) -> tuple[dict[str, float], list[dict[str, float]]]:
        """The reference per step (the mean of the runs) and the runs; the filed figures
        unless every run was measured."""
        if self._where is None or not self.runs:
            return dict(FILED), []
        mean = {step: round(sum(run[step] for run in self.runs) / len(self.runs), 1) for step in FILED}
        return mean, self.runs

    def brackets(self, rounds: int) -> list[dict[str, float]]:
        """For each of our `rounds` (each run between two of the old code's), the mean of the
        runs before and after it; the filed figures unless every run was measured."""
        if self._where is None or len(self.runs) != rounds + 1:
            return [dict(FILED) for _ in range(rounds)]
        pairs = zip(self.runs, self.runs[1:], strict=False)
        return [{step: round((a[step] + b[step]) / 2, 1) for step in FILED} for a, b in pairs]
