"""engines.adapters_listed: a `GET /v1/models` answer read into name -> path.

The answers are the engine stand-ins' own (devstack/engines: vLLM's and SGLang's card shapes,
with fields we do not read); a malformed answer raises ValueError, which Engines.listing turns
into "unreachable" (nothing is known about what that engine serves).
"""

from __future__ import annotations

import json

import pytest

from devstack.standins.engines.sglang import SglangReplica
from devstack.standins.engines.vllm import VllmReplica
from functions.adapters.engines import adapters_listed

ADAPTERS = {
    "finance": "/mnt/seaweedfs/loraadapters/a/m/finance",
    "legal": "/mnt/seaweedfs/loraadapters/a/m/legal",
}


@pytest.mark.parametrize("replica", [VllmReplica, SglangReplica], ids=["vllm", "sglang"])
def test_adapter_cards_are_listed_and_the_base_model_is_not(
    replica: type[VllmReplica | SglangReplica],
) -> None:
    engine = replica(served_model="llama3-8b", static_adapters=ADAPTERS)
    body = json.dumps(engine.models_payload()).encode()
    assert adapters_listed(body) == ADAPTERS


def test_an_engine_without_adapters_lists_none() -> None:
    body = json.dumps(VllmReplica(served_model="llama3-8b").models_payload()).encode()
    assert adapters_listed(body) == {}
    assert adapters_listed(b'{"object": "list", "data": null}') == {}


@pytest.mark.parametrize(
    "body",
    [
        b"<html>502 Bad Gateway</html>",
        b'{"data": [{"root": "/x", "parent": "m"}]}',  # a card without its id
        b'{"data": [{"id": 7, "parent": "m"}]}',  # an id that is not a string
        b'{"data": "finance"}',
        b"[]",
    ],
)
def test_a_malformed_answer_is_refused(body: bytes) -> None:
    with pytest.raises(ValueError):
        adapters_listed(body)
