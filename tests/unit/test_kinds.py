"""The one table of the two LoRAAdapter kinds (functions/resources/kinds.py) agrees with itself,
with the Literal types the layers above read it through, and with the event contract."""

from __future__ import annotations

from typing import get_args

from events.domain import AdapterRef
from functions.logic.pods import Runtime as PodRuntime
from functions.logic.serving import AdapterKind, TargetKind
from functions.resources import kinds


def test_each_literal_names_exactly_the_table_rows() -> None:
    rows = kinds.SERVING_KINDS
    assert [s.runtime for s in rows] == list(get_args(kinds.Runtime))
    assert [s.api_version for s in rows] == list(get_args(kinds.AdapterApiVersion))
    assert [s.target_kind for s in rows] == list(get_args(kinds.TargetKind))
    assert get_args(AdapterKind) == get_args(PodRuntime) == get_args(kinds.Runtime)
    assert get_args(TargetKind) == get_args(kinds.TargetKind)
    assert get_args(AdapterRef.model_fields["api_version"].annotation) == get_args(kinds.AdapterApiVersion)


def test_the_lookups_are_views_of_the_table() -> None:
    for s in kinds.SERVING_KINDS:
        assert kinds.SERVING_BY_RUNTIME[s.runtime] is s
        assert kinds.SERVING_BY_TARGET[s.target_kind] is s
        assert kinds.SERVING_BY_API_VERSION[s.api_version] is s
        assert kinds.ADAPTER_KINDS[s.api_version] is s.adapter
        assert s.adapter.kind == "LoRAAdapter" and s.target.group == s.adapter.group
