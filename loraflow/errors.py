"""The CLI's expected failures, importable without the `cli` extra (`loraflow --help` and the
missing-extra message must work where rich and kubernetes are not installed)."""

from __future__ import annotations


class CliError(Exception):
    """An expected failure: printed as one clear line, exit code 1, no traceback."""


CLI_EXTRA_MODULES = frozenset({"kubernetes", "rich"})
"""Top-level modules of the `cli` extra's distributions (pyproject.toml)."""


def missing_extra(err: ModuleNotFoundError) -> CliError | None:
    """The one line to print when `err` is a module of the `cli` extra, else None (a bug)."""
    top = (err.name or "").partition(".")[0]
    if top not in CLI_EXTRA_MODULES:
        return None
    return CliError(
        f"this command needs the `cli` extra ({top} is not installed): pip install 'loraflow[cli]'"
    )
