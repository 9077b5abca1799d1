"""The status writer's JSON merge patch: what the API server makes of it is what was desired.

Every guarded write (`Kube._guarded`) sends `mergepatch.diff(current, desired)`. The API server
applies it as RFC 7386 says (section 2's pseudo-code, written out below as `merge_patch`), so the
result must be the desired document, for any pair of documents a status can be."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from functions.logic.mergepatch import diff

KEYS = st.sampled_from(["a", "b", "c", "conditions", "served", "phase"])
ABSENT = object()
SCALARS = st.booleans() | st.integers(-3, 3) | st.sampled_from(["", "x", "True", "False"])


def documents(nulls: bool) -> st.SearchStrategy[Any]:
    """JSON documents; `nulls=False`: no null member anywhere (a merge patch cannot set one, and
    the writers leave unset fields out)."""
    leaves = SCALARS | st.none() if nulls else SCALARS
    return st.recursive(
        leaves,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=4),
        max_leaves=12,
    )


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386, section 2: MergePatch(Target, Patch)."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for name, value in patch.items():
        if value is None:
            result.pop(name, None)
        else:
            result[name] = merge_patch(result.get(name), value)
    return result


@settings(max_examples=500)
@given(
    current=st.dictionaries(KEYS, documents(nulls=True)),
    desired=st.dictionaries(KEYS, documents(nulls=False)),
)
def test_the_patch_turns_the_current_document_into_the_desired_one(
    current: dict[str, Any], desired: dict[str, Any]
) -> None:
    assert merge_patch(current, diff(current, desired)) == desired


@settings(max_examples=500)
@given(
    current=st.dictionaries(KEYS, documents(nulls=True)),
    desired=st.dictionaries(KEYS, documents(nulls=False)),
)
def test_the_patch_names_only_members_that_change(current: dict[str, Any], desired: dict[str, Any]) -> None:
    patch = diff(current, desired)
    for name in patch:
        assert current.get(name, ABSENT) != desired.get(name, ABSENT)


@given(document=st.dictionaries(KEYS, documents(nulls=True)))
def test_a_document_unchanged_is_an_empty_patch(document: dict[str, Any]) -> None:
    assert diff(document, document) == {}


def test_lists_travel_whole_and_removed_members_are_null() -> None:
    current = {"conditions": [{"type": "Ready", "status": "False"}], "phase": "Pending", "size": "1Ki"}
    desired = {"conditions": [{"type": "Ready", "status": "True"}], "phase": "Pending"}
    assert diff(current, desired) == {"conditions": [{"type": "Ready", "status": "True"}], "size": None}
