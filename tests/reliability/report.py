"""Write the README's reliability table from tests/reliability/results.json.

`make reliability` runs the suite with LORAFLOW_RECORD_RESULTS=1, then this script, so the
figures in the README are always those of a recorded run. Only the table between the
`<!-- reliability:table:start -->` and `<!-- reliability:table:end -->` markers changes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).with_name("results.json")
START, END = "<!-- reliability:table:start -->", "<!-- reliability:table:end -->"
COLUMNS = (
    ("operations", "user ops"),
    ("events", "events"),
    ("deliveries", "deliveries"),
    ("duplicates", "duplicates"),
    ("drops", "drops"),
    ("faults_injected", "faults injected"),
    ("retries", "retries (5xx)"),
    ("half_true_writes", "half-true writes"),
    ("violations", "violations"),
)


def _cell(value: Any) -> str:
    return "-" if value is None else f"{value:,}" if isinstance(value, int) else str(value)


def table(results: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| scenario | " + " | ".join(title for _, title in COLUMNS) + " |",
        "|---" * (len(COLUMNS) + 1) + "|",
    ]
    for name, figures in sorted(results.items()):
        if name == "resync_scale":
            continue
        lines.append(f"| {name} | " + " | ".join(_cell(figures.get(key)) for key, _ in COLUMNS) + " |")
    soak = results.get("soak")
    if soak:
        lines.append(
            f"\nChaos soak: seed {soak['seed']}, {soak['seconds']} s, {soak['checkpoints']} invariant "
            f"checkpoints, {soak['violations']} violations."
        )
    scale = results.get("resync_scale")
    if scale:
        lines.append(
            f"Resync at scale: {scale['vllm_adapters']:,} vllm + {scale['sglang_adapters']:,} sglang "
            "adapters, "
            f"{scale['deployments']} deployments, {scale['services']} InferenceServices: {scale['nudges']} "
            f"nudges for {scale['drifted']} drifted, {scale['adapter_list_pages']} adapter list pages, "
            f"{scale['api_requests']} API requests, {scale['resync_s']} s."
        )
    return "\n".join(lines)


def main() -> int:
    readme = ROOT / "README.md"
    text = readme.read_text()
    if START not in text or END not in text:
        print(f"README.md lacks the {START} / {END} markers", file=sys.stderr)
        return 1
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    body = table(json.loads(RESULTS.read_text()))
    readme.write_text(f"{head}{START}\n{body}\n{END}{tail}")
    print(body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
