"""The record models in functions/resources agree with the CRDs in knative/crds.

Both sides are reduced to the same small vocabulary (JSON type, properties, required, enum,
length/minimum/pattern constraints) and compared both ways:

- every CRD property exists in the model under the same camelCase alias, and vice versa;
- required lists are equal (the model's JSON schema in validation mode);
- enums equal Literals;
- every constraint the model declares is in the CRD with the same value, and every enum /
  minLength / maxLength / minimum of the CRD's spec is declared by the model (the model must
  not accept a spec the apiserver would reject).

Opaque CRD nodes (``metadata``; objects with ``x-kubernetes-preserve-unknown-fields`` and no
properties) are not compared: the model may type them or not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from functions.resources import inference, meta, rackai
from functions.resources.wire import WireModel

ROOT = Path(__file__).resolve().parents[2]
CRDS = ROOT / "knative" / "crds"

Schema = dict[str, Any]

PAIRS: dict[str, type[WireModel]] = {
    "rackai.rackspace.com_loraadapters.yaml": rackai.LoRAAdapter,
    "rackai.rackspace.com_models.yaml": rackai.Model,
    "rackai.rackspace.com_modeldeployments.yaml": rackai.ModelDeployment,
    "inference.rackai.rackspace.com_loraadapters.yaml": inference.SGLangAdapter,
    "inference.rackai.rackspace.com_inferenceservices.yaml": inference.InferenceService,
}

# CRD-required fields the model fills with a default; the default is always emitted on the
# wire (metav1.Condition.message has no omitempty), which test_condition_message_emitted proves.
EMITTED_DEFAULTS = {("Condition", "message")}

# Constraints compared; the CRD may add more (patterns on condition fields, formats) where the
# model leaves validation to the apiserver, except the ones in SPEC_MUST_DECLARE.
CONSTRAINTS = ("enum", "minLength", "maxLength", "minimum", "pattern")
SPEC_MUST_DECLARE = ("enum", "minLength", "maxLength", "minimum", "pattern")


def crd_schema(file_name: str) -> Schema:
    crd = yaml.safe_load((CRDS / file_name).read_text())
    (version,) = crd["spec"]["versions"]
    schema: Schema = version["schema"]["openAPIV3Schema"]
    return schema


class ModelSchema:
    """The model's JSON schema with $refs resolved and Optional unwrapped."""

    def __init__(self, model: type[WireModel]) -> None:
        self.root = model.model_json_schema()
        self.defs: dict[str, Schema] = self.root.get("$defs", {})

    def resolve(self, node: Schema) -> Schema:
        """Follow $ref, drop the null branch of Optional; mark int|str as int-or-string."""
        if "$ref" in node:
            return self.resolve(self.defs[node["$ref"].rsplit("/", 1)[-1]])
        branches = [b for b in node.get("anyOf", []) if b.get("type") != "null"]
        if "anyOf" in node and len(branches) == 1:
            return self.resolve({**{k: v for k, v in node.items() if k != "anyOf"}, **branches[0]})
        if "anyOf" in node and {b.get("type") for b in branches} == {"integer", "string"}:
            return {"x-kubernetes-int-or-string": True}
        return node


def is_opaque(crd: Schema) -> bool:
    return "properties" not in crd and (
        crd.get("x-kubernetes-preserve-unknown-fields") is True
        or (crd.get("type") == "object" and "additionalProperties" not in crd)
    )


def compare(crd: Schema, model: Schema, ms: ModelSchema, path: str, in_spec: bool) -> list[str]:
    """Every disagreement between one CRD node and one model node."""
    model = ms.resolve(model)
    if is_opaque(crd):
        return []
    if crd.get("x-kubernetes-int-or-string"):
        ok = model.get("x-kubernetes-int-or-string") is True
        return [] if ok else [f"{path}: CRD int-or-string, model {model}"]
    problems = []
    if crd.get("type") != model.get("type"):
        problems.append(f"{path}: type {crd.get('type')} != model {model.get('type')}")
    problems.extend(compare_constraints(crd, model, path, in_spec))
    if "properties" in crd or "properties" in model:
        problems.extend(compare_object(crd, model, ms, path, in_spec))
    for key in ("items", "additionalProperties"):
        if isinstance(crd.get(key), dict) and isinstance(model.get(key), dict):
            problems.extend(compare(crd[key], model[key], ms, f"{path}.{key}", in_spec))
        elif isinstance(crd.get(key), dict):
            problems.append(f"{path}.{key}: in CRD, not in model")
    return problems


def compare_constraints(crd: Schema, model: Schema, path: str, in_spec: bool) -> list[str]:
    problems = []
    for key in CONSTRAINTS:
        want = model.get(key)
        if want is not None and crd.get(key) != want:
            problems.append(f"{path}.{key}: CRD {crd.get(key)!r} != model {want!r}")
        if want is None and in_spec and key in SPEC_MUST_DECLARE and key in crd:
            problems.append(f"{path}.{key}: CRD has {crd[key]!r}, model does not declare it")
        if key == "enum" and want is None and key in crd:
            problems.append(f"{path}.enum: CRD enum {crd[key]}, model has no Literal")
    return problems


def compare_object(crd: Schema, model: Schema, ms: ModelSchema, path: str, in_spec: bool) -> list[str]:
    crd_props: Schema = crd.get("properties", {})
    model_props: Schema = model.get("properties", {})
    problems = [
        f"{path}.{n}: in CRD, not in model"
        for n in crd_props
        if n not in model_props and not is_opaque(crd_props[n])
    ]
    problems += [f"{path}.{n}: in model, not in CRD" for n in model_props if n not in crd_props]
    title = model.get("title", "")
    model_required = set(model.get("required", [])) | {
        field for owner, field in EMITTED_DEFAULTS if owner == title
    }
    if set(crd.get("required", [])) != model_required:
        problems.append(f"{path}.required: CRD {crd.get('required', [])} != model {model_required}")
    for name in (n for n in crd_props if n in model_props):
        child_in_spec = in_spec or (path == "" and name == "spec")
        child = compare(crd_props[name], model_props[name], ms, f"{path}.{name}", child_in_spec)
        problems.extend(child)
    return problems


@pytest.mark.parametrize("file_name", sorted(PAIRS))
def test_model_agrees_with_crd(file_name: str) -> None:
    ms = ModelSchema(PAIRS[file_name])
    assert compare(crd_schema(file_name), ms.root, ms, "", in_spec=False) == []


def test_condition_message_emitted() -> None:
    """metav1.Condition requires `message` (no omitempty): an empty message is still sent."""
    condition = meta.Condition(
        type="Ready", status="True", reason="Verified", last_transition_time="2026-01-01T00:00:00Z"
    )
    assert condition.to_wire()["message"] == ""


def test_checker_reports_disagreements() -> None:
    """The comparison can fail: a renamed property, a dropped enum and a changed bound."""
    schema = crd_schema("rackai.rackspace.com_loraadapters.yaml")
    spec = schema["properties"]["spec"]["properties"]
    spec["displayTitle"] = spec.pop("displayName")
    spec["description"]["maxLength"] = 10
    del schema["properties"]["status"]["properties"]["phase"]["enum"]
    ms = ModelSchema(rackai.LoRAAdapter)
    problems = "\n".join(compare(schema, ms.root, ms, "", in_spec=False))
    assert ".spec.displayTitle: in CRD, not in model" in problems
    assert ".spec.displayName: in model, not in CRD" in problems
    assert ".spec.description.maxLength" in problems
    assert ".status.phase.enum" in problems
