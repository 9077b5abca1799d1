"""functions.logic.verification.status_for: the storage work an adapter's status needs, in order,
then the status from the work done, by table. The verdicts themselves: test_verify_decide.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from functions.freeze import FREEZE_FAILED, Refusal
from functions.logic import reasons
from functions.logic.facts import file_set
from functions.logic.verification import Gathered, Needs, decide, hash_keys, status_for
from functions.resources.rackai import FrozenSet, LoRAAdapter, LoRAAdapterStatus

NOW = datetime(2026, 3, 1, tzinfo=UTC)
GRACE = timedelta(minutes=10)
DIR = "/loraadapters/ns/llama/a/"
W, C = DIR + "w.safetensors", DIR + "adapter_config.json"
M1, M2, M3 = "1" * 32, "2" * 32, "3" * 32
DECLARED = {W: M1, C: M2}
SET = file_set(DECLARED)
OLD = file_set({W: M3, C: M2})


def record(file_set_: str, retired: str | None = None) -> dict[str, Any]:
    found: dict[str, Any] = {
        "fileSet": file_set_,
        "path": f"/loraflow-frozen/ns/llama/a/{file_set_[7:]}/",
        "size": 9,
        "frozenAt": "2026-02-01T00:00:00Z",
    }
    return found | ({"retiredAt": retired} if retired else {})


FROZEN = FrozenSet.model_validate(record(SET))
RETIRED_LONG_AGO = record(OLD, "2026-02-01T00:00:00Z")
RETIRED_JUST_NOW = record(OLD, "2026-02-28T23:59:00Z")


def adapter(without_md5: tuple[str, ...] = (), versions: str = "v1", **status: Any) -> LoRAAdapter:
    files = {
        path: {"size": 4, **({"version": versions} if path in without_md5 else {"md5": md5})}
        for path, md5 in DECLARED.items()
    }
    return LoRAAdapter.model_validate(
        {
            "metadata": {"name": "a", "namespace": "ns", "generation": 1},
            "spec": {"model": "llama", "integrity": {"md5": DECLARED}},
            "status": {"storageRef": {"path": DIR}, "integrity": {"files": files}, **status},
        }
    )


@pytest.mark.parametrize(
    ("given", "gathered", "needs"),
    [
        pytest.param(adapter((W,)), Gathered(), Needs(hashes=((W, 4, "v1"),)), id="hash-first"),
        pytest.param(
            adapter((W,), versions="v2"),
            Gathered(hashes={(W, 4, "v1"): M1}),
            Needs(hashes=((W, 4, "v2"),)),
            id="rewritten-since-hashed",
        ),
        pytest.param(adapter((W,)), Gathered(hashes={(W, 4, "v1"): M1}), Needs(freeze=SET), id="then-freeze"),
        pytest.param(adapter(), Gathered(), Needs(freeze=SET), id="verified-not-frozen"),
        pytest.param(
            adapter(frozen=[record(SET), RETIRED_LONG_AGO]),
            Gathered(),
            Needs(collect=(FrozenSet.model_validate(RETIRED_LONG_AGO),)),
            id="then-collect",
        ),
        pytest.param(
            adapter(frozen=[record(SET), RETIRED_LONG_AGO]),
            Gathered(deleted=frozenset({"md5set:another"})),
            Needs(collect=(FrozenSet.model_validate(RETIRED_LONG_AGO),)),
            id="another-set-deleted",
        ),
    ],
)
def test_the_work_still_needed(given: LoRAAdapter, gathered: Gathered, needs: Needs) -> None:
    assert status_for(given, gathered, NOW, GRACE) == needs


@pytest.mark.parametrize(
    ("given", "gathered", "ready", "frozen"),
    [
        pytest.param(
            adapter(), Gathered(frozen={SET: FROZEN}), ("True", reasons.INTEGRITY_VERIFIED), [SET], id="made"
        ),
        pytest.param(
            adapter(frozen=[record(SET)]),
            Gathered(),
            ("True", reasons.INTEGRITY_VERIFIED),
            [SET],
            id="recorded",
        ),
        pytest.param(
            adapter(),
            Gathered(frozen={SET: Refusal(FREEZE_FAILED, "changed while being frozen")}),
            ("Unknown", FREEZE_FAILED),
            [],
            id="refused",
        ),
        pytest.param(
            adapter((W,)),
            Gathered(hashes={(W, 4, "v1"): M3}),
            ("False", reasons.INTEGRITY_CHECK_FAILED),
            [],
            id="hashed-mismatch-needs-no-freeze",
        ),
        pytest.param(
            adapter((W,)),
            Gathered(hashes={(W, 4, "v1"): None}),
            ("False", reasons.MD5_UNAVAILABLE),
            [],
            id="unhashable",
        ),
        pytest.param(
            adapter(frozen=[record(SET), RETIRED_LONG_AGO]),
            Gathered(deleted=frozenset({OLD})),
            ("True", reasons.INTEGRITY_VERIFIED),
            [SET],
            id="collected",
        ),
        pytest.param(
            adapter(frozen=[record(SET), RETIRED_JUST_NOW]),
            Gathered(),
            ("True", reasons.INTEGRITY_VERIFIED),
            [SET, OLD],
            id="within-grace",
        ),
        pytest.param(
            adapter(frozen=[record(SET), RETIRED_LONG_AGO], served=[{"pod": "p-0", "fileSet": OLD}]),
            Gathered(),
            ("True", reasons.INTEGRITY_VERIFIED),
            [SET, OLD],
            id="still-served",
        ),
    ],
)
def test_the_status_from_the_work_done(
    given: LoRAAdapter, gathered: Gathered, ready: tuple[str, str], frozen: list[str]
) -> None:
    status = status_for(given, gathered, NOW, GRACE)
    assert isinstance(status, LoRAAdapterStatus)
    found = next(c for c in status.conditions or [] if c.type == "Ready")
    assert (found.status, found.reason) == ready
    assert [r.file_set for r in status.frozen or []] == frozen


def test_the_status_is_decide_over_what_was_gathered() -> None:
    given = adapter((W,), frozen=[record(SET), RETIRED_LONG_AGO])
    gathered = Gathered(hashes={(W, 4, "v1"): M1}, deleted=frozenset({OLD}))
    expected = decide(given, {W: M1}, NOW, FrozenSet.model_validate(record(SET)), [FROZEN])
    assert status_for(given, gathered, NOW, GRACE) == expected


def test_hash_keys_name_what_each_hash_is_of() -> None:
    assert hash_keys(adapter((W, C), versions="chunks-7")) == {C: (C, 4, "chunks-7"), W: (W, 4, "chunks-7")}
    assert hash_keys(adapter()) == {}
