"""tests.support.schemas: the CRD schema translation the manifest and round-trip tests rely on."""

from __future__ import annotations

import jsonschema
import pytest

from tests.support.schemas import to_json_schema

STRUCTURAL = {
    "type": "object",
    "properties": {
        "size": {"x-kubernetes-int-or-string": True},
        "port": {"x-kubernetes-int-or-string": True, "nullable": True},
        "note": {"type": "string", "nullable": True},
        "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True, "properties": {}},
    },
}


@pytest.mark.parametrize("validator", [jsonschema.Draft7Validator, jsonschema.Draft202012Validator])
@pytest.mark.parametrize(
    ("obj", "valid"),
    [
        ({"size": 3}, True),
        ({"size": "3Gi"}, True),
        ({"size": 1.5}, False),
        ({"size": None}, False),
        ({"port": None}, True),
        ({"note": None}, True),
        ({"note": 7}, False),
        ({"free": {"anything": 1}}, True),
        ({"sise": 3}, False),  # a misspelt field is an error, not silently pruned
    ],
)
def test_structural_rules(validator: type[jsonschema.Validator], obj: dict[str, object], valid: bool) -> None:
    assert validator(to_json_schema(STRUCTURAL)).is_valid(obj) is valid


def test_an_existing_any_of_is_kept_and_x_kubernetes_keys_dropped() -> None:
    node = {
        "x-kubernetes-int-or-string": True,
        "anyOf": [{"type": "integer"}, {"type": "string"}],
        "type": "x",
    }
    assert to_json_schema(node) == {"anyOf": [{"type": "integer"}, {"type": "string"}]}
