"""Bad input, property-based: malformed CloudEvents posted to every function over real HTTP.

Whatever arrives (missing or ill-typed attributes, a wrong specversion, unknown types, data of
the wrong shape, invalid UTF-8, huge bodies, traversal in paths, names that are not DNS
labels, raw garbage), a function answers 400 with a message naming the problem (401 for the
webhook without its token), never 5xx (the Broker would redeliver garbage forever), and writes
nothing anywhere: the functions' writes in the API server's audit log, the filer's request
count, the engines' load/unload counters and the Broker sink are compared before and after
every example (once per example, not per request: the audit log is read once it settles).
"""

from __future__ import annotations

import contextlib
import copy
import json
import string
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from events.catalog import BY_TYPE, sample
from events.domain import ADAPTER_DRIFTED, FILE_CHANGED, RESYNC_SHARD, STEP_EXTENSION
from events.external import API_TYPES, AWS_SQS, PING
from functions import admit, ingest, load, reload, resync, stat, unload, verify
from functions.edge.messages import MAX_BODY_BYTES
from tests.support.testbed import Testbed

ACCEPTS: dict[str, tuple[str, ...]] = {
    "admit": admit.ACCEPTS,
    "stat": stat.ACCEPTS,
    "verify": verify.ACCEPTS,
    "load": load.ACCEPTS,
    "reload": reload.ACCEPTS,
    "unload": unload.ACCEPTS,
    "resync": resync.ACCEPTS,
    "ingest": ingest.ACCEPTS,
}
FUNCTIONS = tuple(ACCEPTS)
KUBE_WRITES = ("create", "update", "patch", "delete", "deletecollection")
ALL_TYPES = sorted({t for types in ACCEPTS.values() for t in types} | set(BY_TYPE))
PROPERTY = settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
POSTED: list[str] = []
"""What the running example has posted: named when the example turns out to have written."""


# -- what "no write anywhere" means ----------------------------------------------------------------
@dataclass(frozen=True)
class Writes:
    kube: int
    filer: int
    engines: int
    published: int


def writes(world: Testbed) -> Writes:
    kube = sum(n for (verb, _), n in world.kube.requests.items() if verb in KUBE_WRITES)
    engines = sum(r.calls.get("load", 0) + r.calls.get("unload", 0) for _, r in world.workload.fleet.items())
    return Writes(kube, world.filer.requests, engines, len(world.sink.events))


def post(world: Testbed, function: str, headers: dict[str, str], body: bytes) -> httpx.Response:
    """Post garbage; a webhook post (ingest, no CloudEvent) carries the filer's token unless the
    test sets its own Authorization."""
    POSTED.append(f"{function} <- headers={headers!r} body={body[:200]!r}")
    webhook = function == "ingest" and "ce-specversion" not in {k.lower() for k in headers}
    if webhook and "authorization" not in {k.lower() for k in headers}:
        headers = {**headers, **world.webhook_auth}
    return world.http.post(world.host.urls[function], headers=headers, content=body)


@contextlib.contextmanager
def nothing_written(world: Testbed) -> Iterator[None]:
    """One example: whatever it posts, no write anywhere from its start to its end."""
    POSTED.clear()
    before = writes(world)
    yield
    after = writes(world)
    assert after == before, f"rejected requests wrote something ({before} -> {after}): {POSTED}"


def expect_rejected(
    world: Testbed,
    function: str,
    headers: dict[str, str],
    body: bytes,
    mentions: tuple[str, ...],
    status: int = 400,
) -> httpx.Response:
    """Post; assert `status` and a message naming one of `mentions` (inside `nothing_written`)."""
    response = post(world, function, headers, body)
    context = (
        f"{function} <- headers={headers!r} body={body[:300]!r}: {response.status_code} {response.text!r}"
    )
    assert response.status_code < 500, context
    assert response.status_code == status, context
    message = response.text.strip()
    assert message, context
    if status == 400:
        assert any(m.lower() in message.lower() for m in mentions), (
            f"message names none of {mentions}: {context}"
        )
    return response


# -- building events -------------------------------------------------------------------------------
def base_attributes(type_: str, function: str | None = None) -> dict[str, Any]:
    """A well-formed structured event of `type_` (the catalog's committed sample); a drift
    nudge is addressed to `function` (load and unload ignore nudges for other steps)."""
    entry = BY_TYPE.get(type_)
    if entry is None:
        return {"specversion": "1.0", "id": "x-1", "source": "/tests", "type": type_, "data": {}}
    event = copy.deepcopy(sample(entry))
    if type_ == ADAPTER_DRIFTED and function in ("admit", "stat", "load", "unload"):
        event[STEP_EXTENSION] = function
        event["data"]["step"] = function
    return event


def structured(event: dict[str, Any]) -> tuple[dict[str, str], bytes]:
    return {"content-type": "application/cloudevents+json"}, json.dumps(event).encode()


def binary(event: dict[str, Any]) -> tuple[dict[str, str], bytes]:
    headers = {f"ce-{k}": str(v) for k, v in event.items() if k not in ("data", "datacontenttype")}
    headers["content-type"] = str(event.get("datacontenttype") or "application/json")
    return headers, json.dumps(event.get("data")).encode() if "data" in event else b""


def encode(event: dict[str, Any], mode: str) -> tuple[dict[str, str], bytes]:
    return structured(event) if mode == "structured" else binary(event)


modes = st.sampled_from(("binary", "structured"))
json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
not_strings = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.lists(json_scalars, max_size=3)
    | st.dictionaries(st.text(max_size=5), json_scalars, max_size=3)
)
header_safe = st.text(alphabet=string.ascii_letters + string.digits + "-._~:/ ", max_size=30).map(str.strip)


# -- 1. attributes ---------------------------------------------------------------------------------
@PROPERTY
@given(
    attribute=st.sampled_from(("id", "source", "type", "specversion")),
    how=st.sampled_from(("missing", "empty", "ill-typed")),
    bad=not_strings,
    mode=modes,
)
def test_missing_empty_or_ill_typed_attributes(
    world: Testbed, attribute: str, how: str, bad: Any, mode: str
) -> None:
    with nothing_written(world):
        assume(not (how == "ill-typed" and mode == "binary"))  # a header is always a string
        for function, types in ACCEPTS.items():
            event = base_attributes(types[0], function)
            if how == "missing":
                event.pop(attribute)
            elif how == "empty":
                event[attribute] = ""
            else:
                event[attribute] = bad
            headers, body = encode(event, mode)
            if function == "ingest" and mode == "binary" and attribute == "specversion" and how == "missing":
                # without ce-specversion this is not a CloudEvent: it is a (malformed) webhook body
                expect_rejected(world, function, headers, body, ("webhook", "notification"))
                continue
            expect_rejected(world, function, headers, body, (attribute, "CloudEvent", "specversion"))


@PROPERTY
@given(version=st.text(max_size=8).filter(lambda v: v.strip() not in ("1.0", "0.3")), mode=modes)
def test_wrong_specversion(world: Testbed, version: str, mode: str) -> None:
    with nothing_written(world):
        for function, types in ACCEPTS.items():
            event = base_attributes(types[0], function)
            event["specversion"] = version
            headers, body = encode(event, mode)
            if mode == "binary":
                header = "".join(c for c in version if c.isascii() and c.isprintable()).strip()
                assume(header not in ("", "1.0", "0.3"))  # an empty header is no header (a webhook)
                headers["ce-specversion"] = header
            expect_rejected(world, function, headers, body, ("specversion", "CloudEvent", "version"))


# -- 2. types ---------------------------------------------------------------------------------------
@PROPERTY
@given(
    # printable ASCII only: a header value with control bytes is refused by httpx before sending
    type_=st.sampled_from(ALL_TYPES)
    | st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=40),
    mode=modes,
)
def test_types_a_function_does_not_subscribe_to(world: Testbed, type_: str, mode: str) -> None:
    with nothing_written(world):
        for function, types in ACCEPTS.items():
            if type_ in types:
                continue
            event = base_attributes(type_)
            event["type"] = type_
            if mode == "binary" and not type_.isascii():
                continue  # headers are latin-1 on the wire; the structured case covers these
            headers, body = encode(event, mode)
            expect_rejected(world, function, headers, body, ("type",))


# -- 3. data of the wrong shape -----------------------------------------------------------------------
def corrupt(data: Any, draw: Any) -> Any:
    """Replace one leaf of a valid payload with a value of another JSON type."""
    paths: list[tuple[Any, ...]] = []

    def walk(value: Any, path: tuple[Any, ...]) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(inner, (*path, key))
        elif isinstance(value, list) and value:
            for index, inner in enumerate(value):
                walk(inner, (*path, index))
        paths.append(path)

    walk(data, ())
    path = draw(st.sampled_from([p for p in paths if p]))
    target = data
    for step in path[:-1]:
        target = target[step]
    old = target[path[-1]]
    target[path[-1]] = draw(
        (st.integers() | st.lists(st.integers(), max_size=2) | st.none()).filter(
            lambda v: type(v) is not type(old) and v != old
        )
        if isinstance(old, str)
        else st.text(alphabet="XYZ!/ ", min_size=1, max_size=6) | st.lists(st.none(), min_size=1, max_size=2)
    )
    return data


def domain_and_api_types() -> list[tuple[str, str]]:
    """(function, type) pairs whose data has a required shape to violate."""
    out = []
    for function, types in ACCEPTS.items():
        for type_ in types:
            if type_ not in (PING, AWS_SQS):
                out.append((function, type_))
    return out


@PROPERTY
@given(
    pair=st.sampled_from(domain_and_api_types()),
    data=st.data(),
    mode=modes,
)
def test_data_of_the_wrong_shape(
    world: Testbed, pair: tuple[str, str], data: st.DataObject, mode: str
) -> None:
    with nothing_written(world):
        function, type_ = pair
        event = base_attributes(type_, function)
        event.pop("subject", None)  # stat would otherwise fall back to the subject's path
        shape = data.draw(st.sampled_from(("garbage", "corrupted")))
        if shape == "garbage":
            event["data"] = data.draw(
                json_values.filter(lambda v: not isinstance(v, dict) or "path" not in v)
            )
        else:
            payload = event["data"]
            if type_ in API_TYPES:
                payload = {
                    "apiVersion": payload["apiVersion"],
                    "kind": payload["kind"],
                    "metadata": payload["metadata"],
                }
                payload["metadata"] = {"name": payload["metadata"]["name"], "namespace": "team-a"}
            if type_ == FILE_CHANGED:
                payload = {"path": payload["path"], "eventType": payload["eventType"]}
            event["data"] = corrupt(payload, data.draw)
            if type_ == FILE_CHANGED and not isinstance(event["data"].get("path"), str):
                event["subject"] = None
                event.pop("subject")
        headers, body = encode(event, mode)
        expect_rejected(
            world, function, headers, body, ("data", "path", "name", "metadata", "field", "adapter", "JSON")
        )


@PROPERTY
@given(
    garbage=json_values.filter(lambda v: v is not None and not isinstance(v, dict))
    | st.text(min_size=1, max_size=30),
    mode=modes,
)
def test_ping_and_sqs_data_of_the_wrong_shape(world: Testbed, garbage: Any, mode: str) -> None:
    with nothing_written(world):
        for function, type_ in (("resync", PING), ("ingest", AWS_SQS)):
            event = base_attributes(type_)
            event["data"] = garbage
            event.pop("key", None)
            event["datacontenttype"] = "application/json"
            if isinstance(garbage, str):
                # a JSON string: ping wants an object; the sqs body must decode to a notification
                # naming a path (none here: no `key` extension and no entry in garbage text)
                assume(garbage.strip() != "")
            headers, body = encode(event, mode)
            expect_rejected(
                world, function, headers, body, ("data", "notification", "JSON", "key", "protobuf")
            )


# -- 4. invalid UTF-8 ------------------------------------------------------------------------------
invalid_utf8 = st.binary(min_size=1, max_size=40).map(lambda b: b + b"\xff\xfe\xc3")


@PROPERTY
@given(junk=invalid_utf8, mode=st.sampled_from(("binary-data", "structured", "webhook")))
def test_invalid_utf8(world: Testbed, junk: bytes, mode: str) -> None:
    with nothing_written(world):
        for function, types in ACCEPTS.items():
            type_ = types[0]
            if mode == "webhook":
                if function != "ingest":
                    continue
                headers, body = (
                    {"content-type": "application/json"},
                    b'{"key": "/loraadapters/' + junk + b'"}',
                )
                expect_rejected(world, function, headers, body, ("webhook", "notification", "utf"))
                continue
            if mode == "structured":
                headers = {"content-type": "application/cloudevents+json"}
                body = (
                    b'{"specversion": "1.0", "id": "'
                    + junk
                    + b'", "source": "/x", "type": "'
                    + type_.encode()
                    + b'"}'
                )
            else:
                event = base_attributes(type_)
                headers, _ = binary(event)
                headers["content-type"] = "application/json"
                body = b'{"adapter": "' + junk + b'"}'
            expect_rejected(world, function, headers, body, ("utf", "JSON", "CloudEvent", "data", "decode"))


# -- 5. huge bodies ----------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["binary", "structured", "webhook"])
def test_huge_bodies(world: Testbed, mode: str) -> None:
    padding = "x" * (MAX_BODY_BYTES + 1024)
    with nothing_written(world):
        for function, types in ACCEPTS.items():
            if mode == "webhook":
                if function != "ingest":
                    continue
                body = json.dumps(
                    {"key": "/loraadapters/a/b/c/f", "event_type": "create", "pad": padding}
                ).encode()
                headers = {"content-type": "application/json"}
            else:
                event = base_attributes(types[0], function)
                event["data"] = {"pad": padding}
                headers, body = encode(event, mode)
            assert len(body) > MAX_BODY_BYTES
            response = expect_rejected(
                world, function, headers, body, ("exceeds", "bytes", "limit"), status=413
            )
            assert str(MAX_BODY_BYTES) in response.text


@pytest.mark.parametrize("mode", ["binary", "structured", "webhook"])
def test_json_nested_deeper_than_the_decoder_allows(world: Testbed, mode: str) -> None:
    """`[[[[...` (200k levels, well under the size limit) once crashed every function with a
    RecursionError in the JSON decoder (500): now it is a 400 like any other garbage."""
    deep = "[" * 200_000
    with nothing_written(world):
        for function, types in ACCEPTS.items():
            if mode == "webhook":
                headers, body = {"content-type": "application/json"}, deep.encode()
            elif mode == "structured":
                headers = {"content-type": "application/cloudevents+json"}
                body = (
                    b'{"specversion": "1.0", "id": "1", "source": "/x", "type": "t", "data": ' + deep.encode()
                )
            else:
                headers, _ = binary(base_attributes(types[0], function))
                headers["content-type"], body = "application/json", deep.encode()
            expect_rejected(
                world, function, headers, body, ("JSON", "CloudEvent", "data", "webhook", "protobuf")
            )


# -- 6. paths ---------------------------------------------------------------------------------------
segment = st.text(alphabet=string.ascii_lowercase + string.digits + "-_.", min_size=1, max_size=8)
evil_segment = st.sampled_from(
    ("..", ".", "", "%2e%2e", "%2E%2e", "%2e", "..%2f..", "%2f", "%5c..", "a\x00b", "%00", "..%5c..")
)


@st.composite
def traversal_paths(draw: Any) -> str:
    """A path that is not a normalised absolute path (some segment is `..`, `.`, `%2e%2e`, NUL...)."""
    parts = draw(st.lists(segment, max_size=5))
    position = draw(st.integers(0, len(parts)))
    parts.insert(position, draw(evil_segment))
    prefix = draw(st.sampled_from(("/loraadapters/", "/", "", "/loraadapters/ns/m/a/")))
    path = prefix + "/".join(parts)
    assume(not _normalised(path))
    return path


def _normalised(path: str) -> bool:
    import posixpath

    lowered = path.lower()
    return (
        path.startswith("/")
        and "\x00" not in path
        and not any(code in lowered for code in ("%2e", "%2f", "%5c", "%00"))
        and posixpath.normpath(path) == path
    )


outside_root = st.builds(
    lambda root, rest: "/" + "/".join([root, *rest]),
    st.sampled_from(("etc", "loraadapters2", "loraadaptersX", "tmp", "buckets", "LoRAadapters")),
    st.lists(
        st.text(alphabet=string.ascii_lowercase + string.digits + "-_", min_size=1, max_size=8), max_size=4
    ),
)


def file_changed_event(path: str, subject: str | None) -> dict[str, Any]:
    event = base_attributes(FILE_CHANGED)
    event["data"] = {"path": path, "eventType": "create"}
    if subject is None:
        event.pop("subject", None)
    else:
        event["subject"] = subject
    return event


def seaweed_webhook(key: str) -> dict[str, Any]:
    parent, _, name = key.rpartition("/")
    return {
        "key": key,
        "event_type": "create",
        "message": {
            "new_entry": {"name": name or "f", "attributes": {"file_size": 1}},
            "new_parent_path": parent or "/",
        },
    }


@PROPERTY
@given(path=traversal_paths(), mode=modes, as_subject=st.booleans())
def test_traversal_paths_are_rejected(world: Testbed, path: str, mode: str, as_subject: bool) -> None:
    with nothing_written(world):
        encode_mode = "structured" if "\x00" in path else mode
        # stat: file.changed naming the path in data (and/or subject)
        event = file_changed_event(path, path if as_subject else None)
        if as_subject:
            event["data"] = {"eventType": "create"}
        headers, body = encode(event, encode_mode)
        expect_rejected(world, "stat", headers, body, ("path",))
        # ingest: the webhook's key, and the aws-sqs `key` extension
        hook = json.dumps(seaweed_webhook(path)).encode()
        expect_rejected(
            world, "ingest", {"content-type": "application/json"}, hook, ("path", "key", "notification")
        )


@PROPERTY
@given(path=outside_root, mode=modes)
def test_paths_outside_the_storage_root(world: Testbed, path: str, mode: str) -> None:
    with nothing_written(world):
        headers, body = encode(file_changed_event(path, path), mode)
        expect_rejected(world, "stat", headers, body, ("path", "/loraadapters"))
        # ingest: a well-formed notification about elsewhere is not malformed (the filer notifies
        # about everything): 204, and still nothing written or published
        response = post(
            world, "ingest", {"content-type": "application/json"}, json.dumps(seaweed_webhook(path)).encode()
        )
        assert response.status_code == 204, (path, response.status_code, response.text)


# -- 7. names that are not DNS labels ------------------------------------------------------------------
bad_labels = st.one_of(
    st.text(alphabet=string.ascii_lowercase, min_size=1, max_size=10).map(str.upper),
    st.text(alphabet=string.ascii_lowercase, min_size=64, max_size=80),
    st.builds(lambda a, b: f"{a}/{b}", segment, segment),
    st.builds(lambda a, b: f"{a}.{b}", st.sampled_from(("a", "ns")), st.sampled_from(("b", "x"))),
    st.sampled_from(("", "-a", "a-", "..", ".", "a\n", "a b", "ä", "a_b", "%2e%2e", "a\x00", "../etc")),
)
bad_subdomains = st.one_of(
    st.text(alphabet=string.ascii_lowercase, min_size=1, max_size=10).map(str.upper),
    st.text(alphabet=string.ascii_lowercase, min_size=254, max_size=260),
    st.builds(lambda a, b: f"{a}/{b}", segment, segment),
    st.sampled_from(
        ("", "-a", "a-", "..", ".", "a..b", ".a", "a.", "a\n", "a b", "ä", "a_b", "%2e%2e", "../x")
    ),
)


@PROPERTY
@given(
    which=st.sampled_from(("namespace", "name")),
    data=st.data(),
    mode=modes,
)
def test_names_that_are_not_dns_labels(world: Testbed, which: str, data: st.DataObject, mode: str) -> None:
    with nothing_written(world):
        value = data.draw(bad_labels if which == "namespace" else bad_subdomains)
        encode_mode = "structured" if not value.isprintable() or not value.isascii() else mode
        for function, types in ACCEPTS.items():
            for type_ in types:
                if type_ in (PING, AWS_SQS, FILE_CHANGED):
                    continue
                event = base_attributes(type_, function)
                event.pop("subject", None)
                if type_ == RESYNC_SHARD:  # a tick's part names namespaces only
                    if which != "namespace":
                        continue
                    event["data"]["namespaces"] = ["team-a", value]
                elif type_ in API_TYPES:
                    event["data"]["metadata"][which] = value
                    event.pop(which, None)  # the extension (a header) may not carry it either
                else:
                    event["data"]["adapter"][which] = value
                headers, body = encode(event, encode_mode)
                expect_rejected(world, function, headers, body, (which,))


# -- 8. raw garbage ----------------------------------------------------------------------------------
header_names = st.text(alphabet=string.ascii_lowercase + "-", min_size=1, max_size=15).filter(
    lambda n: (
        n not in ("host", "content-length", "transfer-encoding", "connection", "expect", "authorization")
        and not n.startswith("-")
    )
)


@PROPERTY
@given(
    body=st.binary(max_size=300) | st.text(max_size=100).map(str.encode),
    headers=st.dictionaries(header_names, header_safe, max_size=5),
    content_type=st.sampled_from(
        (
            None,
            "application/json",
            "application/cloudevents+json",
            "application/cloudevents-batch+json",
            "text/plain",
            "application/octet-stream",
        )
    ),
)
def test_raw_garbage(world: Testbed, body: bytes, headers: dict[str, str], content_type: str | None) -> None:
    with nothing_written(world):
        if content_type is not None:
            headers = {**headers, "content-type": content_type}
        for function in FUNCTIONS:
            response = post(world, function, headers, body)
            context = f"{function} <- {headers!r} {body[:200]!r}: {response.status_code} {response.text!r}"
            assert response.status_code == 400, context
            assert response.text.strip(), context


@PROPERTY
@given(
    body=st.binary(max_size=200),
    token=st.none() | st.text(alphabet=string.ascii_letters + string.digits, min_size=1, max_size=40),
    scheme=st.sampled_from(("Bearer ", "bearer ", "Basic ", "", "Bearer  ")),
)
def test_webhook_without_the_token_is_401(
    world: Testbed, body: bytes, token: str | None, scheme: str
) -> None:
    with nothing_written(world):
        secret = "hook-" + "s" * 24
        assume(token is None or scheme + token != "Bearer " + secret)
        headers = {"content-type": "application/json"}
        if token is not None:
            headers["authorization"] = scheme + token
        with world.settings(LORAFLOW_WEBHOOK_TOKEN=secret):
            expect_rejected(world, "ingest", headers, body, (), status=401)
