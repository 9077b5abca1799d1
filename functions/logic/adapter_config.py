"""Pre-flight check of a PEFT `adapter_config.json` before any engine call (pure).

Engines reject adapters whose rank exceeds their `--max-lora-rank` (vLLM 400/500, SGLang 400
"incompatible with the current LoRA memory pool"); we refuse them first with a clear reason.
"""

from __future__ import annotations

import json
from typing import NamedTuple

from functions.logic import reasons

CONFIG_FILE = "adapter_config.json"
CONFIG_MAX_BYTES = 1 << 20

VALID = "AdapterConfigValid"
MISSING = reasons.CONFIG_MISSING
INVALID = reasons.CONFIG_INVALID
TOO_LARGE = reasons.CONFIG_TOO_LARGE
UNSUPPORTED = reasons.UNSUPPORTED_PEFT_TYPE
RANK_TOO_HIGH = reasons.RANK_TOO_HIGH
VERDICT_REASONS = reasons.CONFIG_VERDICTS


class ConfigVerdict(NamedTuple):
    ok: bool
    reason: str
    message: str
    rank: int | None = None


def check(raw: bytes | None, max_rank: int) -> ConfigVerdict:
    """`peft_type` must be LORA and `r` a positive integer <= `max_rank`."""
    if raw is None:
        return ConfigVerdict(False, MISSING, f"{CONFIG_FILE} not found in storage")
    try:
        config = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as err:
        # RecursionError: nested deeper than the decoder goes; a verdict on this adapter only
        return ConfigVerdict(False, INVALID, f"{CONFIG_FILE} is not JSON: {str(err)[:200]}")
    if not isinstance(config, dict):
        return ConfigVerdict(False, INVALID, f"{CONFIG_FILE} is not a JSON object")
    peft_type = config.get("peft_type")
    if not isinstance(peft_type, str) or peft_type.upper() != "LORA":
        return ConfigVerdict(False, UNSUPPORTED, f"peft_type is {peft_type!r}, only LORA can be served")
    rank = config.get("r")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        return ConfigVerdict(False, INVALID, f"rank r is {rank!r}, expected a positive integer")
    if rank > max_rank:
        return ConfigVerdict(False, RANK_TOO_HIGH, f"rank r={rank} exceeds the maximum {max_rank}", rank)
    return ConfigVerdict(True, VALID, f"LORA rank {rank} <= {max_rank}", rank)
