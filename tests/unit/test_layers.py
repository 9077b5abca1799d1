"""The floors of `functions/` (README "Architecture at a glance"): a module imports its own floor
and the floors below it, never one above.

    steps      functions/*.py, the handlers (admit, stat, verify, load, ..., filer_source)
    edge       functions/edge/
    adapters   functions/adapters/
    ports      functions/ports.py, and logic (functions/logic/) beside it
    resources  functions/resources/, and the shared leaves: errors, settings, observability,
               metrics, otel, tracing, proto (and the package's own __init__)
    ground     functions/transport/ (the network) and events/ (the public event contract):
               each imports nothing of ours but itself

Imports under TYPE_CHECKING and inside functions count like top-level ones (mypy and the
runtime follow them both). Read from the source with `ast`, so nothing is imported.
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("functions", "events")

FLOORS = ("ground", "resources", "ports", "adapters", "edge", "steps")
"""Bottom to top; a floor's index is its height."""

ROOMS: dict[str, tuple[str, str]] = {
    # a module or package, and everything under it -> (room, floor); the rest of functions/ are steps
    "functions.transport": ("transport", "ground"),
    "events": ("events", "ground"),
    "functions.errors": ("shared", "resources"),
    "functions.settings": ("shared", "resources"),
    "functions.observability": ("shared", "resources"),
    "functions.metrics": ("shared", "resources"),
    "functions.otel": ("shared", "resources"),
    "functions.tracing": ("shared", "resources"),
    "functions.proto": ("shared", "resources"),
    "functions.resources": ("resources", "resources"),
    "functions.ports": ("ports", "ports"),
    "functions.logic": ("logic", "ports"),
    "functions.adapters": ("adapters", "adapters"),
    "functions.edge": ("edge", "edge"),
}
STEPS = ("steps", "steps")


class Import(NamedTuple):
    importer: str
    path: str
    line: int
    imported: str


class Arrow(NamedTuple):
    """An import that breaks the floors."""

    path: str
    line: int
    importer: str
    imported: str
    importer_room: tuple[str, str]
    imported_room: tuple[str, str]

    def __str__(self) -> str:
        return (
            f"{self.path}:{self.line} {self.importer} -> {self.imported}: "
            f"{where(self.importer_room)} -> {where(self.imported_room)}"
        )


def where(room: tuple[str, str]) -> str:
    return f"floor {room[1]}" if room[0] == room[1] else f"{room[0]} (floor {room[1]})"


def room_of(module: str) -> tuple[str, str]:
    if module == "functions":
        return ROOMS["functions.errors"]  # the package's own __init__ only, not the steps in it
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        found = ROOMS.get(".".join(parts[:end]))
        if found is not None:
            return found
    return STEPS


def modules(root: Path) -> dict[str, Path]:
    """Every module of our packages under `root`, by dotted name (a package by its own name)."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imports(root: Path) -> Iterator[Import]:
    """Each import of one of our modules, resolved: relative ones against the importer's package,
    `from a import b` as a.b when b is a module."""
    known = modules(root)
    for module, path in known.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        relative = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    up = parts[: len(parts) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                names = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                    for alias in node.names
                ]
            else:
                continue
            for name in names:
                if name.split(".")[0] in PACKAGES:
                    yield Import(module, relative, node.lineno, name)


def upward(root: Path) -> list[Arrow]:
    """Every import under `root` that goes to a higher floor, or leaves its room on the ground
    floor."""
    arrows = []
    for found in imports(root):
        mine, theirs = room_of(found.importer), room_of(found.imported)
        height, other = FLOORS.index(mine[1]), FLOORS.index(theirs[1])
        if other > height or (mine[1] == "ground" and theirs != mine):
            arrows.append(Arrow(found.path, found.line, found.importer, found.imported, mine, theirs))
    return sorted(set(arrows))


def test_no_module_imports_a_higher_floor() -> None:
    assert len(modules(ROOT)) > 50, "the walk found our modules"
    arrows = upward(ROOT)
    if arrows:
        pytest.fail("imports up the floors:\n" + "\n".join(map(str, arrows)), pytrace=False)


LEGAL = {
    "functions/__init__.py": "",
    "functions/errors.py": "",
    "functions/load.py": "from functions.edge.shell import run\nfrom functions.adapters import kube\n",
    "functions/edge/__init__.py": "",
    "functions/edge/shell.py": "from functions.adapters.kube import Kube\n",
    "functions/adapters/__init__.py": "",
    "functions/adapters/kube.py": "from functions.logic import pure\nfrom events.domain import Ref\n",
    "functions/logic/__init__.py": "",
    "functions/logic/pure.py": "from . import sibling\nfrom ..errors import Reject\n",
    "functions/logic/sibling.py": "from functions.transport import wire\n",
    "functions/transport/__init__.py": "from functions.transport import wire\n",
    "functions/transport/wire.py": "import ssl\n",
    "events/__init__.py": "",
    "events/domain.py": "import pydantic\nfrom events import base\n",
    "events/base.py": "",
}
"""A tree whose every import keeps to the floors."""


def plant(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def test_the_checker_passes_a_tree_that_keeps_to_the_floors(tmp_path: Path) -> None:
    plant(tmp_path, LEGAL)
    assert sorted((i.importer, i.imported) for i in imports(tmp_path)) == [
        ("events.domain", "events.base"),
        ("functions.adapters.kube", "events.domain"),
        ("functions.adapters.kube", "functions.logic.pure"),
        ("functions.edge.shell", "functions.adapters.kube"),
        ("functions.load", "functions.adapters.kube"),
        ("functions.load", "functions.edge.shell"),
        ("functions.logic.pure", "functions.errors"),
        ("functions.logic.pure", "functions.logic.sibling"),
        ("functions.logic.sibling", "functions.transport.wire"),
        ("functions.transport", "functions.transport.wire"),
    ]
    assert upward(tmp_path) == []


@pytest.mark.parametrize(
    ("path", "text", "line", "imported"),
    [
        pytest.param(
            "functions/logic/pure.py",
            """
            from typing import TYPE_CHECKING

            if TYPE_CHECKING:
                from functions.adapters.kube import Kube
            """,
            5,
            "functions.adapters.kube",
            id="type-checking",
        ),
        pytest.param(
            "functions/logic/pure.py",
            "def late() -> None:\n    from ..edge import shell\n",
            2,
            "functions.edge.shell",
            id="relative-inside-a-function",
        ),
        pytest.param(
            "functions/adapters/kube.py", "import functions.load\n", 1, "functions.load", id="a-step"
        ),
        pytest.param(
            "functions/transport/wire.py",
            "from functions import errors\n",
            1,
            "functions.errors",
            id="transport-imports-ours",
        ),
        pytest.param(
            "events/base.py",
            "from functions.transport import wire\n",
            1,
            "functions.transport.wire",
            id="events",
        ),
    ],
)
def test_the_checker_reports_a_planted_upward_import(
    tmp_path: Path, path: str, text: str, line: int, imported: str
) -> None:
    plant(tmp_path, {**LEGAL, path: text})
    arrows = upward(tmp_path)
    assert [(a.path, a.line, a.imported) for a in arrows] == [(path, line, imported)]
    assert str(arrows[0]).startswith(f"{path}:{line} ")


def test_an_arrow_names_both_floors(tmp_path: Path) -> None:
    plant(tmp_path, {**LEGAL, "functions/logic/pure.py": "from functions.adapters import kube\n"})
    assert [str(a) for a in upward(tmp_path)] == [
        "functions/logic/pure.py:1 functions.logic.pure -> functions.adapters.kube: "
        "logic (floor ports) -> floor adapters"
    ]
