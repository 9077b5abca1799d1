"""phase.summarize and integrity.compare: tables, no mocks."""

from __future__ import annotations

import pytest

from functions.logic import integrity, phase
from functions.logic.integrity import Observed, Verdict
from functions.resources.meta import Condition, ConditionStatus

T = "2026-01-01T00:00:00Z"


def ready(status: ConditionStatus, reason: str) -> list[Condition]:
    return [Condition(type="Ready", status=status, reason=reason, message="m", last_transition_time=T)]


@pytest.mark.parametrize(
    ("conditions", "files_seen", "expected"),
    [
        pytest.param(None, False, ("Pending", False), id="nothing-yet"),
        pytest.param(None, True, ("Processing", False), id="files-before-any-verdict"),
        pytest.param(ready("Unknown", "Admitted"), False, ("Pending", False), id="admitted-no-files"),
        pytest.param(
            ready("False", "AwaitingIntegrity"), True, ("Processing", False), id="awaiting-integrity"
        ),
        pytest.param(ready("False", "AwaitingFiles"), False, ("Pending", False), id="awaiting-files-none"),
        pytest.param(ready("False", "AwaitingFiles"), True, ("Processing", False), id="awaiting-files-some"),
        pytest.param(ready("True", "IntegrityVerified"), True, ("Ready", True), id="verified"),
        pytest.param(ready("False", "IntegrityCheckFailed"), True, ("Failed", False), id="mismatch"),
        pytest.param(ready("False", "Md5Unavailable"), True, ("Failed", False), id="md5-unavailable"),
        pytest.param(ready("False", "ModelNotFound"), False, ("Failed", False), id="model-not-found"),
        pytest.param(
            ready("False", "IntegrityPathOutsideAdapter"), True, ("Failed", False), id="path-outside"
        ),
        pytest.param(
            [Condition(type="Other", status="True", reason="X", last_transition_time=T)],
            False,
            ("Pending", False),
            id="other-condition-only",
        ),
    ],
)
def test_summarize(conditions: list[Condition] | None, files_seen: bool, expected: tuple[str, bool]) -> None:
    assert phase.summarize(conditions, files_seen) == expected


A = "/loraadapters/ns/m/a/adapter_model.safetensors"
B = "/loraadapters/ns/m/a/adapter_config.json"
MD5_A = "0" * 32
MD5_B = "b" * 32


@pytest.mark.parametrize(
    ("expected", "observed", "hashed", "verdict"),
    [
        pytest.param(
            None,
            {},
            {},
            Verdict("False", "AwaitingIntegrity", "No MD5 declared in spec.integrity.md5 yet", False),
            id="nothing-declared",
        ),
        pytest.param(
            {A: MD5_A, B: MD5_B},
            {A: Observed(MD5_A, 1)},
            {},
            Verdict("False", "AwaitingFiles", f"Waiting for 1 declared file(s): {B}", False),
            id="one-missing",
        ),
        pytest.param(
            {A: MD5_A.upper(), B: MD5_B},
            {A: Observed(MD5_A, 1), B: Observed(MD5_B, 2)},
            {},
            Verdict("True", "IntegrityVerified", "All 2 declared file(s) match", True),
            id="all-match-case-insensitive",
        ),
        pytest.param(
            {A: MD5_A, B: MD5_B},
            {A: Observed(MD5_B, 1), B: Observed(MD5_B, 2)},
            {},
            Verdict(
                "False",
                "IntegrityCheckFailed",
                f"MD5 mismatch for 1 file(s): {A} (expected {MD5_A}, observed {MD5_B})",
                False,
            ),
            id="one-mismatch",
        ),
        pytest.param(
            {A: MD5_A, B: MD5_B},
            {A: Observed(MD5_B, 1)},
            {},
            Verdict(
                "False",
                "IntegrityCheckFailed",
                f"MD5 mismatch for 1 file(s): {A} (expected {MD5_A}, observed {MD5_B})",
                False,
            ),
            id="mismatch-wins-over-missing",
        ),
        pytest.param(
            {A: MD5_A},
            {A: Observed(None, 1)},
            {A: MD5_A},
            Verdict("True", "IntegrityVerified", "All 1 declared file(s) match", True),
            id="no-md5-but-hashed",
        ),
        pytest.param(
            {A: MD5_A},
            {A: Observed(None, 1)},
            {A: None},
            Verdict(
                "False",
                "Md5Unavailable",
                f"Storage reported no MD5 and the file could not be hashed (too large or gone): {A}",
                False,
            ),
            id="no-md5-unhashable",
        ),
        pytest.param(
            {A: MD5_A},
            {A: Observed(None, 1)},
            {A: MD5_B},
            Verdict(
                "False",
                "IntegrityCheckFailed",
                f"MD5 mismatch for 1 file(s): {A} (expected {MD5_A}, observed {MD5_B})",
                False,
            ),
            id="hashed-mismatch",
        ),
    ],
)
def test_compare(
    expected: dict[str, str] | None,
    observed: dict[str, Observed],
    hashed: dict[str, str | None],
    verdict: Verdict,
) -> None:
    assert integrity.compare(expected, observed, hashed) == verdict


def test_to_hash_lists_declared_observed_without_md5() -> None:
    observed = {A: Observed(None, 1), B: Observed(MD5_B, 1), "/x": Observed(None, 1)}
    assert integrity.to_hash({A: MD5_A, B: MD5_B, "/y": MD5_A}, observed) == [A]


def test_long_listing_is_cut() -> None:
    declared = {f"/loraadapters/ns/m/a/f{i:02}": MD5_A for i in range(25)}
    verdict = integrity.compare(declared, {}, {})
    assert verdict.reason == "AwaitingFiles"
    assert verdict.message.endswith("and 5 more")
