"""Every benchmark runs with tiny sizes (`run(smoke=True)`) and returns finite figures.

The real sizes run with `make bench`, never under `make test`.
"""

from __future__ import annotations

import importlib
import math

import pytest

from bench.__main__ import available
from bench.common import Result


@pytest.mark.parametrize("name", list(available()))
def test_smoke(name: str) -> None:
    result = importlib.import_module(f"bench.{name}").run(True)
    assert isinstance(result, Result)
    assert result.name == name
    assert math.isfinite(result.value)
    for figure in (result.reference, result.ratio):
        assert figure is None or math.isfinite(figure)
    assert isinstance(result.met, bool)
    assert result.target
