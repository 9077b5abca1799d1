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
    """Every condition and engine reason the functions can write (functions/logic/reasons.py)."""
    from functions.logic import reasons

    names = {value for key, value in vars(reasons).items() if key.isupper() and isinstance(value, str)}
    conditions = {reasons.READY, reasons.AVAILABLE, reasons.ERROR, reasons.LOADED}
    events = {value for key, value in vars(reasons).items() if key.startswith("EVENT_")}
    return names - conditions - events - {"md5set:"}


def test_operations_doc_explains_every_reason() -> None:
    doc = (README.parent / "docs" / "operations.md").read_text(encoding="utf-8")
    missing = sorted(r for r in _reasons() if f"`{r}`" not in doc)
    assert not missing, f"docs/operations.md does not explain: {missing}"


def test_readme_configuration_names_every_setting() -> None:
    """A setting nobody can find is a setting nobody sets: each field's variable is in the table."""
    from functions.settings import ENV_PREFIX, FALLBACKS, Settings

    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Configuration") :]
    table = section[: section.index("\n## ")]
    documented = set(re.findall(r"`([A-Z][A-Z0-9_]+)`", table))
    variables = {FALLBACKS.get(name, ENV_PREFIX + name.upper()) for name in Settings.model_fields}
    assert variables - documented == set(), "README.md Configuration lacks these variables"
