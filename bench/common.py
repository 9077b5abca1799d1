"""What every benchmark shares: timing, medians, results as JSON, the machine they ran on."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"


@dataclass
class Result:
    """One benchmark's figures: `value` against `target`, and `ratio` against a reference."""

    name: str
    title: str
    value: float
    unit: str
    target: str
    met: bool
    reference: float | None = None
    ratio: float | None = None
    details: dict[str, Any] = field(default_factory=dict)
    note: str = ""

    def write(self, smoke: bool) -> Path:
        RESULTS.mkdir(exist_ok=True)
        path = RESULTS / f"{self.name}{'.smoke' if smoke else ''}.json"
        record = {
            **asdict(self),
            "machine": machine(),
            "smoke": smoke,
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        return path


def machine() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "system": f"{platform.system()} {platform.machine()}",
        "cpus": os.cpu_count(),
        "processor": _cpu_model(),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def timed(action: Callable[[], object]) -> float:
    """Seconds one call of `action` took (monotonic clock)."""
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def median_of(samples: list[float]) -> float:
    return statistics.median(samples) if samples else float("nan")


def percentile(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]
