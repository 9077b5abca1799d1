"""Each LoRAAdapter CRD schema is a superset of its seed schema (the specification).

The checker walks the seed schema and reports every constraint or marker that the CRD lacks or
weakens. It accepts exactly the equivalences documented in knative/crds/README.md, because a
structural CRD schema cannot say some things the seeds say:

- ``type: ["X", "null"]``  ->  ``type: X`` + ``nullable: true``;
- ``additionalProperties: false``  ->  omitted (the apiserver prunes unknown fields of a
  structural schema; apiextensions/v1 rejects ``additionalProperties: false``);
- ``readOnly: true``  ->  omitted (not a CRD keyword; the status subresource makes status
  read-only through the main resource);
- root ``metadata``  ->  ``{type: object}`` (the apiserver owns ObjectMeta's schema).

The mutation cases prove the checker can fail: each removes one constraint from a copy of the
CRD and expects a report naming it.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CRDS = ROOT / "knative" / "crds"
# The specification lives in ../shared/seeds; a byte-identical copy is vendored for clones that
# lack it (tests/manifests/test_vendored_copies.py keeps the two equal when both exist).
SEEDS_DIRS = (ROOT.parent / "shared" / "seeds", ROOT / "tests" / "manifests" / "seeds")

Schema = dict[str, Any]

# Keywords that recurse into sub-schemas; everything else is compared as a value.
NESTED = {"properties", "items", "additionalProperties", "anyOf"}
SET_VALUED = {"required", "enum", "x-kubernetes-list-map-keys"}


def seed_path(name: str) -> Path:
    """The seed file, from ../shared (dev and CI) or the vendored copy."""
    found = [folder / name for folder in SEEDS_DIRS if (folder / name).exists()]
    assert found, f"seed {name} not found in {SEEDS_DIRS}"
    return found[0]


def seed_schemas() -> dict[str, Schema]:
    """Seed LoRAAdapter schemas keyed by the CRD file that must contain them."""
    openapi = json.loads(seed_path("rackai-loraadapter-openapi.json").read_text())
    sglang = json.loads(seed_path("sglang-loraadapter-schema.json").read_text())
    return {
        "rackai.rackspace.com_loraadapters.yaml": openapi["components"]["schemas"]["LoRAAdapter"],
        "inference.rackai.rackspace.com_loraadapters.yaml": sglang,
    }


def crd_schema(crd: Schema) -> Schema:
    """The openAPIV3Schema of the CRD's only version."""
    (version,) = crd["spec"]["versions"]
    schema: Schema = version["schema"]["openAPIV3Schema"]
    return schema


def load_crd(file_name: str) -> Schema:
    loaded: Schema = yaml.safe_load((CRDS / file_name).read_text())
    return loaded


def normalise_seed(node: Schema) -> Schema:
    """Apply the documented equivalences to one seed node (not recursively)."""
    out = {k: v for k, v in node.items() if k != "readOnly"}
    if out.get("additionalProperties") is False:
        del out["additionalProperties"]
    kind = out.get("type")
    if isinstance(kind, list):
        types = [t for t in kind if t != "null"]
        assert len(types) == 1, f"unsupported type union {kind}"
        out["type"] = types[0]
        if "null" in kind:
            out["nullable"] = True
    return out


def check(seed: Schema, crd: Schema, path: str = "") -> list[str]:
    """Every way in which `crd` fails to carry a constraint of `seed`, as readable lines."""
    if path == ".properties.metadata":
        return [] if crd.get("type") == "object" else [f"{path}: type must be object"]
    node = normalise_seed(seed)
    problems: list[str] = []
    for key, want in node.items():
        where = f"{path}.{key}"
        if key not in crd:
            problems.append(f"{where}: missing (seed has {want!r})")
        elif key in NESTED:
            problems.extend(check_nested(key, want, crd[key], where))
        elif key in SET_VALUED:
            problems.extend(check_set(want, crd[key], where, exact=key != "required"))
        elif key == "x-kubernetes-validations":
            problems.extend(f"{where}: missing rule {r!r}" for r in want if r not in crd[key])
        elif crd[key] != want:
            problems.append(f"{where}: {crd[key]!r} != seed {want!r}")
    return problems


def check_nested(key: str, want: Any, got: Any, where: str) -> list[str]:
    """Recurse into properties / items / additionalProperties / anyOf."""
    if key == "properties":
        problems = [f"{where}.{name}: missing property" for name in want if name not in got]
        for name in (n for n in want if n in got):
            problems.extend(check(want[name], got[name], f"{where}.{name}"))
        return problems
    if key == "anyOf":
        if len(want) != len(got):
            return [f"{where}: {len(got)} branches != seed {len(want)}"]
        return [p for i, w in enumerate(want) for p in check(w, got[i], f"{where}[{i}]")]
    if isinstance(want, bool) or isinstance(got, bool):
        return [] if want == got else [f"{where}: {got!r} != seed {want!r}"]
    return check(want, got, where)


def check_set(want: list[Any], got: list[Any], where: str, exact: bool) -> list[str]:
    """Entries of the seed list that the CRD lacks; with `exact`, extras weaken it too."""
    problems = [f"{where}: missing {v!r}" for v in want if v not in got]
    if exact:
        problems.extend(f"{where}: extra {v!r} not in seed" for v in got if v not in want)
    return problems


@pytest.mark.parametrize("file_name", sorted(seed_schemas()))
def test_crd_is_superset_of_seed(file_name: str) -> None:
    problems = check(seed_schemas()[file_name], crd_schema(load_crd(file_name)))
    assert problems == []


def test_tags_added_on_the_vllm_adapter_and_model() -> None:
    """The seed note: `tags` exists on LoRAAdapter and Model but the published OpenAPI lacks it."""
    for file_name in ("rackai.rackspace.com_loraadapters.yaml", "rackai.rackspace.com_models.yaml"):
        tags = crd_schema(load_crd(file_name))["properties"]["spec"]["properties"]["tags"]
        assert tags["type"] == "array"
        assert tags["items"] == {"type": "string"}


def _keywords(node: Any, key: str) -> list[Any]:
    """Every value of `key` anywhere in a parsed document."""
    if isinstance(node, dict):
        here = [node[key]] if key in node else []
        return here + [v for child in node.values() for v in _keywords(child, key)]
    if isinstance(node, list):
        return [v for child in node for v in _keywords(child, key)]
    return []


def test_no_keyword_a_crd_rejects() -> None:
    """The mapping is one-way on purpose: apiextensions/v1 rejects these in a CRD schema."""
    for path in CRDS.glob("*.yaml"):
        schema = crd_schema(yaml.safe_load(path.read_text()))
        assert False not in _keywords(schema, "additionalProperties"), path.name
        assert _keywords(schema, "readOnly") == [], path.name
        assert not any(isinstance(t, list) for t in _keywords(schema, "type")), path.name


def test_the_vllm_adapter_has_status_subresource_for_read_only_status() -> None:
    (version,) = load_crd("rackai.rackspace.com_loraadapters.yaml")["spec"]["versions"]
    assert version["subresources"]["status"] == {}


# --- mutation cases: the checker must report each deletion -------------------------------

VLLM_CRD = "rackai.rackspace.com_loraadapters.yaml"
SGLANG_CRD = "inference.rackai.rackspace.com_loraadapters.yaml"


def _props(schema: Schema, *names: str) -> Schema:
    node = schema
    for name in names:
        node = node["items"] if name == "[]" else node["properties"][name]
    return node


def _drop(*names: str, key: str) -> Callable[[Schema], None]:
    return lambda s: _props(s, *names).pop(key)


def _drop_enum_value(s: Schema) -> None:
    _props(s, "status", "phase")["enum"].remove("Failed")


def _drop_required(s: Schema) -> None:
    _props(s, "spec")["required"].remove("model")


def _drop_property(s: Schema) -> None:
    del _props(s, "status")["properties"]["uploadComplete"]


def _widen_enum(s: Schema) -> None:
    _props(s, "status", "conditions", "[]", "status")["enum"].append("Maybe")


def _change_int_or_string_branch(s: Schema) -> None:
    _props(s, "status", "size")["anyOf"][0] = {"type": "number"}


MUTATIONS: list[tuple[str, str, Callable[[Schema], None], str]] = [
    (SGLANG_CRD, "pattern", _drop("spec", "name", key="pattern"), ".spec.properties.name.pattern"),
    (VLLM_CRD, "enum value", _drop_enum_value, "'Failed'"),
    (VLLM_CRD, "required entry", _drop_required, "missing 'model'"),
    (
        VLLM_CRD,
        "CEL rule",
        _drop("spec", "integrity", key="x-kubernetes-validations"),
        "x-kubernetes-validations",
    ),
    (
        VLLM_CRD,
        "list-type",
        _drop("status", "usedBy", key="x-kubernetes-list-type"),
        "usedBy.x-kubernetes-list-type",
    ),
    (
        VLLM_CRD,
        "list-map-keys",
        _drop("status", "conditions", key="x-kubernetes-list-map-keys"),
        "x-kubernetes-list-map-keys",
    ),
    (VLLM_CRD, "maxLength", _drop("spec", "description", key="maxLength"), "description.maxLength"),
    (
        VLLM_CRD,
        "int-or-string",
        _drop("status", "size", key="x-kubernetes-int-or-string"),
        "x-kubernetes-int-or-string",
    ),
    (VLLM_CRD, "anyOf branch", _change_int_or_string_branch, "anyOf[0].type"),
    (VLLM_CRD, "format", _drop("status", "files", "[]", "size", key="format"), "size.format"),
    (
        VLLM_CRD,
        "minimum",
        _drop("status", "conditions", "[]", "observedGeneration", key="minimum"),
        "observedGeneration.minimum",
    ),
    (VLLM_CRD, "property", _drop_property, "uploadComplete: missing property"),
    (VLLM_CRD, "widened enum", _widen_enum, "extra 'Maybe'"),
    (SGLANG_CRD, "nullable", _drop("status", "loadedPath", key="nullable"), "loadedPath.nullable"),
    (SGLANG_CRD, "minLength", _drop("spec", "path", key="minLength"), "path.minLength"),
    (
        SGLANG_CRD,
        "description",
        _drop("spec", "inferenceServiceRef", key="description"),
        "inferenceServiceRef.description",
    ),
]


@pytest.mark.parametrize(
    ("file_name", "mutate", "expected"),
    [pytest.param(f, m, e, id=label) for f, label, m, e in MUTATIONS],
)
def test_checker_reports_mutation(file_name: str, mutate: Callable[[Schema], None], expected: str) -> None:
    schema = copy.deepcopy(crd_schema(load_crd(file_name)))
    mutate(schema)
    problems = check(seed_schemas()[file_name], schema)
    assert any(expected in p for p in problems), problems
