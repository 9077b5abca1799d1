from __future__ import annotations

import json

import pytest

from functions.logic.adapter_config import check


def cfg(**fields: object) -> bytes:
    return json.dumps(fields).encode()


@pytest.mark.parametrize(
    ("raw", "max_rank", "ok", "reason"),
    [
        pytest.param(cfg(peft_type="LORA", r=16), 64, True, "AdapterConfigValid", id="valid"),
        pytest.param(cfg(peft_type="LORA", r=64), 64, True, "AdapterConfigValid", id="rank-equal-max"),
        pytest.param(cfg(peft_type="lora", r=8), 64, True, "AdapterConfigValid", id="lowercase-peft"),
        pytest.param(cfg(peft_type="LORA", r=128), 64, False, "RankTooHigh", id="rank-too-high"),
        pytest.param(cfg(peft_type="LORA", r=128), 256, True, "AdapterConfigValid", id="raised-max"),
        pytest.param(cfg(peft_type="IA3", r=8), 64, False, "UnsupportedPeftType", id="ia3"),
        pytest.param(cfg(r=8), 64, False, "UnsupportedPeftType", id="no-peft-type"),
        pytest.param(cfg(peft_type="LORA"), 64, False, "AdapterConfigInvalid", id="no-rank"),
        pytest.param(cfg(peft_type="LORA", r="8"), 64, False, "AdapterConfigInvalid", id="rank-string"),
        pytest.param(cfg(peft_type="LORA", r=True), 64, False, "AdapterConfigInvalid", id="rank-bool"),
        pytest.param(cfg(peft_type="LORA", r=0), 64, False, "AdapterConfigInvalid", id="rank-zero"),
        pytest.param(None, 64, False, "AdapterConfigMissing", id="missing"),
        pytest.param(b"{not json", 64, False, "AdapterConfigInvalid", id="not-json"),
        pytest.param(b"[1, 2]", 64, False, "AdapterConfigInvalid", id="not-object"),
        pytest.param(b"\xff\xfe", 64, False, "AdapterConfigInvalid", id="not-utf8"),
    ],
)
def test_check(raw: bytes | None, max_rank: int, ok: bool, reason: str) -> None:
    verdict = check(raw, max_rank)
    assert (verdict.ok, verdict.reason) == (ok, reason)
    assert verdict.message
