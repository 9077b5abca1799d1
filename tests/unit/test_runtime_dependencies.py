"""The functions' image installs only pyproject's [project] dependencies (Dockerfile): every
third-party module the functions import must come from them or what they require. The CLI,
the stand-ins and the tools are extras (`cli`, `devstack`, `dev`)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]

IMPORTED = textwrap.dedent(
    """
    import importlib, importlib.abc, json, pkgutil, sys

    refused = set()

    class ImageOnly(importlib.abc.MetaPathFinder):
        # as in the image: a module of a distribution it does not install cannot be imported
        def find_spec(self, name, path=None, target=None):
            top = name.split(".")[0]
            if top not in FORBIDDEN or top in sys.modules:
                return None
            refused.add(top)
            raise ImportError(f"{top} is not installed in the functions' image")

    FORBIDDEN = set(json.loads(sys.argv[1]))
    sys.meta_path.insert(0, ImageOnly())
    import functions, events, main
    for package in (functions, events):
        for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            importlib.import_module(module.name)
    for name in main.FUNCTIONS:
        getattr(main, name)
    print(json.dumps(sorted(refused)))
    """
)


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def runtime_closure() -> set[str]:
    """[project] dependencies and, transitively, what they require (no extras)."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    pending = [Requirement(r).name for r in pyproject["project"]["dependencies"]]
    seen: set[str] = set()
    while pending:
        name = canonical(pending.pop())
        if name in seen:
            continue
        seen.add(name)
        for line in metadata.requires(name) or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                pending.append(requirement.name)
    return seen


def test_functions_import_only_the_images_dependencies() -> None:
    allowed = runtime_closure()
    forbidden = sorted(
        module
        for module, dists in metadata.packages_distributions().items()
        if not any(canonical(d) in allowed for d in dists) and module not in ("functions", "events")
    )
    assert "kubernetes" in forbidden and "httpx" not in forbidden
    done = subprocess.run(
        [sys.executable, "-c", IMPORTED, json.dumps(forbidden)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    # refused but survived: optional imports the image does not have either (httpx's CLI,
    # granian's env files)
    assert set(json.loads(done.stdout)) <= {"click", "dotenv", "pygments", "rich"}
