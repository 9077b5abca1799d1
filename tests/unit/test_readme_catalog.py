"""The README's event catalog is generated: a stale block fails here."""

from __future__ import annotations

import re
from pathlib import Path

from events.catalog import markdown_table

README = Path(__file__).resolve().parents[2] / "README.md"
BLOCK = re.compile(r"<!-- catalog:start -->\n(.*?)\n<!-- catalog:end -->", re.DOTALL)


def test_readme_catalog_is_generated_from_the_catalog() -> None:
    found = BLOCK.findall(README.read_text(encoding="utf-8"))
    assert len(found) == 1, "README.md needs exactly one <!-- catalog:start/end --> block"
    assert found[0].strip() == markdown_table().strip(), (
        "README.md event catalog is stale: replace the block with events.catalog.markdown_table()"
    )


def test_readme_keeps_the_sections_others_fill() -> None:
    text = README.read_text(encoding="utf-8")
    for marker in ("bench", "reliability"):
        assert text.count(f"<!-- {marker}:start -->") == 1 and text.count(f"<!-- {marker}:end -->") == 1
    assert "make run" in text and "make test" in text
