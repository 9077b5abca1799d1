"""Size limits as the real servers answer them: etcd's 1.5 MiB request limit (a plain 500 that
stores nothing) and the apiserver's 3 MiB request-body limit (413 RequestEntityTooLarge)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from devstack.standins.kube import KubeServer
from devstack.standins.kube.api import Response
from devstack.standins.kube.routing import Request

GROUP, VERSION, PLURAL, NS = "rackai.rackspace.com", "v1alpha1", "loraadapters", "default"
PATH = f"/apis/{GROUP}/{VERSION}/namespaces/{NS}/{PLURAL}"
ETCD_LIMIT, BODY_LIMIT = 1_572_864, 3_145_728
Factory = Callable[..., dict[str, Any]]
JSON_PATCH = "application/json-patch+json"  # the client sends a list as a merge patch otherwise
# Verbatim from https://github.com/kubernetes/kubernetes/issues/74600: no reason, no details.
ETCD_TOO_LARGE = {
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Failure",
    "message": "etcdserver: request is too large",
    "code": 500,
}
BODY_TOO_LARGE = {
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Failure",
    "message": "Request entity too large: limit is 3145728",
    "reason": "RequestEntityTooLarge",
    "code": 413,
}


def _etcd_bytes(obj: dict[str, Any]) -> int:
    """What the apiserver writes to etcd for an ASCII-only custom resource: compact JSON and the
    encoder's newline, without metadata.resourceVersion."""
    meta = {k: v for k, v in obj["metadata"].items() if k != "resourceVersion"}
    return len(json.dumps({**obj, "metadata": meta}, separators=(",", ":")).encode()) + 1


def _refusal(caught: pytest.ExceptionInfo[ApiException]) -> tuple[int | None, dict[str, Any]]:
    body: dict[str, Any] = json.loads(caught.value.body)
    return caught.value.status, body


def _headers(server: KubeServer, content_type: str = "application/json") -> dict[str, str]:
    return {"Authorization": f"Bearer {server.admin_token}", "Content-Type": content_type}


def _get(custom: client.CustomObjectsApi, name: str) -> dict[str, Any]:
    result: dict[str, Any] = custom.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name)
    return result


def _create(custom: client.CustomObjectsApi, body: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, body)
    return result


@pytest.fixture
def small_etcd(kube_server: KubeServer) -> KubeServer:
    """The stand-in with etcd's limit lowered to 4 KiB, so that small writes cross it."""
    kube_server.store.max_request_bytes = 4096
    return kube_server


# ------------------------------------------------------------ etcd's request limit


def test_too_large_create_is_a_500_and_stores_nothing(
    kube_server: KubeServer, custom: client.CustomObjectsApi, make_adapter: Factory
) -> None:
    before = kube_server.store.resource_version
    with pytest.raises(ApiException) as caught:  # ~1.6 MB: under the body limit, over etcd's
        _create(custom, make_adapter("huge", dataset="x" * 1_600_000))
    assert _refusal(caught) == (500, ETCD_TOO_LARGE)
    with pytest.raises(ApiException) as missing:
        _get(custom, "huge")
    assert missing.value.status == 404
    assert kube_server.store.resource_version == before
    assert kube_server.store.events_after(before) == []


def test_too_large_status_merge_patch_leaves_the_object_unchanged(
    kube_server: KubeServer, custom: client.CustomObjectsApi, make_adapter: Factory
) -> None:
    _create(custom, make_adapter("grow"))
    custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, NS, PLURAL, "grow", {"status": {"phase": "Ready"}}
    )
    before = _get(custom, "grow")
    rv = int(before["metadata"]["resourceVersion"])
    with pytest.raises(ApiException) as caught:
        custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, NS, PLURAL, "grow", {"status": {"storageRef": {"path": "x" * 1_600_000}}}
        )
    assert _refusal(caught) == (500, ETCD_TOO_LARGE)
    after = _get(custom, "grow")
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert after["status"] == {"phase": "Ready"}
    assert after == before
    assert kube_server.store.resource_version == rv
    assert kube_server.store.events_after(rv) == []


def test_a_write_exactly_at_the_default_limit_succeeds_and_one_byte_more_fails(
    custom: client.CustomObjectsApi, make_adapter: Factory
) -> None:
    """etcd refuses only a request *larger* than --max-request-bytes (1,572,864 by default)."""
    base = _etcd_bytes(_create(custom, make_adapter("edge-0", dataset="x")))
    fits = _create(custom, make_adapter("edge-1", dataset="x" * (1 + ETCD_LIMIT - base)))
    assert _etcd_bytes(fits) == ETCD_LIMIT
    with pytest.raises(ApiException) as caught:
        _create(custom, make_adapter("edge-2", dataset="x" * (2 + ETCD_LIMIT - base)))
    assert _refusal(caught) == (500, ETCD_TOO_LARGE)


def test_status_patch_up_to_a_lowered_limit_succeeds_and_past_it_changes_nothing(
    small_etcd: KubeServer, custom: client.CustomObjectsApi, make_adapter: Factory
) -> None:
    created = _create(custom, make_adapter("tight"))
    room = 4096 - _etcd_bytes({**created, "status": {"storageRef": {"path": ""}}})
    fits = custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, NS, PLURAL, "tight", {"status": {"storageRef": {"path": "x" * room}}}
    )
    assert _etcd_bytes(fits) == 4096
    with pytest.raises(ApiException) as caught:
        custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, NS, PLURAL, "tight", {"status": {"storageRef": {"path": "y" * (room + 1)}}}
        )
    assert _refusal(caught) == (500, ETCD_TOO_LARGE)
    assert _get(custom, "tight") == fits


def test_go_json_escapes_count_towards_the_limit(
    small_etcd: KubeServer, custom: client.CustomObjectsApi, make_adapter: Factory
) -> None:
    """Go's encoding/json stores `&` as `\\u0026` (6 bytes): what fits as `x` does not as `&`."""
    created = _create(custom, make_adapter("amp"))
    room = 4096 - _etcd_bytes({**created, "status": {"storageRef": {"path": ""}}})
    with pytest.raises(ApiException) as caught:
        custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, NS, PLURAL, "amp", {"status": {"storageRef": {"path": "&" * (room // 6 + 1)}}}
        )
    assert _refusal(caught) == (500, ETCD_TOO_LARGE)
    custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, NS, PLURAL, "amp", {"status": {"storageRef": {"path": "&" * (room // 6)}}}
    )


def _writes(custom: client.CustomObjectsApi, adapter: Factory) -> dict[str, Callable[[str], Any]]:
    """Every write path, each storing `pad` in the object (or creating `other` with it)."""
    args = (GROUP, VERSION, NS, PLURAL, "target")

    def replace(pad: str) -> Any:
        current = _get(custom, "target")
        return custom.replace_namespaced_custom_object(
            *args, {**current, "spec": {**current["spec"], "dataset": pad}}
        )

    def replace_status(pad: str) -> Any:
        current = _get(custom, "target")
        return custom.replace_namespaced_custom_object_status(
            *args, {**current, "status": {"storageRef": {"path": pad}}}
        )

    def apply(pad: str) -> Any:
        manifest = adapter("target", dataset=pad)
        return custom.patch_namespaced_custom_object(
            *args, manifest, field_manager="test", _content_type="application/apply-patch+yaml"
        )

    return {
        "create": lambda pad: _create(custom, adapter("other", dataset=pad)),
        "update": replace,
        "merge-patch": lambda pad: custom.patch_namespaced_custom_object(*args, {"spec": {"dataset": pad}}),
        "json-patch": lambda pad: custom.patch_namespaced_custom_object(
            *args, [{"op": "add", "path": "/spec/dataset", "value": pad}], _content_type=JSON_PATCH
        ),
        "apply-patch": apply,
        "status-update": replace_status,
        "status-merge-patch": lambda pad: custom.patch_namespaced_custom_object_status(
            *args, {"status": {"storageRef": {"path": pad}}}
        ),
        "status-json-patch": lambda pad: custom.patch_namespaced_custom_object_status(
            *args,
            [{"op": "add", "path": "/status/storageRef", "value": {"path": pad}}],
            _content_type=JSON_PATCH,
        ),
    }


@pytest.mark.parametrize(
    "path",
    [
        "create",
        "update",
        "merge-patch",
        "json-patch",
        "apply-patch",
        "status-update",
        "status-merge-patch",
        "status-json-patch",
    ],
)
def test_every_write_path_is_checked_and_refused_writes_change_nothing(
    small_etcd: KubeServer, custom: client.CustomObjectsApi, make_adapter: Factory, path: str
) -> None:
    _create(custom, make_adapter("target"))
    custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, NS, PLURAL, "target", {"status": {"phase": "Ready"}}
    )
    before = _get(custom, "target")
    rv = small_etcd.store.resource_version
    write = _writes(custom, make_adapter)[path]
    with pytest.raises(ApiException) as caught:
        write("x" * 5000)
    assert _refusal(caught) == (500, ETCD_TOO_LARGE)
    assert _get(custom, "target") == before
    assert small_etcd.store.resource_version == rv
    assert small_etcd.store.events_after(rv) == []
    with pytest.raises(ApiException) as missing:
        _get(custom, "other")
    assert missing.value.status == 404
    write("x" * 100)  # the same path under the limit is stored
    assert small_etcd.store.resource_version == rv + 1


def test_dry_run_never_reaches_etcd(small_etcd: KubeServer, make_adapter: Factory) -> None:
    """dryRun=All stops before storage, so no etcd limit applies to it (nor is anything stored)."""
    body = make_adapter("dry", dataset="x" * 5000)
    answer = httpx.post(
        small_etcd.url + PATH, params={"dryRun": "All"}, headers=_headers(small_etcd), json=body
    )
    assert answer.status_code == 201
    assert answer.json()["spec"]["dataset"] == "x" * 5000
    assert httpx.get(f"{small_etcd.url}{PATH}/dry", headers=_headers(small_etcd)).status_code == 404


# ------------------------------------------------------------ the apiserver's body limit


def _padded_body(size: int) -> bytes:
    """A create body of exactly `size` bytes."""
    spec = {"model": "m", "dataset": ""}
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "LoRAAdapter",
        "metadata": {"name": "padded"},
        "spec": spec,
    }
    empty = json.dumps(body, separators=(",", ":")).encode()
    spec["dataset"] = "x" * (size - len(empty))
    encoded = json.dumps(body, separators=(",", ":")).encode()
    assert len(encoded) == size
    return encoded


def test_body_over_3_mib_is_413_through_the_kubernetes_client(
    kube_server: KubeServer, custom: client.CustomObjectsApi, make_adapter: Factory
) -> None:
    before = kube_server.store.resource_version
    with pytest.raises(ApiException) as caught:
        _create(custom, make_adapter("vast", dataset="x" * 3_200_000))
    assert _refusal(caught) == (413, BODY_TOO_LARGE)
    assert kube_server.store.resource_version == before
    assert _create(custom, make_adapter("after"))["metadata"]["name"] == "after"


def test_the_body_limit_is_exact_and_checked_before_etcd(kube_server: KubeServer) -> None:
    """3,145,728 bytes are read (and then refused by etcd's smaller limit); one byte more is a
    413, with the connection still good for the next request."""
    with httpx.Client(base_url=kube_server.url, headers=_headers(kube_server)) as http:
        at_limit = http.post(PATH, content=_padded_body(BODY_LIMIT))
        assert (at_limit.status_code, at_limit.json()) == (500, ETCD_TOO_LARGE)
        over = http.post(PATH, content=_padded_body(BODY_LIMIT + 1))
        assert (over.status_code, over.json()) == (413, BODY_TOO_LARGE)
        assert http.get(PATH).status_code == 200


def test_an_oversized_body_is_not_decoded_nor_held(kube_server: KubeServer) -> None:
    """The 413 comes before decoding (garbage gets it too) and the API never sees the bytes."""
    seen: list[Request] = []
    handle = kube_server.api.handle

    def spy(request: Request) -> Response:
        seen.append(request)
        return handle(request)

    kube_server.api.handle = spy  # type: ignore[method-assign]
    answer = httpx.put(
        f"{kube_server.url}{PATH}/x", headers=_headers(kube_server), content=b"{" * (BODY_LIMIT + 1)
    )
    assert (answer.status_code, answer.json()) == (413, BODY_TOO_LARGE)
    assert [(r.body, r.body_limit_exceeded) for r in seen] == [(b"", BODY_LIMIT)]


def test_the_body_limit_applies_where_the_handler_reads_the_body(kube_server: KubeServer) -> None:
    """Authentication and routing answer first; a read (whose body no handler reads) is served."""
    oversized = b"{" * (BODY_LIMIT + 1)
    anonymous = httpx.post(kube_server.url + PATH, content=oversized)
    assert anonymous.status_code == 401
    unknown = httpx.post(
        f"{kube_server.url}/apis/{GROUP}/{VERSION}/namespaces/{NS}/widgets",
        headers=_headers(kube_server),
        content=oversized,
    )
    assert unknown.status_code == 404
    listed = httpx.request("GET", kube_server.url + PATH, headers=_headers(kube_server), content=oversized)
    assert listed.status_code == 200


def test_a_lowered_body_limit_is_reported_in_the_message(kube_server: KubeServer) -> None:
    kube_server.api.max_request_body_bytes = 1024
    answer = httpx.post(kube_server.url + PATH, headers=_headers(kube_server), content=_padded_body(1025))
    assert answer.status_code == 413
    assert answer.json()["message"] == "Request entity too large: limit is 1024"
    fits = httpx.post(kube_server.url + PATH, headers=_headers(kube_server), content=_padded_body(1024))
    assert fits.status_code == 201
