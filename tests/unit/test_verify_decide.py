"""verify.decide: the integrity verdict written whole, no mocks."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from functions.logic.facts import file_set
from functions.resources.rackai import LoRAAdapter
from functions.verify import decide, verdict_of

NOW = datetime(2026, 3, 1, tzinfo=UTC)
T_NOW = "2026-03-01T00:00:00Z"
T_OLD = "2026-01-01T00:00:00Z"
DIR = "/loraadapters/ns/llama/a/"
W, C = DIR + "w.safetensors", DIR + "adapter_config.json"
M1, M2 = "1" * 32, "2" * 32


def adapter(md5: dict[str, str] | None, status: dict[str, Any]) -> LoRAAdapter:
    spec: dict[str, Any] = {"model": "llama"}
    if md5 is not None:
        spec["integrity"] = {"md5": md5}
    return LoRAAdapter.model_validate(
        {"metadata": {"name": "a", "namespace": "ns", "generation": 3}, "spec": spec, "status": status}
    )


def ready(status: str, reason: str, message: str, t: str = T_NOW, gen: int = 3) -> dict[str, Any]:
    return {
        "type": "Ready",
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": t,
        "observedGeneration": gen,
    }


def observed(files: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {
        "storageRef": {"path": DIR},
        "observedGeneration": 3,
        "files": [{"path": p, "size": f["size"]} for p, f in sorted(files.items())],
        "size": str(sum(f["size"] for f in files.values())),
        "integrity": {"files": files},
    }


ADMITTED = ready("Unknown", "Admitted", "accepted", T_OLD)
BOTH = observed({W: {"md5": M1, "size": 10}, C: {"md5": M2, "size": 5}})
SET_BOTH, SET_W = file_set({W: M1, C: M2}), file_set({W: M1})
"""What verify records as the verified file set with Ready=True (the pods are loaded from it)."""


@pytest.mark.parametrize(
    ("md5", "status", "hashed", "expected"),
    [
        pytest.param(
            {W: M1, C: M2},
            {**BOTH, "conditions": [ADMITTED]},
            {},
            {
                **BOTH,
                "conditions": [ready("True", "IntegrityVerified", "All 2 declared file(s) match")],
                "fileSet": SET_BOTH,
                "uploadComplete": True,
                "phase": "Ready",
                "ready": True,
            },
            id="verified",
        ),
        pytest.param(
            {W: M2, C: M2},
            {**BOTH, "conditions": [ADMITTED]},
            {},
            {
                **BOTH,
                "conditions": [
                    ready(
                        "False",
                        "IntegrityCheckFailed",
                        f"MD5 mismatch for 1 file(s): {W} (expected {M2}, observed {M1})",
                    )
                ],
                "uploadComplete": False,
                "phase": "Failed",
                "ready": False,
            },
            id="mismatch-keeps-integrity-files",
        ),
        pytest.param(
            None,
            {**BOTH, "conditions": [ADMITTED]},
            {},
            {
                **BOTH,
                "conditions": [
                    ready("False", "AwaitingIntegrity", "No MD5 declared in spec.integrity.md5 yet")
                ],
                "uploadComplete": False,
                "phase": "Processing",
                "ready": False,
            },
            id="awaiting-integrity",
        ),
        pytest.param(
            {W: M1, C: M2},
            {"storageRef": {"path": DIR}, "conditions": [ADMITTED]},
            {},
            {
                "storageRef": {"path": DIR},
                "conditions": [ready("False", "AwaitingFiles", f"Waiting for 2 declared file(s): {C}, {W}")],
                "uploadComplete": False,
                "phase": "Pending",
                "ready": False,
            },
            id="awaiting-files-none-seen",
        ),
        pytest.param(
            {W: M1},
            {**observed({W: {"size": 10}}), "conditions": [ADMITTED]},
            {W: M1},
            {
                **observed({W: {"size": 10}}),
                "conditions": [ready("True", "IntegrityVerified", "All 1 declared file(s) match")],
                "fileSet": SET_W,
                "uploadComplete": True,
                "phase": "Ready",
                "ready": True,
            },
            id="no-backend-md5-hashed-by-streaming",
        ),
        pytest.param(
            {W: M1},
            {**observed({W: {"size": 10}}), "conditions": [ADMITTED]},
            {W: None},
            {
                **observed({W: {"size": 10}}),
                "conditions": [
                    ready(
                        "False",
                        "Md5Unavailable",
                        f"Storage reported no MD5 and the file could not be hashed (too large or gone): {W}",
                    )
                ],
                "uploadComplete": False,
                "phase": "Failed",
                "ready": False,
            },
            id="md5-unavailable",
        ),
        pytest.param(
            {W: M1, C: M2},
            {**BOTH, "conditions": [ready("False", "ModelNotFound", "no model", T_OLD)]},
            {},
            {
                **BOTH,
                "conditions": [ready("False", "ModelNotFound", "no model", T_OLD)],
                "uploadComplete": True,
                "phase": "Failed",
                "ready": False,
            },
            id="keeps-admit-verdict",
        ),
        pytest.param(
            {W: M1, C: M2},
            {
                **BOTH,
                "conditions": [
                    ready("False", "IntegrityCheckFailed", "old mismatch", T_OLD, 2),
                ],
                "uploadComplete": False,
                "phase": "Failed",
                "ready": False,
            },
            {},
            {
                **BOTH,
                "conditions": [ready("True", "IntegrityVerified", "All 2 declared file(s) match")],
                "fileSet": SET_BOTH,
                "uploadComplete": True,
                "phase": "Ready",
                "ready": True,
            },
            id="fixed-file-ready-again",
        ),
        pytest.param(
            {W: M1, C: M2},
            {
                **BOTH,
                "conditions": [ready("True", "IntegrityVerified", "All 2 declared file(s) match", T_OLD)],
                "fileSet": SET_BOTH,
                "uploadComplete": True,
                "phase": "Ready",
                "ready": True,
                "usedBy": ["dep"],
            },
            {},
            {
                **BOTH,
                "conditions": [ready("True", "IntegrityVerified", "All 2 declared file(s) match", T_OLD)],
                "fileSet": SET_BOTH,
                "uploadComplete": True,
                "phase": "Ready",
                "ready": True,
                "usedBy": ["dep"],
            },
            id="duplicate-is-no-op",
        ),
        pytest.param(
            {W: M1, C: M2},
            {
                **BOTH,
                "conditions": [
                    ready("Unknown", "AwaitingVerification", "storage changed", T_OLD),
                    {**ready("True", "Loaded", "loaded in 2 Ready pod(s): d 2/2", T_OLD), "type": "Loaded"},
                ],
                "fileSet": "md5set:0000000000000000",
                "served": [{"pod": "d-0", "fileSet": "md5set:0000000000000000"}],
            },
            {},
            {
                **BOTH,
                "conditions": [
                    {
                        **ready(
                            "False",
                            "Updating",
                            "a newer verified file set is being loaded into the pods that serve this adapter",
                        ),
                        "type": "Loaded",
                    },
                    ready("True", "IntegrityVerified", "All 2 declared file(s) match"),
                ],
                "fileSet": SET_BOTH,
                "served": [{"pod": "d-0", "fileSet": "md5set:0000000000000000"}],
                "uploadComplete": True,
                "phase": "Ready",
                "ready": True,
            },
            id="a-newer-set-takes-loaded-back-in-the-same-write",
        ),
        pytest.param(
            {W: M2, C: M2},
            {**BOTH, "conditions": [ready("True", "IntegrityVerified", "ok", T_OLD)], "fileSet": SET_BOTH},
            {},
            {
                **BOTH,
                "conditions": [
                    ready(
                        "False",
                        "IntegrityCheckFailed",
                        f"MD5 mismatch for 1 file(s): {W} (expected {M2}, observed {M1})",
                    )
                ],
                "uploadComplete": False,
                "phase": "Failed",
                "ready": False,
            },
            id="a-failed-check-forgets-the-verified-set",
        ),
        pytest.param(
            {W: M2, C: M2},
            {
                **BOTH,
                "conditions": [
                    {**ready("True", "Loaded", "loaded in 2 Ready pod(s): d 2/2", T_OLD), "type": "Loaded"},
                    ready("True", "IntegrityVerified", "ok", T_OLD),
                ],
                "fileSet": SET_BOTH,
            },
            {},
            {
                **BOTH,
                "conditions": [
                    {
                        **ready(
                            "False",
                            "AdapterNotReady",
                            "not Ready (IntegrityCheckFailed): the adapter is being unloaded",
                        ),
                        "type": "Loaded",
                    },
                    ready(
                        "False",
                        "IntegrityCheckFailed",
                        f"MD5 mismatch for 1 file(s): {W} (expected {M2}, observed {M1})",
                    ),
                ],
                "uploadComplete": False,
                "phase": "Failed",
                "ready": False,
            },
            id="a-failed-check-takes-loaded-back-in-the-same-write",
        ),
    ],
)
def test_decide(
    md5: dict[str, str] | None,
    status: dict[str, Any],
    hashed: dict[str, str | None],
    expected: dict[str, Any],
) -> None:
    assert decide(adapter(md5, status), hashed, NOW).to_wire() == expected


def test_verdict_of() -> None:
    assert verdict_of(None) is None
    assert verdict_of({"conditions": [ready("True", "IntegrityVerified", "x")]}) == (
        "True",
        "IntegrityVerified",
    )
