"""A CRD's structural schema (openAPIV3Schema) as a JSON Schema the `jsonschema` package runs.

The apiserver's structural-schema rules that matter for validation, translated:
- `x-kubernetes-int-or-string: true` accepts an integer or a string (the schema has no
  `type` then; kubebuilder also writes the `anyOf`, which is kept when present);
- `nullable: true` also accepts null;
- an object with `properties` and neither `x-kubernetes-preserve-unknown-fields` nor
  `additionalProperties` is pruned by the apiserver; here an unknown field is an error instead,
  because pruning would silently drop a misspelt field;
- every other `x-kubernetes-*` key is dropped.
The output is valid for Draft 7 and Draft 2020-12 alike.
"""

from __future__ import annotations

from typing import Any

INT_OR_STRING = [{"type": "integer"}, {"type": "string"}]


def to_json_schema(node: Any) -> Any:
    """Structural schema -> JSON Schema (see the module docstring for the rules)."""
    if isinstance(node, list):
        return [to_json_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: to_json_schema(v) for k, v in node.items() if not k.startswith("x-kubernetes-")}
    nullable = out.pop("nullable", False)
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = list(out.get("anyOf") or INT_OR_STRING)
        if nullable:
            out["anyOf"].append({"type": "null"})
    elif nullable and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    opaque = node.get("x-kubernetes-preserve-unknown-fields") or "additionalProperties" in node
    if node.get("type") == "object" and "properties" in node and not opaque:
        out["additionalProperties"] = False
    return out
