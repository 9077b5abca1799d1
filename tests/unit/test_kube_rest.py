"""functions.adapters.kube over its REST client: paths, pagination, guarded patches and the
translation of answers (FakeTransport stands in for the API server under production's one code
path; tests/kubernetes meets the real one)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from functions.adapters.kube import Kube, KubeApi
from functions.adapters.kubeconfig import KubeConfig, StaticToken
from functions.errors import KubeConflict, KubeRefused, KubeUnavailable
from functions.resources.kinds import POD, VLLM_ADAPTER
from functions.transport import Answer, TransportError, TransportTimeout
from tests.support.transport import FakeTransport, Sent, reply

Handler = Callable[[Sent], Answer]


def kube(handler: Handler, seen: list[Sent] | None = None) -> Kube:
    def record(request: Sent) -> Answer:
        if seen is not None:
            seen.append(request)
        return handler(request)

    config = KubeConfig(server="https://api.example:6443/", credentials=StaticToken("tok"))
    return Kube(KubeApi(config, through=FakeTransport(record)))


def adapter(rv: str = "1", status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "a", "namespace": "ns", "resourceVersion": rv}, "status": status or {}}


def test_get_path_headers_and_404() -> None:
    seen: list[Sent] = []
    client = kube(lambda r: reply(200, json=adapter()), seen)
    assert client.get(VLLM_ADAPTER, "ns", "a") == adapter()
    request = seen[0]
    assert request.method == "GET"
    assert request.target == "/apis/rackai.rackspace.com/v1alpha1/namespaces/ns/loraadapters/a"
    assert request.headers["authorization"] == "Bearer tok"
    assert request.headers["accept"] == "application/json"
    assert kube(lambda r: reply(404, json={})).get(POD, "ns", "p") is None


def test_get_pod_path() -> None:
    seen: list[Sent] = []
    kube(lambda r: reply(200, json={}), seen).get(POD, "ns", "p")
    assert seen[0].path == "/api/v1/namespaces/ns/pods/p"


@pytest.mark.parametrize(
    ("answer", "error"),
    [(500, KubeUnavailable), (503, KubeUnavailable), (429, KubeUnavailable), (403, KubeRefused)],
)
def test_error_translation(answer: int, error: type[Exception]) -> None:
    client = kube(lambda r: reply(answer, text="nope"))
    with pytest.raises(error):
        client.get(VLLM_ADAPTER, "ns", "a")
    with pytest.raises(error):
        client.list_all(VLLM_ADAPTER, "ns")


@pytest.mark.parametrize("failure", [TransportError("refused"), TransportTimeout("slow")])
def test_transport_errors_are_unavailable(failure: Exception) -> None:
    def fail(request: Sent) -> Answer:
        raise failure

    with pytest.raises(KubeUnavailable):
        kube(fail).get(VLLM_ADAPTER, "ns", "a")


def test_iter_pages_with_limit_continue_and_selector() -> None:
    seen: list[Sent] = []

    def pages(request: Sent) -> Answer:
        token = request.params.get("continue")
        if token is None:
            return reply(200, json={"items": [{"n": 1}, {"n": 2}], "metadata": {"continue": "p2"}})
        return reply(200, json={"items": [{"n": 3}], "metadata": {}})

    items = kube(pages, seen).list_all(POD, None, "app=x", page_size=2)
    assert items == [{"n": 1}, {"n": 2}, {"n": 3}]
    assert [r.path for r in seen] == ["/api/v1/pods", "/api/v1/pods"]
    assert seen[0].params == {"limit": "2", "labelSelector": "app=x"}
    assert seen[1].params == {"limit": "2", "labelSelector": "app=x", "continue": "p2"}
    seen.clear()
    kube(pages, seen).list_all(VLLM_ADAPTER, "ns")
    assert seen[0].path == "/apis/rackai.rackspace.com/v1alpha1/namespaces/ns/loraadapters"


def test_write_status_is_a_guarded_merge_patch_to_status() -> None:
    seen: list[Sent] = []

    def answer(request: Sent) -> Answer:
        if request.method == "GET":
            return reply(200, json=adapter("7", {"phase": "Old"}))
        return reply(200, json=adapter("8", {"phase": "New"}))

    written = kube(answer, seen).write_status(VLLM_ADAPTER, "ns", "a", lambda obj: {"phase": "New"})
    assert written is not None and written.changed and written.obj["metadata"]["resourceVersion"] == "8"
    patch = seen[1]
    assert patch.method == "PATCH"
    assert patch.path.endswith("/loraadapters/a/status")
    assert patch.headers["content-type"] == "application/merge-patch+json"
    assert patch.json() == {"status": {"phase": "New"}, "metadata": {"resourceVersion": "7"}}


def test_write_status_from_current_without_a_read_and_no_op_without_a_request() -> None:
    seen: list[Sent] = []
    client = kube(lambda r: reply(200, json=adapter("2")), seen)
    unchanged = client.write_status(VLLM_ADAPTER, "ns", "a", lambda obj: {}, current=adapter("1"))
    assert unchanged is not None and not unchanged.changed and seen == []
    client.write_status(VLLM_ADAPTER, "ns", "a", lambda obj: {"phase": "X"}, current=adapter("1"))
    assert [r.method for r in seen] == ["PATCH"]


def test_conflicts_reread_then_give_up() -> None:
    seen: list[Sent] = []

    def conflict(request: Sent) -> Answer:
        if request.method == "GET":
            return reply(200, json=adapter())
        return reply(409, json={"reason": "Conflict"})

    with pytest.raises(KubeConflict):
        kube(conflict, seen).write_status(VLLM_ADAPTER, "ns", "a", lambda obj: {"phase": "X"})
    assert [r.method for r in seen] == ["GET", "PATCH"] * 5


def test_write_of_a_vanished_object_is_none() -> None:
    assert kube(lambda r: reply(404)).write_status(VLLM_ADAPTER, "ns", "a", lambda o: {}) is None


def test_write_finalizers_patches_metadata() -> None:
    seen: list[Sent] = []

    def answer(request: Sent) -> Answer:
        return reply(200, json=adapter("3"))

    kube(answer, seen).write_finalizers(VLLM_ADAPTER, "ns", "a", lambda obj: ["rack.ai/unload"])
    patch = seen[1]
    assert patch.path == "/apis/rackai.rackspace.com/v1alpha1/namespaces/ns/loraadapters/a"
    assert patch.json() == {"metadata": {"finalizers": ["rack.ai/unload"], "resourceVersion": "3"}}


def test_record_event_posts_and_never_raises(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[Sent] = []
    obj = {"apiVersion": "rack.ai/v1alpha1", "kind": "LoRAAdapter", **adapter()}
    now = datetime(2026, 1, 1, tzinfo=UTC)
    kube(lambda r: reply(201, json={}), seen).record_event(obj, "Warning", "Why", "msg", "load", now)
    assert seen[0].method == "POST" and seen[0].path == "/api/v1/namespaces/ns/events"
    body = seen[0].json()
    assert body["involvedObject"]["name"] == "a" and body["reason"] == "Why"
    kube(lambda r: reply(403)).record_event(obj, "Warning", "Why", "msg", "load", now)

    def down(request: Sent) -> Answer:
        raise TransportError("down")

    kube(down).record_event(obj, "Warning", "Why", "msg", "load", now)
    failed = [r for r in caplog.records if r.getMessage() == "Could not record Event"]
    assert [getattr(r, "adapter", None) for r in failed] == ["ns/a", "ns/a"]  # 403, connection refused


@pytest.mark.parametrize(
    "message",
    [
        "etcdserver: request is too large",
        "rpc error: code = ResourceExhausted desc = "
        "trying to send message larger than max (2500499 vs. 2097152)",
    ],
)
def test_a_write_too_large_for_etcd_is_refused_not_retried(message: str) -> None:
    """The two 500s the API server answers for a write above etcd's limits (etcd's own refusal,
    and its etcd client's 2 MiB send limit) are permanent: KubeRefused 413, one request only.
    tests/kubernetes proves the server answers them."""
    seen: list[Sent] = []
    answer = {"kind": "Status", "status": "Failure", "message": message, "code": 500}
    client = kube(lambda r: reply(500, json=answer), seen)
    with pytest.raises(KubeRefused) as refused:
        client.write_status(POD, "ns", "p", lambda obj: {"message": "x"}, current=adapter("1"))
    assert refused.value.status == 413
    assert [r.method for r in seen] == ["PATCH"]
