"""The installed console script: exit codes and messages, no tracebacks; `--help` and the
message naming the `cli` extra work where that extra is not installed."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = Path(sys.executable).parent / "loraflow"
ROOT = Path(__file__).resolve().parents[2]

# Runs the CLI's entry point as the console script does, with the `cli` extra's distributions
# hidden the way an environment without them behaves (their import fails), and reports which
# of the heavy modules got imported.
WITHOUT_EXTRA = textwrap.dedent(
    """
    import importlib.abc, json, sys

    HIDDEN = set(json.loads(sys.argv[1]))

    class NotInstalled(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in HIDDEN:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NotInstalled())
    from loraflow.cli import main
    try:
        code = main(sys.argv[2:])
    except SystemExit as done:
        code = done.code
    heavy = sorted(m for m in ("rich", "kubernetes", "httpx") if m in sys.modules)
    print(json.dumps({"code": code, "imported": heavy}))
    """
)


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), *argv], capture_output=True, text=True, timeout=60, check=False)


def without_extra(
    hidden: list[str], *argv: str
) -> tuple[dict[str, object], subprocess.CompletedProcess[str]]:
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_EXTRA, json.dumps(hidden), *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return report, done


def test_help_and_usage_errors() -> None:
    assert run("--help").returncode == 0
    assert run("upload").returncode == 2  # argparse: DIR, --model, --name missing


def test_expected_failure_is_one_line_and_exit_1(tmp_path: Path) -> None:
    result = run("status", "--endpoints", str(tmp_path / "missing.json"))
    assert result.returncode == 1
    assert "endpoints file" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("argv", [["--help"], ["status", "--help"], ["upload", "--help"], ["events", "-h"]])
def test_help_imports_none_of_the_commands_libraries(argv: list[str]) -> None:
    """Help is argparse alone: the kubernetes package takes ~0.3 s to import (bench 12 times it)."""
    report, done = without_extra([], *argv)
    assert report == {"code": 0, "imported": []}
    assert "usage: loraflow" in done.stdout


@pytest.mark.parametrize("hidden", [["rich", "kubernetes"], ["kubernetes"], ["rich"]])
@pytest.mark.parametrize(
    "argv",
    [
        ["status", "--endpoints", "missing.json"],
        ["upload", ".", "--model", "m", "--name", "n", "--endpoints", "missing.json"],
        ["events", "--broker-url", "http://127.0.0.1:9"],
    ],
    ids=["status", "upload", "events"],
)
def test_without_the_cli_extra_one_line_names_it(hidden: list[str], argv: list[str]) -> None:
    report, done = without_extra(hidden, *argv)
    assert report["code"] == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "pip install 'loraflow[cli]'" in lines[0]
    assert any(f"({module} is not installed)" in lines[0] for module in hidden)


def test_a_missing_module_outside_the_extra_is_not_blamed_on_it() -> None:
    """Only the extra's own modules get the install hint; anything else stays a real error."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            WITHOUT_EXTRA,
            json.dumps(["functions"]),
            "upload",
            ".",
            "--model",
            "m",
            "--name",
            "n",
            "--endpoints",
            "missing.json",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert "ModuleNotFoundError" in done.stderr and "loraflow[cli]" not in done.stderr
