"""engines.adapters_listed: a `GET /v1/models` answer read into name -> path; and what a load's
answer says the engine holds after it.

The answers are the engine stand-ins' own (devstack/engines: vLLM's and SGLang's card shapes,
with fields we do not read); a malformed answer raises ValueError, which Engines.listing turns
into "unreachable" (nothing is known about what that engine serves).
"""

from __future__ import annotations

import json

import pytest

from devstack.standins.engines.sglang import SglangReplica
from devstack.standins.engines.vllm import VllmReplica
from functions.adapters.engines import Answer, adapters_listed, classify_load
from functions.logic import reasons

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


@pytest.mark.parametrize(
    ("content_type", "body", "holds"),
    [
        pytest.param(
            "application/json",
            {"success": True, "error_message": "", "loaded_adapters": {"s2": "/p/s2", "s3": "/p/s3"}},
            {"s2": "/p/s2", "s3": "/p/s3"},
            id="sglang",
        ),
        pytest.param("text/plain", "Success: LoRA adapter 's2' added successfully.", None, id="vllm"),
        pytest.param("application/json", {"success": True, "loaded_adapters": ["s2"]}, None, id="a-list"),
        pytest.param(
            "application/json", {"success": True, "loaded_adapters": {"s2": 7}}, None, id="a-number"
        ),
        pytest.param("application/json", {"success": True, "loaded_adapters": None}, None, id="null"),
    ],
)
def test_a_load_answer_says_what_the_engine_holds_only_in_sglangs_shape(
    content_type: str, body: object, holds: dict[str, str] | None
) -> None:
    raw = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    result = classify_load(Answer(200, content_type, raw))
    assert result.ok and result.reason == reasons.POD_LOADED
    assert result.holds == holds


def test_a_failed_load_says_nothing_of_what_the_engine_holds() -> None:
    body = {"success": False, "error_message": "Failed to load", "loaded_adapters": {"s1": "/p/s1"}}
    result = classify_load(Answer(400, "application/json", json.dumps(body).encode()))
    assert not result.ok and result.holds is None


def test_a_load_refused_because_the_engine_is_full_is_retried() -> None:
    """SGLang before its LRU release (tokenizer_manager.py `load_lora_adapter` under
    `lora_update_lock`); any other 400 is the adapter's own problem and is not retried."""
    full = "Cannot load LoRA adapter s2 at path /p/s2. Maximum number of loaded LoRA adapters is 2. "
    full += "Please unload some LoRA adapters before loading new ones."
    body = {"success": False, "error_message": full, "loaded_adapters": None}
    result = classify_load(Answer(400, "application/json", json.dumps(body).encode()))
    assert (result.ok, result.reason, result.retryable) == (False, reasons.ENGINE_FULL, True)
    body["error_message"] = "LoRA adapter s2 with rank 128 is incompatible with the current LoRA memory pool"
    result = classify_load(Answer(400, "application/json", json.dumps(body).encode()))
    assert (result.ok, result.reason, result.retryable) == (False, reasons.LOAD_REJECTED, False)
