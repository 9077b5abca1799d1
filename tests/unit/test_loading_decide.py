from __future__ import annotations

from datetime import UTC, datetime

import pytest

from functions.logic.loading import PodResult, TargetResult, status_v1, status_v2, summarize_v1, summarize_v2

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
OK = PodResult("p", True, "Present")
NEW = PodResult("p", True, "Loaded")
DUP = PodResult("p", True, "AlreadyLoaded")
FAIL = PodResult("p", False, "EngineError", "HTTP 500", retryable=True)
PENDING = PodResult("p", False, "NotLoaded", "not loaded (yet)")


def pods(*results: PodResult) -> tuple[PodResult, ...]:
    return tuple(PodResult(f"p{i}", r.ok, r.reason, r.message, r.retryable) for i, r in enumerate(results))


@pytest.mark.parametrize(
    ("results", "status", "reason"),
    [
        pytest.param([], "False", "NotReferenced", id="not-referenced"),
        pytest.param([TargetResult("d", pods=pods(OK, NEW, DUP))], "True", "Loaded", id="all-loaded"),
        pytest.param([TargetResult("d", pods=pods(OK, FAIL))], "False", "LoadFailed", id="one-failed"),
        pytest.param([TargetResult("d")], "False", "NoReadyReplicas", id="no-ready"),
        pytest.param([TargetResult("d", pods=pods(OK, PENDING))], "False", "Loading", id="pending-pod"),
        pytest.param(
            [TargetResult("d", pods=pods(PENDING, FAIL))], "False", "LoadFailed", id="failure-beats-pending"
        ),
        pytest.param([TargetResult("d", "ModelMismatch", "x")], "False", "ModelMismatch", id="mismatch"),
        pytest.param(
            [TargetResult("d", pods=pods(OK)), TargetResult("e", "ModelMismatch", "x")],
            "True",
            "Loaded",
            id="mismatch-beside-loaded",
        ),
        pytest.param([TargetResult("d", "RankTooHigh", "r=128")], "False", "RankTooHigh", id="rank"),
        pytest.param(
            [TargetResult("d", pods=pods(FAIL)), TargetResult("e", "RankTooHigh", "r")],
            "False",
            "LoadFailed",
            id="failure-beats-verdict",
        ),
        pytest.param(
            [TargetResult("d"), TargetResult("e", pods=pods(OK))], "True", "Loaded", id="one-target-empty"
        ),
    ],
)
def test_summarize_v1(results: list[TargetResult], status: str, reason: str) -> None:
    got = summarize_v1(results)
    assert got[:2] == (status, reason)
    assert got[2]


def test_failure_message_names_pods() -> None:
    message = summarize_v1([TargetResult("d", pods=pods(OK, FAIL))])[2]
    assert "p1" in message and "HTTP 500" in message and "p0" not in message


@pytest.mark.parametrize(
    ("result", "loaded", "reason", "error"),
    [
        pytest.param(TargetResult("s", pods=pods(OK, NEW)), "True", "Loaded", "NoError", id="loaded"),
        pytest.param(
            TargetResult("s", pods=pods(OK, FAIL)), "False", "LoadFailed", "EngineError", id="failed"
        ),
        pytest.param(TargetResult("s"), "False", "NoReadyReplicas", "NoError", id="no-ready"),
        pytest.param(TargetResult("s", pods=pods(OK, PENDING)), "False", "Loading", "NoError", id="pending"),
        pytest.param(
            TargetResult("s", "RuntimeMismatch", "vllm"),
            "False",
            "RuntimeMismatch",
            "RuntimeMismatch",
            id="rt",
        ),
    ],
)
def test_summarize_v2(result: TargetResult, loaded: str, reason: str, error: str) -> None:
    got = summarize_v2(result)
    assert (got[0], got[1], got[3]) == (loaded, reason, error)


@pytest.mark.parametrize(
    ("result", "path", "stamped"),
    [
        pytest.param(TargetResult("s", pods=pods(NEW)), "/a", True, id="load-call-succeeded"),
        pytest.param(TargetResult("s", pods=pods(OK)), "/a", False, id="already-present"),
        pytest.param(TargetResult("s", pods=pods(DUP)), "/a", False, id="duplicate-409-or-400"),
        pytest.param(TargetResult("s", pods=pods(FAIL)), None, False, id="failed"),
    ],
)
def test_status_v2_path_and_time(result: TargetResult, path: str | None, stamped: bool) -> None:
    status = status_v2({}, result, "/a", 3, NOW)
    assert status.get("loadedPath") == path
    assert ("lastLoadedAt" in status) is stamped
    types = {c["type"]: c for c in status["conditions"]}
    assert set(types) == {"Loaded", "Error"}
    assert all(c["observedGeneration"] == 3 and c["message"] for c in types.values())


def test_status_v1_keeps_other_fields_and_transition_time() -> None:
    earlier = "2025-01-01T00:00:00Z"
    current = {
        "phase": "Ready",
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "IntegrityVerified",
                "message": "m",
                "lastTransitionTime": earlier,
            },
            {
                "type": "Loaded",
                "status": "True",
                "reason": "Loaded",
                "message": "old",
                "lastTransitionTime": earlier,
            },
        ],
    }
    status = status_v1(current, ["d"], [TargetResult("d", pods=pods(OK))], 1, NOW)
    assert status["phase"] == "Ready" and status["usedBy"] == ["d"]
    loaded = next(c for c in status["conditions"] if c["type"] == "Loaded")
    assert loaded["lastTransitionTime"] == earlier and loaded["message"] != "old"


@pytest.mark.parametrize(
    ("current", "not_ready", "expected"),
    [
        pytest.param({}, True, None, id="not-ready-no-loaded-yet"),
        pytest.param(
            {
                "conditions": [
                    {
                        "type": "Loaded",
                        "status": "True",
                        "reason": "Loaded",
                        "message": "m",
                        "lastTransitionTime": "2025-01-01T00:00:00Z",
                    }
                ]
            },
            True,
            "AdapterNotReady",
            id="not-ready-loaded-goes-false",
        ),
        pytest.param({"usedBy": ["old"]}, False, None, id="usedby-only"),
    ],
)
def test_status_v1_without_results(current: dict[str, object], not_ready: bool, expected: str | None) -> None:
    status = status_v1(current, [], None, 1, NOW, not_ready)
    assert "usedBy" not in status
    loaded = [c for c in status.get("conditions") or [] if c["type"] == "Loaded"]  # type: ignore[attr-defined]
    assert (loaded[0]["reason"] if loaded else None) == expected
