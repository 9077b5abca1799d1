"""The functions' image, read from the Dockerfile (no Docker here): a fully pinned base for the
Python the tests run on, dependencies in a layer cached apart from the code, nothing installed
twice, a non-root user, FUNCTION_TARGET left to each Service."""

from __future__ import annotations

import fnmatch
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

from devstack.functions_host import IMAGE_ENVIRONMENT, process_environment

ROOT = Path(__file__).resolve().parents[2]
CODE = ("main.py", "events/", "functions/")


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    joined = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    found = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            found.append((word.upper(), rest.strip()))
    return found


def of(word: str) -> list[str]:
    return [rest for w, rest in instructions() if w == word]


def test_base_image_is_a_full_version_of_the_tested_python() -> None:
    (base,) = of("FROM")
    match = re.fullmatch(r"python:(\d+)\.(\d+)\.(\d+)-slim-[a-z]+(@sha256:[0-9a-f]{64})?", base)
    assert match, f"{base}: pin a full version (python:X.Y.Z-slim-<debian>)"
    assert (int(match[1]), int(match[2])) == sys.version_info[:2], "the image runs the Python the tests run"
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert requires == f">={match[1]}.{match[2]}"


def test_dependencies_are_a_layer_before_any_code() -> None:
    steps = instructions()
    install = next(i for i, (w, rest) in enumerate(steps) if w == "RUN" and "pip install" in rest)
    copies_before = [rest for w, rest in steps[:install] if w == "COPY"]
    assert copies_before == ["pyproject.toml constraints.txt /tmp/deps/"]
    code_copies = [i for i, (w, rest) in enumerate(steps) if w == "COPY" and rest.split()[0] in CODE]
    assert sorted(rest.split()[0] for w, rest in steps if w == "COPY" and rest.split()[0] in CODE) == sorted(
        CODE
    )
    assert min(code_copies) > install


def test_nothing_is_installed_twice() -> None:
    pip_runs = [rest for rest in of("RUN") if "pip install" in rest]
    assert len(pip_runs) == 1
    (run,) = pip_runs
    assert "-c /tmp/deps/constraints.txt -r /tmp/deps/requirements.txt" in run
    assert not re.search(r"pip install[^&]*\s(\.|-e)(\s|$)", run), "the project itself is not pip-installed"
    assert any(rest == "PYTHONPATH=/app" or "PYTHONPATH=/app" in rest.split() for rest in of("ENV"))


def test_the_requirements_step_writes_exactly_the_project_dependencies(tmp_path: Path) -> None:
    """Runs the Dockerfile's own extraction command on this pyproject.toml."""
    (run,) = [rest for rest in of("RUN") if "tomllib" in rest]
    command = shlex.split(run.split(">")[0])
    assert command[:2] == ["python", "-c"]
    deps = tmp_path / "deps"
    deps.mkdir()
    (deps / "pyproject.toml").write_bytes((ROOT / "pyproject.toml").read_bytes())
    script = command[2].replace("/tmp/deps/", f"{deps}/")
    printed = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout
    expected = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert printed.splitlines() == expected
    assert all(not re.search(r"==", line) for line in expected), (
        "[project] takes ranges; pins: constraints.txt"
    )


def test_runs_as_a_non_root_user_created_with_that_uid() -> None:
    users = of("USER")
    assert users and users[-1] == "10001:10001"
    assert any("--uid 10001 --gid 10001" in rest and "--gid 10001 loraflow" in rest for rest in of("RUN"))


def test_function_target_is_left_to_each_service() -> None:
    (cmd,) = of("CMD")
    assert cmd == '["python", "-m", "functions.edge.server"]'
    assert not any("FUNCTION_TARGET" in rest for rest in of("ENV"))


def test_what_is_copied_exists_and_is_not_ignored() -> None:
    ignored = [p.strip() for p in (ROOT / ".dockerignore").read_text().splitlines() if p.strip()]
    for rest in of("COPY"):
        for source in rest.split()[:-1]:
            assert (ROOT / source).exists(), source
            assert not any(fnmatch.fnmatch(source.rstrip("/"), pattern) for pattern in ignored), source
    for heavy in ("devstack", "tests", "bench", ".venv", ".venv-runtime"):
        assert heavy in ignored


def test_the_embedded_stack_starts_the_functions_as_the_image_does() -> None:
    """What the image sets for the interpreter (MALLOC_ARENA_MAX) the stack's launcher sets too."""
    image = dict(pair.split("=", 1) for env in of("ENV") for pair in shlex.split(env))
    assert process_environment({})["MALLOC_ARENA_MAX"] == image["MALLOC_ARENA_MAX"] == "2"
    assert set(IMAGE_ENVIRONMENT) <= set(image)
    assert (
        process_environment({"MALLOC_ARENA_MAX": "8"})["MALLOC_ARENA_MAX"] == "8"
    )  # an operator's choice wins
