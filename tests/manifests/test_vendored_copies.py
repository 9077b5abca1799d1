"""The vendored copies equal their originals in ../shared, when that folder is beside the clone.

A clone without ../shared runs every other test on the copies: the seed specifications in
tests/manifests/seeds/ (the CRD superset test and the stand-ins' fixture CRD) and the Knative
CRDs in devstack/kubernetes/knative-crds/ (the manifest validation, and what the embedded stack installs).
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
SHARED = ROOT.parent / "shared"
KNATIVE_CRDS = ROOT / "devstack" / "kubernetes" / "knative-crds"
COPIES = {
    "seeds": (SHARED / "seeds", HERE / "seeds", "*.json"),
    "knative-crds": (SHARED / "reference" / "knative-crds", KNATIVE_CRDS, "*.yaml"),
}


@pytest.mark.parametrize("name", sorted(COPIES))
def test_vendored_copy_equals_the_shared_original(name: str) -> None:
    original, copy, pattern = COPIES[name]
    if not original.is_dir():
        pytest.skip(f"{original} is not beside the repository")
    originals = sorted(p.name for p in original.glob(pattern))
    assert originals, f"{original} holds no {pattern}"
    assert sorted(p.name for p in copy.glob(pattern)) == originals
    for file in originals:
        assert (copy / file).read_bytes() == (original / file).read_bytes(), file
