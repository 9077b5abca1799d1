"""A payload that does not fit its model is answered 400 naming each field, bounded.

Real functions-framework apps over HTTP: the body a hostile or buggy sender reads back names
the paths and reasons of the first few problems (functions.errors.SHOWN_PROBLEMS) and how many
more there were, and never echoes the values it sent.
"""

from __future__ import annotations

from events.domain import ADAPTER_READY, ADAPTER_STAT_COMPLETED
from functions.errors import SHOWN_PROBLEMS
from functions.resources.kinds import VLLM_ADAPTER
from tests.support.testbed import Testbed as World


def test_each_bad_field_is_named_with_its_path(world: World) -> None:
    data = world.adapter_data(VLLM_ADAPTER, "team-a", "finance", files="3", size=7)
    data["adapter"]["namespace"] = "Team_A"
    response = world.post("verify", world.event(ADAPTER_STAT_COMPLETED, data))
    assert response.status_code == 400
    text = response.text
    assert f"data of {ADAPTER_STAT_COMPLETED} is invalid" in text
    assert "adapter.namespace: String should match pattern" in text
    assert "files: Input should be a valid integer" in text  # "3" is not 3
    assert "size: Input should be a valid string" in text
    assert "Team_A" not in text


def test_a_flood_of_problems_is_cut_to_the_first_few(world: World) -> None:
    data = world.adapter_data(VLLM_ADAPTER, "team-a", "finance")
    data |= {f"junk{i}": "x" * 1000 for i in range(40)}
    response = world.post("load", world.event(ADAPTER_READY, data))
    assert response.status_code == 400
    assert response.text.count("Extra inputs are not permitted") == SHOWN_PROBLEMS
    assert f"(and {40 - SHOWN_PROBLEMS} more)" in response.text
    assert len(response.text) < 1000 and "xxx" not in response.text
