"""Row 9's reference: the code before issue 20, its own row 9 world running beside ours.

The figures the issue was filed with (stat 152, load 116 events/s) were measured on a faster
day, and this machine's speed swings within seconds: a loop of fixed work on each core took
150-300 ms of CPU per round, in spells of 5-30 s (a VM's neighbours), so two runs a minute
apart compare two different machines. So the old code is measured here, burst by burst beside
ours: the tree of `BEFORE_COMMIT` is taken from git (`git archive`, no worktree is registered),
given its own virtualenv by its own Makefile (`make venv`, once, kept under .bench-cache/), and
its interpreter runs bench/before_driver.py in it: the old row 9's world, set up by the old
code's own `_setup`, answering one burst of its own nudges at a time (`OldStack`). Row 9 then
alternates the two codes' bursts, and each pair's ratio is taken (bench/throughput.py).
Where the old tree cannot be built or its world fails (no git history, no registry), the row
falls back to the filed figures and says why.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import tarfile
import tempfile
from pathlib import Path
from types import TracebackType
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[1]
BEFORE_COMMIT = "93b319a"
"""The last commit before issue 20's work (its README row 9 is the filed 152 and 116)."""
FILED = {"stat": 152.0, "load": 116.0}
CACHE = ROOT / ".bench-cache"
DRIVER = Path(__file__).resolve().parent / "before_driver.py"
BUILD_TIMEOUT_S = 1200
READY_TIMEOUT_S = 300
BURST_TIMEOUT_S = 300


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


class OldStack:
    """The old code's row 9 world in a process of its own, one burst at a time.

    `burst(step, count)` gives that burst's figures (events per second, answered, 2xx, the
    function's CPU per event), or None once the old world is not there: it could not be built,
    it failed, or this is a smoke run. `says` names the reference either way. The process is
    started on entering (its set-up runs while the caller sets up its own) and stopped on
    leaving."""

    def __init__(self, smoke: bool, adapters: int) -> None:
        self.says = f"{BEFORE_COMMIT}'s own row 9 world, its bursts alternated with ours"
        self._adapters = adapters
        self._where: Path | None = None
        self._process: subprocess.Popen[str] | None = None
        self._ready = False
        if smoke:
            self.says = "the filed figures (smoke run)"
            return
        try:
            self._where = tree()
        except (OSError, subprocess.SubprocessError) as err:
            self.says = f"the filed figures: the tree of {BEFORE_COMMIT} could not be built ({err})"

    def __enter__(self) -> OldStack:
        if self._where is not None:
            log = (CACHE / f"before-{BEFORE_COMMIT}.driver.log").open("w")
            try:
                self._process = subprocess.Popen(
                    [str(self._where / ".venv" / "bin" / "python"), "-c", _RUN_DRIVER, str(DRIVER)],
                    cwd=self._where,
                    env=_environment(self._adapters),
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    text=True,
                )
            except OSError as err:
                self._fail(f"could not be started ({err})")
            finally:
                log.close()
        return self

    def burst(self, step: str, count: int) -> dict[str, Any] | None:
        if self._process is None or not self._await_ready():
            return None
        assert self._process.stdin is not None
        try:
            self._process.stdin.write(json.dumps({"step": step, "count": count}) + "\n")
            self._process.stdin.flush()
        except OSError as err:
            self._fail(f"stopped taking bursts ({err})")
            return None
        answer = self._line(BURST_TIMEOUT_S)
        if answer is None or answer.get("answered") != count:
            self._fail(f"did not answer a {step} burst of {count} (got {answer})")
            return None
        return answer

    def __exit__(self, *_: object | TracebackType | None) -> None:
        self._stop()

    def _stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        try:
            if process.stdin is not None:
                process.stdin.close()  # the driver's loop ends, and its stack stops
            process.wait(60)
        except (OSError, subprocess.TimeoutExpired):
            process.kill()
            process.wait(10)

    def _await_ready(self) -> bool:
        if not self._ready:
            answer = self._line(READY_TIMEOUT_S)
            if answer is None or answer.get("ready") is not True:
                self._fail(f"did not set up its world (got {answer})")
                return False
            self._ready = True
        return True

    def _line(self, timeout: float) -> dict[str, Any] | None:
        """The driver's next line, read within `timeout`; None if it ended or said nothing."""
        assert self._process is not None and self._process.stdout is not None
        out: IO[str] = self._process.stdout
        readable, _, _ = select.select([out], [], [], timeout)
        line = out.readline() if readable else ""
        try:
            found = json.loads(line) if line else None
        except ValueError:
            return None
        return found if isinstance(found, dict) else None

    def _fail(self, what: str) -> None:
        self.says = f"the filed figures: {BEFORE_COMMIT}'s row 9 world {what}"
        self._stop()
        self._where = None


_RUN_DRIVER = "import runpy, sys; runpy.run_path(sys.argv[1], run_name='__main__')"
"""Run bench/before_driver.py as the old tree's own script: the old tree (the current
directory) first on sys.path, so every module it imports is the old code's."""


def _environment(adapters: int) -> dict[str, str]:
    return {**os.environ, "ADAPTERS": str(adapters)}
