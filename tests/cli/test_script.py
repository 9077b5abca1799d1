"""The installed console script: exit codes and messages, no tracebacks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(sys.executable).parent / "loraflow"


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), *argv], capture_output=True, text=True, timeout=60, check=False)


def test_help_and_usage_errors() -> None:
    assert run("--help").returncode == 0
    assert run("upload").returncode == 2  # argparse: DIR, --model, --name missing


def test_expected_failure_is_one_line_and_exit_1(tmp_path: Path) -> None:
    result = run("status", "--endpoints", str(tmp_path / "missing.json"))
    assert result.returncode == 1
    assert "endpoints file" in result.stderr and "Traceback" not in result.stderr
