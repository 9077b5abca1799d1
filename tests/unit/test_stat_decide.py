"""stat.decide: the storage observation written whole, no mocks."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from functions.ports import StoredFile
from functions.resources.rackai import LoRAAdapter
from functions.stat import decide, listing_dir, observation, recorded

NOW = datetime(2026, 3, 1, tzinfo=UTC)
DIR = "/loraadapters/ns/llama/a/"
T = "2026-01-01T00:00:00Z"
M1 = "a" * 32


def adapter(status: dict[str, Any] | None = None) -> LoRAAdapter:
    body: dict[str, Any] = {
        "metadata": {"name": "a", "namespace": "ns", "generation": 1},
        "spec": {"model": "llama"},
    }
    if status is not None:
        body["status"] = status
    return LoRAAdapter.model_validate(body)


ADMITTED = {
    "type": "Ready",
    "status": "Unknown",
    "reason": "Admitted",
    "message": "m",
    "lastTransitionTime": T,
    "observedGeneration": 1,
}
VERIFIED = {**ADMITTED, "status": "True", "reason": "IntegrityVerified"}
BASE = {"conditions": [ADMITTED], "storageRef": {"path": DIR}, "observedGeneration": 1}


@pytest.mark.parametrize(
    ("before", "listing", "expected"),
    [
        pytest.param(
            BASE,
            [StoredFile(DIR + "w.safetensors", 2048, M1), StoredFile(DIR + "config.json", 100, None)],
            {
                **BASE,
                "files": [
                    {"path": DIR + "config.json", "size": 100},
                    {"path": DIR + "w.safetensors", "size": 2048},
                ],
                "size": "2148",
                "integrity": {
                    "files": {
                        DIR + "config.json": {"size": 100},
                        DIR + "w.safetensors": {"md5": M1, "size": 2048},
                    }
                },
                "phase": "Processing",
                "ready": False,
            },
            id="two-files-one-without-md5",
        ),
        pytest.param(
            BASE,
            [StoredFile(DIR + "w", 1 << 20, M1)],
            {
                **BASE,
                "files": [{"path": DIR + "w", "size": 1 << 20}],
                "size": "1Mi",
                "integrity": {"files": {DIR + "w": {"md5": M1, "size": 1 << 20}}},
                "phase": "Processing",
                "ready": False,
            },
            id="binary-si-size",
        ),
        pytest.param(
            {
                **BASE,
                "files": [{"path": DIR + "w", "size": 1}],
                "size": "1",
                "integrity": {"files": {DIR + "w": {"md5": M1, "size": 1}}},
                "phase": "Processing",
                "ready": False,
            },
            [],
            {**BASE, "size": "0", "phase": "Pending", "ready": False},
            id="files-gone-removes-integrity",
        ),
        pytest.param(
            {**BASE, "conditions": [VERIFIED], "uploadComplete": True, "usedBy": ["d"]},
            [StoredFile(DIR + "w", 3, M1)],
            {
                **BASE,
                "conditions": [VERIFIED],
                "uploadComplete": True,
                "usedBy": ["d"],
                "files": [{"path": DIR + "w", "size": 3}],
                "size": "3",
                "integrity": {"files": {DIR + "w": {"md5": M1, "size": 3}}},
                "phase": "Ready",
                "ready": True,
            },
            id="keeps-other-fields",
        ),
        pytest.param(
            None,
            [],
            {"size": "0", "phase": "Pending", "ready": False},
            id="before-admit-empty",
        ),
    ],
)
def test_decide(before: dict[str, Any] | None, listing: list[StoredFile], expected: dict[str, Any]) -> None:
    result = decide(adapter(before), listing, NOW).to_wire()
    assert result == expected
    # applying the same listing again changes nothing (duplicates are no-ops)
    assert decide(adapter(result), listing, NOW).to_wire() == result


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        pytest.param(None, DIR, id="computed"),
        pytest.param({"storageRef": {"path": "/loraadapters/ns/llama/a"}}, DIR, id="from-status"),
        pytest.param({"storageRef": {"path": "/etc/passwd"}}, DIR, id="bad-ref-ignored"),
    ],
)
def test_listing_dir(status: dict[str, Any] | None, expected: str) -> None:
    assert listing_dir(adapter(status)) == expected


def test_listing_dir_none_for_impossible_model() -> None:
    bad = LoRAAdapter.model_validate({"metadata": {"name": "a", "namespace": "ns"}, "spec": {"model": "X_Y"}})
    assert listing_dir(bad) is None


def test_observation_ignores_conditions() -> None:
    assert observation({"files": [1], "conditions": [2]}) == {
        "files": [1],
        "size": None,
        "integrity": None,
        "frozen": None,
    }


def declaring(*paths: str) -> LoRAAdapter:
    return LoRAAdapter.model_validate(
        {
            "metadata": {"name": "a", "namespace": "ns", "generation": 1},
            "spec": {"model": "llama", "integrity": {"md5": dict.fromkeys(paths, M1)}},
        }
    )


@pytest.mark.parametrize(
    ("declared", "max_files", "expected"),
    [
        pytest.param((), 10, ["a", "b", "c", "d", "e"], id="all-fit"),
        pytest.param((), 2, ["a", "b"], id="undeclared-in-path-order"),
        pytest.param(("e",), 2, ["a", "e"], id="declared-first"),
        pytest.param(("e", "d", "c"), 2, ["c", "d", "e"], id="every-declared-even-beyond-the-cap"),
        pytest.param(("z",), 1, ["a"], id="declared-but-absent-takes-no-room"),
    ],
)
def test_recorded(declared: tuple[str, ...], max_files: int, expected: list[str]) -> None:
    listing = [StoredFile(path=DIR + n, size=1, md5=None) for n in "edcba"]
    chosen = recorded(declaring(*(DIR + n for n in declared)), listing, max_files)
    assert [f.path for f in chosen] == [DIR + n for n in expected]


def test_decide_truncated_keeps_the_total_size() -> None:
    listing = [StoredFile(path=DIR + f"f{i}", size=1024, md5=None) for i in range(4)]
    status = decide(adapter(BASE), listing, NOW, max_files=1).to_wire()
    assert status["files"] == [{"path": DIR + "f0", "size": 1024}]
    assert status["size"] == "4Ki"
    assert status["phase"] == "Processing"


def verified_with(status: dict[str, Any]) -> LoRAAdapter:
    body: dict[str, Any] = {
        "metadata": {"name": "a", "namespace": "ns", "generation": 1},
        "spec": {"model": "llama", "integrity": {"md5": {DIR + "w.safetensors": M1}}},
        "status": status,
    }
    return LoRAAdapter.model_validate(body)


VERIFIED_W = {
    **BASE,
    "conditions": [VERIFIED],
    "fileSet": "md5set:0123456789abcdef",
    "integrity": {"files": {DIR + "w.safetensors": {"md5": M1, "size": 2048}}},
}


@pytest.mark.parametrize(
    ("listing", "ready"),
    [
        pytest.param([StoredFile(DIR + "w.safetensors", 2048, M1)], "True", id="same-bytes-keep-ready"),
        pytest.param([StoredFile(DIR + "w.safetensors", 2048, "b" * 32)], "Unknown", id="new-md5"),
        pytest.param([StoredFile(DIR + "w.safetensors", 4096, None)], "Unknown", id="new-size-no-md5"),
        pytest.param([], "Unknown", id="declared-file-gone"),
        pytest.param(
            [StoredFile(DIR + "w.safetensors", 2048, M1), StoredFile(DIR + "extra.txt", 1, None)],
            "True",
            id="an-undeclared-file-changes-nothing",
        ),
    ],
)
def test_a_changed_declared_file_takes_ready_back_in_the_same_write(
    listing: list[StoredFile], ready: str
) -> None:
    status = decide(verified_with(VERIFIED_W), listing, NOW)
    found = next(c for c in status.conditions or [] if c.type == "Ready")
    assert found.status == ready
    if ready == "Unknown":
        assert found.reason == "AwaitingVerification" and status.phase != "Ready" and status.ready is False
    assert status.file_set == "md5set:0123456789abcdef"  # the pods keep serving the verified set


def test_the_recorded_files_fit_a_byte_budget_whatever_their_count() -> None:
    """450 files with 1.7 KB paths would make a 1.5 MiB status: the budget keeps it small,
    declared files first (verify needs them), then the others while they fit."""
    long = DIR + "x" * 1700
    listing = [StoredFile(f"{long}{i:03d}", 1, M1) for i in range(450)]
    chosen = recorded(adapter(), listing, max_files=1000)
    assert 0 < len(chosen) < 450
    assert sum(2 * len(f.path) + 96 for f in chosen) <= 512 << 10
    declared = LoRAAdapter.model_validate(
        {
            "metadata": {"name": "a", "namespace": "ns"},
            "spec": {"model": "llama", "integrity": {"md5": {listing[-1].path: M1}}},
        }
    )
    assert listing[-1] in recorded(declared, listing, max_files=1000, max_bytes=0)


UNHASHED_W = {
    **VERIFIED_W,
    "integrity": {"files": {DIR + "w.safetensors": {"size": 2048, "version": "fv1:one"}}},
}


@pytest.mark.parametrize(
    ("listing", "ready"),
    [
        pytest.param([StoredFile(DIR + "w.safetensors", 2048, None, "fv1:one")], "True", id="same-version"),
        pytest.param(
            [StoredFile(DIR + "w.safetensors", 2048, None, "fv1:two")], "Unknown", id="same-size-new-bytes"
        ),
    ],
)
def test_a_file_without_an_md5_is_judged_again_when_its_version_changes(
    listing: list[StoredFile], ready: str
) -> None:
    """A same-size replacement of a file storage lists without an MD5 (an append then a rename
    over it, a second multipart upload) changes only its version: Ready leaves True all the same."""
    status = decide(verified_with(UNHASHED_W), listing, NOW)
    found = next(c for c in status.conditions or [] if c.type == "Ready")
    assert found.status == ready
    recorded_file = (status.integrity.files or {}) if status.integrity else {}
    assert recorded_file[DIR + "w.safetensors"].version == listing[0].version
