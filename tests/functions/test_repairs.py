"""Lost events are repaired by resync's nudges: the repair paths, one per kind of loss."""

from __future__ import annotations

from cloudevents.http import from_http

from events.domain import ADAPTER_DRIFTED, ADAPTER_READY, ADAPTER_STAT_COMPLETED, FILE_CHANGED, STEP_EXTENSION
from functions.resources.kinds import VLLM_ADAPTER
from tests.functions.conftest import World
from tests.functions.test_seed1_path import CONFIG, WEIGHTS, Flow, setup_adapter, status_of


def test_a_lost_verify_is_repaired_by_the_stat_nudge(world: World) -> None:
    """stat's observation was written but the verify that should follow was lost: the status is
    stuck short of a verdict. A resync nudge to stat must lead on to verify even though the
    observation itself did not change."""
    ns, directory = setup_adapter(world, Flow(world))
    world.filer.put_file(directory + "adapter_config.json", CONFIG)
    world.filer.put_file(directory + "adapter_model.safetensors", WEIGHTS)
    changed = world.event(
        FILE_CHANGED, {"path": directory + "adapter_model.safetensors", "eventType": "create"}
    )
    assert world.post("stat", changed).status_code == 200  # its statcompleted reply is "lost"
    assert status_of(world, ns)["conditions"][0]["reason"] == "AwaitingFiles"  # stale verdict

    nudge = world.event(
        ADAPTER_DRIFTED,
        world.adapter_data(VLLM_ADAPTER, ns, "a", step="stat", reason="admitted, not Ready"),
        **{STEP_EXTENSION: "stat"},
    )
    response = world.post("stat", nudge)
    assert response.status_code == 200, response.text
    reply = from_http(dict(response.headers), response.content)
    assert reply["type"] == ADAPTER_STAT_COMPLETED

    verdict = world.post("verify", reply)
    assert verdict.status_code == 200
    assert from_http(dict(verdict.headers), verdict.content)["type"] == ADAPTER_READY
    assert status_of(world, ns)["phase"] == "Ready"
