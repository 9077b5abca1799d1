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


def _reasons() -> set[str]:
    """Every condition/engine reason the functions can write (constants and engine results)."""
    from functions.logic import adapter_config, loading, phase

    names = {value for key, value in vars(phase).items() if key.isupper() and isinstance(value, str)}
    names |= {
        value for key, value in vars(loading).items() if key.startswith("R_") and isinstance(value, str)
    }
    names |= set(adapter_config.VERDICT_REASONS)
    engines = (Path(__file__).resolve().parents[2] / "functions" / "adapters" / "engines.py").read_text()
    names |= set(re.findall(r'CallResult\(\s*False,\s*"([A-Za-z]+)"', engines))
    names |= set(re.findall(r'^\s+"([A-Z][A-Za-z]+)",$', engines, re.MULTILINE))
    return names - {phase.READY, phase.AVAILABLE, phase.ERROR, loading.LOADED}


def test_operations_doc_explains_every_reason() -> None:
    doc = (README.parent / "docs" / "operations.md").read_text(encoding="utf-8")
    missing = sorted(r for r in _reasons() if f"`{r}`" not in doc)
    assert not missing, f"docs/operations.md does not explain: {missing}"
