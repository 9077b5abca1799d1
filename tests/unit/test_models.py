"""The two model bases, held to their house rules with real objects and payloads.

Payloads (events.domain.Payload): frozen, an unknown key is an error, camelCase on the wire,
JSON's types taken strictly; `parse` and a JSON Schema validator (jsonschema) give the same
verdict on every catalog payload and mutations of it.
Resources (functions.resources.wire.WireModel): strict as the API server, unknown fields kept
and written back verbatim, `to_wire()` applying omitempty to modelled fields (the seed's
omitzero note for `tags` included), `message` of a Condition always written.
Validation errors become 400 messages that name the field, bounded (functions.errors.problems).
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from pydantic import ValidationError

from events import catalog
from events.domain import AdapterLoaded, AdapterRef, AdapterUnloaded, FileChanged, PodFailure
from functions.errors import SHOWN_PROBLEMS, problems
from functions.resources import inference, rackai

ROOT = Path(__file__).resolve().parents[2]
REF = {"apiVersion": "rackai.rackspace.com/v1alpha1", "namespace": "team-a", "name": "finance"}


def locations(model: type[Any], data: Any) -> list[tuple[str | int, ...]]:
    with pytest.raises(ValidationError) as caught:
        model.model_validate(data)
    return [e["loc"] for e in caught.value.errors()]


# -- payloads ---------------------------------------------------------------------------------------
def test_payloads_take_camel_case_and_python_names_and_write_camel_case() -> None:
    by_wire = AdapterRef.model_validate(REF)
    by_name = AdapterRef(api_version="rackai.rackspace.com/v1alpha1", namespace="team-a", name="finance")
    assert by_wire == by_name
    assert by_name.model_dump(mode="json") == REF
    changed = FileChanged.model_validate(
        {"path": "/loraadapters/a/b/c/x", "eventType": "rename", "newPath": "/loraadapters/a/b/c/y"}
    )
    assert changed.model_dump(mode="json", exclude_none=True) == {
        "path": "/loraadapters/a/b/c/x",
        "eventType": "rename",
        "newPath": "/loraadapters/a/b/c/y",
    }


@pytest.mark.parametrize(
    ("model", "data", "where"),
    [
        (AdapterUnloaded, {"adapter": REF, "pods": [], "finalized": 1}, ("finalized",)),  # 1 is not true
        (AdapterUnloaded, {"adapter": REF, "pods": [], "finalized": "true"}, ("finalized",)),
        (FileChanged, {"path": "/loraadapters/x", "eventType": "create", "size": "3"}, ("size",)),  # "3" != 3
        (FileChanged, {"path": "/loraadapters/x", "eventType": "create", "size": True}, ("size",)),
        (FileChanged, {"path": "/loraadapters/x", "eventType": "create", "size": 3.0}, ("size",)),
        (AdapterLoaded, {"adapter": REF, "pods": "p-1"}, ("pods",)),  # a string is not a list
        (AdapterLoaded, {"adapter": REF, "pods": [1]}, ("pods", 0)),
        (AdapterLoaded, {"adapter": {**REF, "namespace": "Team_A"}, "pods": []}, ("adapter", "namespace")),
        (AdapterLoaded, {"adapter": REF, "pods": [], "failed": [{"pod": "p"}]}, ("failed", 0, "reason")),
        (AdapterRef, {**REF, "nmae": "typo"}, ("nmae",)),  # an unknown key is an error
    ],
)
def test_payload_types_are_strict(model: type[Any], data: dict[str, Any], where: tuple[Any, ...]) -> None:
    assert where in locations(model, data)


def test_a_final_dollar_is_the_end_of_the_text() -> None:
    """As in JSON Schema and the apiserver's RE2 (pydantic's Rust regex), not before a newline."""
    assert ("name",) in locations(AdapterRef, {**REF, "name": "finance\n"})


def test_payloads_are_immutable_and_hashable_values() -> None:
    ref = AdapterRef.model_validate(REF)
    with pytest.raises(ValidationError, match="frozen"):
        ref.name = "other"  # type: ignore[misc]
    assert {ref, AdapterRef.model_validate(REF)} == {ref}
    changed = ref.model_copy(update={"name": "other"})
    assert (changed.name, ref.name) == ("other", "finance")


def test_wire_form_drops_none_and_keeps_empty_lists() -> None:
    """What a step replies with (functions.edge.messages.reply): an unset optional is absent, `failed: []`
    is there, as the committed samples show."""
    loaded = AdapterLoaded(adapter=AdapterRef.model_validate(REF), pods=["p-1"])
    assert loaded.model_dump(mode="json", exclude_none=True) == {
        "adapter": REF,
        "pods": ["p-1"],
        "failed": [],
    }
    failure = PodFailure(pod="p-2", reason="EngineTimeout", message="")
    assert failure.model_dump(mode="json", exclude_none=True)["message"] == ""


def mutations(data: dict[str, Any]) -> list[Any]:
    """The sample itself and variations of it, valid or not: each key dropped, retyped,
    emptied; an unknown key; nested objects mutated the same way."""
    out: list[Any] = [data, [], "x", None]
    for key, value in data.items():
        dropped = {k: v for k, v in data.items() if k != key}
        out.append(dropped)
        for replacement in (None, "1", 1, -1, 1.5, True, "", "UPPER\n", [], {}, [value]):
            out.append({**data, key: replacement})
        if isinstance(value, dict):
            out.extend({**data, key: inner} for inner in mutations(value)[4:])
    out.append({**data, "unknownKey": 1})
    return out


@pytest.mark.parametrize("entry", catalog.CATALOG, ids=lambda e: e.type)
def test_models_agree_with_their_json_schema(entry: catalog.EventType) -> None:
    validator = jsonschema.Draft202012Validator(entry.schema())
    data = catalog.sample(entry).get("data")
    samples = mutations(data if isinstance(data, dict) else {})
    for candidate in samples:
        by_schema = validator.is_valid(candidate)
        try:
            entry.payload.model_validate(copy.deepcopy(candidate))
            by_model = True
        except ValidationError:
            by_model = False
        assert by_model == by_schema, json.dumps(candidate)
    assert any(validator.is_valid(c) for c in samples) and not all(validator.is_valid(c) for c in samples)


def test_events_import_without_functions_or_anything_heavy() -> None:
    """A platform team imports our payloads: pydantic and the standard library, nothing else."""
    script = textwrap.dedent(
        """
        import json, sys, sysconfig
        before = set(sys.modules)
        import events.catalog, events.domain, events.external
        from events.domain import AdapterReady
        AdapterReady.model_validate(
            {"adapter": {"apiVersion": "rackai.rackspace.com/v1alpha1", "namespace": "a", "name": "b"}}
        )
        events.catalog.CATALOG[0].schema()
        sites = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
        tops = {m.split(".")[0] for m in set(sys.modules) - before}
        installed = {
            t for t in tops if any(str(getattr(sys.modules[t], "__file__", "")).startswith(s) for s in sites)
        }
        print(json.dumps({"all": sorted(tops), "installed": sorted(installed)}))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
    )
    imported = json.loads(done.stdout)
    assert "events" in imported["all"] and "pydantic" in imported["installed"]
    assert set(imported["installed"]) <= {
        "pydantic",
        "pydantic_core",
        "typing_extensions",
        "annotated_types",
        "typing_inspection",
    }
    for heavy in ("functions", "devstack", "loraflow", "flask", "httpx", "cloudevents", "yaml"):
        assert heavy not in imported["all"], heavy


# -- 400 messages -----------------------------------------------------------------------------------
def test_problems_name_each_field_and_no_value() -> None:
    with pytest.raises(ValidationError) as caught:
        AdapterLoaded.model_validate({"adapter": {**REF, "namespace": "SECRET_Ns"}, "pods": [7]})
    message = problems(caught.value)
    assert "adapter.namespace: String should match pattern" in message
    assert "pods.0: Input should be a valid string" in message
    assert "SECRET" not in message and "https://" not in message


def test_problems_are_bounded() -> None:
    """A hostile sender learns which fields, not a flood: the first few, a count, keys cut short."""
    flood = {**REF, **{f"unknown{i}": i for i in range(50)}, "k" * 10_000: 1}
    with pytest.raises(ValidationError) as caught:
        AdapterRef.model_validate(flood)
    message = problems(caught.value)
    assert message.count("Extra inputs are not permitted") == SHOWN_PROBLEMS
    assert message.endswith(f"(and {51 - SHOWN_PROBLEMS} more)")
    assert "unknown0: Extra inputs are not permitted" in message
    with pytest.raises(ValidationError) as caught:
        AdapterRef.model_validate({**REF, "k" * 10_000: 1})
    assert len(problems(caught.value)) < 200


# -- resources --------------------------------------------------------------------------------------
def adapter(**status: Any) -> dict[str, Any]:
    return {
        "apiVersion": rackai.API_VERSION,
        "kind": "LoRAAdapter",
        "metadata": {"name": "finance", "namespace": "team-a"},
        "spec": {"model": "llama3-8b"},
        **({"status": status} if status else {}),
    }


@pytest.mark.parametrize(
    ("model", "obj", "where"),
    [
        (rackai.ModelDeployment, {"spec": {"model": "m", "replicas": "3"}}, ("spec", "replicas")),  # "3" != 3
        (rackai.ModelDeployment, {"spec": {"model": "m", "replicas": 3.0}}, ("spec", "replicas")),
        (rackai.ModelDeployment, {"spec": {"model": "m", "replicas": True}}, ("spec", "replicas")),
        (rackai.ModelDeployment, {"spec": {"model": "m", "replicas": -1}}, ("spec", "replicas")),
        (rackai.ModelDeployment, {"spec": {"model": ""}}, ("spec", "model")),
        (rackai.LoRAAdapter, adapter(ready=1), ("status", "ready")),  # 1 is not true
        (rackai.LoRAAdapter, adapter(phase="Done"), ("status", "phase")),
        (rackai.LoRAAdapter, adapter(files=[{"path": "/x", "size": "1"}]), ("status", "files", 0, "size")),
        (rackai.LoRAAdapter, {**adapter(), "metadata": {"labels": {"a": 1}}}, ("metadata", "labels", "a")),
        (inference.InferenceService, {"spec": {"runtime": "onnx"}}, ("spec", "runtime")),
    ],
)
def test_resources_are_strict_as_the_api_server(
    model: type[Any], obj: dict[str, Any], where: tuple[Any, ...]
) -> None:
    assert where in locations(model, obj)


@pytest.mark.parametrize("size", [0, 1073741824, "1Gi", "953Mi", "1.5G", "12e3", "0"])
def test_a_quantity_is_an_int_or_a_quantity_string(size: int | str) -> None:
    assert rackai.LoRAAdapter.model_validate(adapter(size=size)).to_wire()["status"]["size"] == size


@pytest.mark.parametrize("size", ["lots", "1 Gi", "1GiB", 1.5, True, ""])
def test_a_quantity_refuses_what_the_api_server_refuses(size: Any) -> None:
    assert any(loc[:2] == ("status", "size") for loc in locations(rackai.LoRAAdapter, adapter(size=size)))


def test_unknown_fields_round_trip_verbatim_at_every_level() -> None:
    obj = adapter(phase="Ready", addedByAnotherController={"x": ""})
    obj["metadata"] |= {
        "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {".": {}, "f:model": {}}}}],
        "ownerReferences": [],
        "labels": {"empty-value": ""},
    }
    obj["spec"]["futureField"] = {"emptyDir": {}}
    obj["selfLink"] = None
    parsed = rackai.LoRAAdapter.model_validate(copy.deepcopy(obj))
    assert parsed.to_wire() == obj
    moved = parsed.model_copy(
        update={"status": parsed.status.model_copy(update={"phase": "Failed"}) if parsed.status else None}
    )
    wire = moved.to_wire()
    assert wire["status"] == {"phase": "Failed", "addedByAnotherController": {"x": ""}}
    assert wire["spec"]["futureField"] == {"emptyDir": {}} and wire["selfLink"] is None
    assert wire["metadata"]["managedFields"] == obj["metadata"]["managedFields"]


def test_omitempty_drops_empty_modelled_fields_and_keeps_false_and_zero() -> None:
    status = rackai.LoRAAdapterStatus(
        conditions=[],
        files=None,
        integrity=rackai.IntegrityStatus(files=None),  # serialises to {}: omitted too
        observed_generation=0,
        phase=None,
        ready=False,
        size=0,
        storage_ref=rackai.StorageRef(path=""),
        upload_complete=False,
        used_by=[],
    )
    assert status.to_wire() == {"observedGeneration": 0, "ready": False, "size": 0, "uploadComplete": False}
    files = rackai.IntegrityStatus(
        files={"/a": rackai.FileStatus(md5=None, size=0), "/b": rackai.FileStatus()}
    )
    assert files.to_wire() == {"files": {"/a": {"size": 0}, "/b": {}}}  # map values are kept


def test_tags_follow_omitempty_where_the_seed_says_omitzero() -> None:
    """The seed writes `tags` with Go's omitzero (an empty, non-nil slice would be sent as []) and
    allows omitempty for consistency: like every other field, [] is omitted."""
    for model, spec in ((rackai.LoRAAdapter, {"model": "m"}), (rackai.Model, {})):
        obj = {"metadata": {"name": "x"}, "spec": spec}
        assert "tags" not in model.model_validate({**obj, "spec": {**spec, "tags": []}}).to_wire().get(
            "spec", {}
        )
        assert "tags" not in model.model_validate(obj).to_wire().get("spec", {})
        kept = model.model_validate({**obj, "spec": {**spec, "tags": ["finance"]}}).to_wire()
        assert kept["spec"]["tags"] == ["finance"]


def test_resources_are_immutable() -> None:
    parsed = rackai.LoRAAdapter.model_validate(adapter())
    with pytest.raises(ValidationError, match="frozen"):
        parsed.spec = parsed.spec  # type: ignore[misc]


def test_a_copy_refuses_names_that_are_not_fields() -> None:
    """pydantic itself would keep `storageRef` as an unknown field beside `storage_ref` (both
    written), and drop a payload's typo without a word."""
    status = rackai.LoRAAdapterStatus()
    with pytest.raises(TypeError, match="'storageRef'"):
        status.model_copy(update={"storageRef": rackai.StorageRef(path="/x")})
    with pytest.raises(TypeError, match="'nmae'"):
        AdapterRef.model_validate(REF).model_copy(update={"nmae": "other"})
    moved = status.model_copy(update={"storage_ref": rackai.StorageRef(path="/x")})
    assert moved.to_wire() == {"storageRef": {"path": "/x"}}
