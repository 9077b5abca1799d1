"""How resync sizes its pages of ModelDeployments (functions/resync.py `deployment_page_size`):
by the adapter names they carry, so a page weighs about the same whatever each one names."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from functions.resync import NAMES_PER_SLOT, deployment_page_size

PAGE = 500


def _md(names: int) -> dict[str, Any]:
    return {"metadata": {"name": "md"}, "spec": {"loraAdapters": [f"a{i}" for i in range(names)]}}


def test_the_first_page_is_a_tenth_of_a_page_of_objects() -> None:
    assert deployment_page_size(PAGE)([]) == PAGE // NAMES_PER_SLOT
    assert deployment_page_size(5)([]) == 1


@given(st.lists(st.integers(0, 20_000), min_size=1, max_size=40))
def test_a_page_names_at_most_the_budget_unless_one_deployment_alone_does(named: list[int]) -> None:
    limit = deployment_page_size(PAGE)([_md(n) for n in named])
    assert 1 <= limit <= PAGE
    assert limit == 1 or limit * max(named) <= PAGE * NAMES_PER_SLOT


def test_deployments_naming_few_adapters_come_a_whole_page_at_a_time() -> None:
    size = deployment_page_size(PAGE)
    assert size([_md(10)] * 50) == PAGE
    assert size([_md(100)] * 50) == 50
    assert size([_md(10), _md(1000)]) == 5


def test_a_hostile_spec_counts_as_naming_nothing() -> None:
    hostile = [{"spec": {"loraAdapters": "x" * 100_000}}, {"spec": None}, {}]
    assert deployment_page_size(PAGE)(hostile) == PAGE
