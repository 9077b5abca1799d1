"""`python -m bench [--smoke] [--only NAME ...] [--update-readme]`

Runs each benchmark in a fresh subprocess (isolation, and a clean peak-RSS per benchmark),
writes bench/results/<name>.json (`.smoke.json` with --smoke), prints a table, and with
--update-readme rewrites the README block between `<!-- bench:start -->` and
`<!-- bench:end -->` (or bench/results/README-table.md when the markers are missing).
"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
import time
from pathlib import Path

from bench.common import RESULTS, Result, machine

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
START, END = "<!-- bench:start -->", "<!-- bench:end -->"

# module -> its row in the README table
BENCHMARKS: dict[str, int] = {
    "restart": 2,
    "fanout": 3,
    "cold_start": 4,
    "kube_cost": 5,
    "storage_scale": 6,
    "md5_stream": 7,
    "resync_scale": 8,
    "models": 10,
    "cli_help": 12,
    "update_gap": 13,
    "notification_latency": 14,
    "upload_storm": 15,
}
OPTIONAL = {
    "upload_latency": 1,
    "throughput": 9,
    "pipeline_cold": 11,
    "freeze": 16,
    "capacity": 17,
    "transport": 18,
}
"""Run when their module exists (the stack's rows, and rows other work adds)."""


def available() -> dict[str, int]:
    found = dict(BENCHMARKS)
    for name, number in OPTIONAL.items():
        if (Path(__file__).parent / f"{name}.py").exists():
            found[name] = number
    return dict(sorted(found.items(), key=lambda item: item[1]))


def run_one(name: str, smoke: bool) -> Result:
    """Child side: run the benchmark, write its JSON."""
    module = importlib.import_module(f"bench.{name}")
    result: Result = module.run(smoke)
    result.write(smoke)
    return result


def spawn(name: str, smoke: bool) -> tuple[dict[str, object] | None, float, str]:
    log = RESULTS / f"{name}{'.smoke' if smoke else ''}.log"
    RESULTS.mkdir(exist_ok=True)
    started = time.monotonic()
    with log.open("w") as out:
        command = [sys.executable, "-m", "bench", "--child", name] + (["--smoke"] if smoke else [])
        code = subprocess.call(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    elapsed = time.monotonic() - started
    path = RESULTS / f"{name}{'.smoke' if smoke else ''}.json"
    if code != 0 or not path.exists() or path.stat().st_mtime < time.time() - elapsed - 1:
        tail = log.read_text(errors="replace").splitlines()[-5:]
        return None, elapsed, f"failed (exit {code}): " + " | ".join(tail)
    return json.loads(path.read_text()), elapsed, ""


def fmt(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.3g}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)


def table_rows(records: list[tuple[str, dict[str, object] | None, str]]) -> list[list[str]]:
    rows = []
    for name, record, error in records:
        number = available().get(name, 0)
        if record is None:
            rows.append([f"{number}. {name}", "not run", "-", "-", "-", "no", error[:200]])
            continue
        rows.append(
            [
                f"{number}. {record['title']}",
                f"{fmt(record['value'])} {record['unit']}",
                fmt(record.get("reference")),
                fmt(record.get("ratio")),
                str(record["target"]),
                "yes" if record["met"] else "**no**",
                str(record.get("note") or ""),
            ]
        )
    return rows


HEADER = ["benchmark", "figure", "reference", "ratio", "target", "met", "notes"]


def markdown(rows: list[list[str]], smoke: bool, total_s: float) -> str:
    m = machine()
    lines = [
        f"Machine: {m['processor']}, {m['cpus']} CPUs, {m['system']}, Python {m['python']}; "
        f"`python -m bench{' --smoke' if smoke else ''}` took {total_s:.0f} s "
        f"({time.strftime('%Y-%m-%d', time.gmtime())}). Medians over repeated runs; "
        "the reference is measured in the same run.",
        "",
        "| " + " | ".join(HEADER) + " |",
        "|" + "---|" * len(HEADER),
    ]
    lines += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def update_readme(text: str) -> Path:
    if README.exists():
        content = README.read_text()
        if START in content and END in content:
            head, rest = content.split(START, 1)
            _, tail = rest.split(END, 1)
            README.write_text(f"{head}{START}\n{text}{END}{tail}")
            return README
    target = RESULTS / "README-table.md"
    target.write_text(text)
    return target


def print_table(rows: list[list[str]]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        for row in rows:
            print(" | ".join(row))
        return
    table = Table(*HEADER, title="loraflow benchmarks")
    for row in rows:
        table.add_row(*row)
    Console().print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (seconds, not minutes)")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these benchmarks")
    parser.add_argument("--update-readme", action="store_true", help="rewrite the README table")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        run_one(args.child, args.smoke)
        return 0
    names = list(available())
    if args.only:
        unknown = set(args.only) - set(names)
        if unknown:
            parser.error(f"unknown benchmark(s): {', '.join(sorted(unknown))}; known: {', '.join(names)}")
        names = [n for n in names if n in args.only]
    started = time.monotonic()
    records: list[tuple[str, dict[str, object] | None, str]] = []
    for name in names:
        record, elapsed, error = spawn(name, args.smoke)
        status = "ok" if record else error
        print(f"{name}: {elapsed:.1f} s {status}", flush=True)
        records.append((name, record, error))
    total = time.monotonic() - started
    rows = table_rows(records)
    print_table(rows)
    print(f"total {total:.0f} s")
    if args.update_readme:
        print(f"table written to {update_readme(markdown(rows, args.smoke, total))}")
    return 0 if all(r is not None for _, r, _ in records) else 1


if __name__ == "__main__":
    sys.exit(main())
