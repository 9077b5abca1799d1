"""events.records: what a record accepts, what it rejects (with the path), how it writes back.

The last tests hold the records to their own JSON Schemas: for every catalog payload and a set
of mutated inputs, `parse` and a real JSON Schema validator (jsonschema) give the same verdict.
"""

from __future__ import annotations

import copy
import json
from typing import Any, ClassVar, Literal

import jsonschema
import pytest

from events import catalog
from events.json_schema import json_schema
from events.records import Invalid, Record, field, to_camel


class Leaf(Record):
    name: str = field(min_length=1, max_length=5, pattern=r"^[a-z]+$")


class Tree(Record):
    """A record with one field of every supported kind."""

    count: int = field(ge=0, le=10)
    ratio: float = field(default=1.0, gt=0)
    flag: bool = False
    mode: Literal["a", "b"] = "a"
    size: int | str | None = None
    leaf: Leaf | None = None
    leaves: list[Leaf] = field(default_factory=list)
    labels: dict[str, str] | None = None
    anything: Any = None
    renamed: str | None = field(default=None, alias="newName")


class Hashable(Record):
    hashable = True
    value: str


class Wire(Record):
    extra = "allow"
    wire_names = to_camel
    omit_empty = True
    always_emit: ClassVar[frozenset[str]] = frozenset({"message"})

    observed_generation: int | None = None
    message: str = ""
    tags: list[str] | None = None


class Node(Record):
    name: str
    children: list[Node] = field(default_factory=list)


def problems(model: type[Record], data: Any) -> list[tuple[tuple[str | int, ...], str]]:
    with pytest.raises(Invalid) as caught:
        model.parse(data)
    return caught.value.problems


def test_parse_builds_nested_records_and_defaults() -> None:
    tree = Tree.parse({"count": 3, "leaf": {"name": "ab"}, "leaves": [{"name": "c"}], "newName": "x"})
    assert tree.leaf == Leaf(name="ab")
    assert tree.leaves == [Leaf(name="c")]
    assert (tree.ratio, tree.flag, tree.mode, tree.renamed) == (1.0, False, "a", "x")
    assert Tree.parse({"count": 3, "renamed": "x"}).renamed == "x"  # the Python name is accepted too


def test_a_record_may_nest_itself() -> None:
    tree = Node.parse({"name": "a", "children": [{"name": "b", "children": [{"name": "c"}]}]})
    assert tree.children[0].children[0] == Node(name="c")
    assert problems(Node, {"name": "a", "children": [{"children": []}]}) == [
        (("children", 0, "name"), "Field required")
    ]
    assert json_schema(Node)["$defs"]["Node"]["properties"]["children"]["items"] == {"$ref": "#/$defs/Node"}


def test_every_problem_is_reported_with_its_path() -> None:
    found = problems(
        Tree, {"leaf": {"name": "UPPER"}, "leaves": [{"name": "ok"}, {}], "mode": "c", "extra": 1}
    )
    assert sorted(found, key=str) == sorted(
        [
            (("count",), "Field required"),
            (("mode",), "Input should be 'a' or 'b'"),
            (("leaf", "name"), "String should match pattern '^[a-z]+$'"),
            (("leaves", 1, "name"), "Field required"),
            (("extra",), "Extra inputs are not permitted"),
        ],
        key=str,
    )
    assert "leaves.1.name: Field required" in str(Invalid(found))


@pytest.mark.parametrize(
    ("data", "where"),
    [
        ({"count": "1"}, ("count",)),  # JSON has types: a string is not an int
        ({"count": True}, ("count",)),  # nor is a boolean
        ({"count": 1.5}, ("count",)),
        ({"count": 1, "flag": 1}, ("flag",)),
        ({"count": 1, "ratio": "2"}, ("ratio",)),
        ({"count": 1, "size": 1.5}, ("size",)),
        ({"count": 1, "labels": {"a": 1}}, ("labels", "a")),
        ({"count": 1, "labels": ["a"]}, ("labels",)),
        ({"count": 1, "leaves": {"name": "a"}}, ("leaves",)),
        ({"count": 1, "leaf": "a"}, ("leaf",)),
    ],
)
def test_types_are_strict(data: dict[str, Any], where: tuple[str, ...]) -> None:
    assert [loc for loc, _ in problems(Tree, data)] == [where]


def test_lenient_where_json_is() -> None:
    tree = Tree.parse({"count": 2.0, "ratio": 2, "size": "1Gi"})
    assert (tree.count, type(tree.count), tree.ratio, tree.size) == (2, int, 2, "1Gi")
    assert Tree.parse({"count": 1, "size": 7}).size == 7
    assert problems(Tree, {"count": 1, "size": []}) == [
        (("size",), "Input should be a valid integer or a valid string")
    ]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"count": -1}, "Input should be greater than or equal to 0"),
        ({"count": 11}, "Input should be less than or equal to 10"),
        ({"count": 1, "ratio": 0}, "Input should be greater than 0"),
        ({"count": 1, "leaf": {"name": ""}}, "Value should have at least 1 characters"),
        ({"count": 1, "leaf": {"name": "abcdef"}}, "Value should have at most 5 characters"),
        # `$` is the end of the text, as in JSON Schema and the apiserver's RE2, not before "\n"
        ({"count": 1, "leaf": {"name": "abc\n"}}, "String should match pattern '^[a-z]+$'"),
    ],
)
def test_constraints(data: dict[str, Any], message: str) -> None:
    assert [m for _, m in problems(Tree, data)] == [message]


def test_construction_validates_like_parse() -> None:
    with pytest.raises(Invalid, match="count: Input should be greater than or equal to 0"):
        Tree(count=-1)
    tree = Tree(count=1)
    with pytest.raises(Invalid, match="mode"):
        tree.replace(mode="z")
    assert tree.replace(count=2) == Tree(count=2) != tree


def test_records_are_immutable_values() -> None:
    value = Hashable(value="x")
    with pytest.raises(AttributeError, match="immutable"):
        value.value = "y"
    with pytest.raises(AttributeError, match="immutable"):
        Tree(count=1).count = 2
    assert {value, Hashable(value="x")} == {value}
    with pytest.raises(TypeError):
        hash(Tree(count=1))


def test_wire_rules_round_trip_unknown_fields_and_omit_empty() -> None:
    obj = {"observedGeneration": 2, "tags": [], "unknown": {"emptyDir": {}}, "blank": ""}
    wire = Wire.parse(obj)
    assert wire.observed_generation == 2
    # modelled empties are omitted (`tags`), `message` is always written, unknowns are verbatim
    assert wire.to_json() == {
        "observedGeneration": 2,
        "message": "",
        "unknown": {"emptyDir": {}},
        "blank": "",
    }
    assert Wire.parse(wire.to_json()) == wire.replace(tags=None)
    assert wire.replace(message="m").to_json()["unknown"] == {"emptyDir": {}}


def test_to_json_omits_none_but_keeps_empty_lists_of_payloads() -> None:
    tree = Tree(count=1, leaves=[Leaf(name="a")], renamed="r")
    assert tree.to_json() == {
        "count": 1,
        "ratio": 1.0,
        "flag": False,
        "mode": "a",
        "leaves": [{"name": "a"}],
        "newName": "r",
    }
    assert Tree(count=1).to_json()["leaves"] == []


def test_json_schema_layout() -> None:
    schema = json_schema(Tree)
    assert schema["required"] == ["count"]
    assert schema["additionalProperties"] is False
    assert schema["description"] == "A record with one field of every supported kind."
    props = schema["properties"]
    assert props["count"] == {"maximum": 10, "minimum": 0, "title": "Count", "type": "integer"}
    assert props["leaf"] == {
        "anyOf": [{"$ref": "#/$defs/Leaf"}, {"type": "null"}],
        "default": None,
        "title": "Leaf",
    }
    assert props["leaves"] == {"items": {"$ref": "#/$defs/Leaf"}, "title": "Leaves", "type": "array"}
    assert props["size"]["anyOf"] == [{"type": "integer"}, {"type": "string"}, {"type": "null"}]
    assert props["mode"] == {"default": "a", "enum": ["a", "b"], "title": "Mode", "type": "string"}
    assert "newName" in props and "renamed" not in props
    assert schema["$defs"]["Leaf"]["properties"]["name"]["pattern"] == "^[a-z]+$"


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
def test_parse_agrees_with_its_json_schema(entry: catalog.EventType) -> None:
    validator = jsonschema.Draft202012Validator(json_schema(entry.payload))
    data = catalog.sample(entry).get("data")
    samples = mutations(data if isinstance(data, dict) else {})
    for candidate in samples:
        by_schema = validator.is_valid(candidate)
        try:
            entry.payload.parse(copy.deepcopy(candidate))
            by_record = True
        except Invalid:
            by_record = False
        assert by_record == by_schema, json.dumps(candidate)
    assert any(validator.is_valid(c) for c in samples) and not all(validator.is_valid(c) for c in samples)
