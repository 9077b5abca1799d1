"""12. `loraflow --help`: the installed console script, process start to exit, against the bare
interpreter (`python -c pass`) launched just before each run.

The CLI imports each command's libraries when the command runs (loraflow/cli.py): help is
argparse alone. Importing the kubernetes package took ~0.3 s, which is what `--help` cost before.
Target: <= 0.3 s.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench.common import Result, median_of, timed

SCRIPT = Path(sys.executable).parent / "loraflow"


def _run(argv: list[str]) -> float:
    return timed(lambda: subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, timeout=30))


def run(smoke: bool) -> Result:
    rounds = 3 if smoke else 21
    _run([str(SCRIPT), "--help"])  # warm the OS caches once
    pairs = [(_run([sys.executable, "-c", "pass"]), _run([str(SCRIPT), "--help"])) for _ in range(rounds)]
    bare, ours = median_of([b for b, _ in pairs]), median_of([o for _, o in pairs])
    subcommands = {
        name: median_of([_run([str(SCRIPT), name, "--help"]) for _ in range(3 if smoke else 7)])
        for name in ("upload", "status", "events")
    }
    return Result(
        name="cli_help",
        title="CLI: `loraflow --help`, process start to exit",
        value=round(ours * 1000, 1),
        unit="ms",
        reference=round(bare * 1000, 1),
        ratio=round(median_of([o / b for b, o in pairs]), 2),
        target="<= 300 ms",
        met=ours <= 0.3,
        details={
            "rounds": rounds,
            "subcommand_help_ms": {k: round(v * 1000, 1) for k, v in subcommands.items()},
        },
        note="reference = bare `python -c pass`; "
        + ", ".join(f"`{k} --help` {v * 1000:.0f} ms" for k, v in subcommands.items()),
    )
