"""CRUD semantics through the real kubernetes client: selectors, pagination, status,
generation, optimistic concurrency, patch types, finalizers."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from devstack.standins.kube.server import KubeServer

GROUP, VERSION, PLURAL, NS = "rackai.rackspace.com", "v1alpha1", "loraadapters", "default"
Factory = Callable[..., dict[str, Any]]


def _create(custom: client.CustomObjectsApi, body: dict[str, Any], ns: str = NS) -> dict[str, Any]:
    result: dict[str, Any] = custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)
    return result


def _status(exc: ApiException) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(exc.body)
    return body


def test_list_with_label_and_field_selectors(custom: client.CustomObjectsApi, make_adapter: Factory) -> None:
    for index, team in enumerate(["a", "a", "b", "c"]):
        body = make_adapter(f"ad-{index}")
        body["metadata"]["labels"] = {"team": team, **({"gpu": "yes"} if index == 0 else {})}
        _create(custom, body)

    def names(**kwargs: str) -> list[str]:
        result = custom.list_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, **kwargs)
        return [item["metadata"]["name"] for item in result["items"]]

    assert names(label_selector="team=a") == ["ad-0", "ad-1"]
    assert names(label_selector="team==b") == ["ad-2"]
    assert names(label_selector="team!=a") == ["ad-2", "ad-3"]
    assert names(label_selector="team in (b,c)") == ["ad-2", "ad-3"]
    assert names(label_selector="team notin (a, b)") == ["ad-3"]
    assert names(label_selector="gpu") == ["ad-0"]
    assert names(label_selector="!gpu,team=a") == ["ad-1"]
    assert names(field_selector="metadata.name=ad-2") == ["ad-2"]
    assert names(field_selector="metadata.name!=ad-2,metadata.namespace=default") == ["ad-0", "ad-1", "ad-3"]
    everywhere = custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)
    assert len(everywhere["items"]) == 4
    assert int(everywhere["metadata"]["resourceVersion"]) >= 4


def test_pagination_limit_continue_and_garbage_token(
    custom: client.CustomObjectsApi, make_adapter: Factory
) -> None:
    for index in range(5):
        _create(custom, make_adapter(f"page-{index}"))
    seen, token, pages = [], None, 0
    while True:
        kwargs = {"_continue": token} if token else {}
        page = custom.list_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, limit=2, **kwargs)
        seen += [item["metadata"]["name"] for item in page["items"]]
        pages += 1
        token = page["metadata"].get("continue")
        if not token:
            break
        assert page["metadata"]["remainingItemCount"] == 5 - len(seen)
    assert pages == 3
    assert seen == [f"page-{i}" for i in range(5)]
    with pytest.raises(ApiException) as caught:
        custom.list_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, limit=2, _continue="not-a-token!!")
    assert caught.value.status == 410
    status = _status(caught.value)
    assert (status["kind"], status["reason"], status["code"]) == ("Status", "Expired", 410)


def test_continued_pages_are_read_at_the_first_pages_revision(
    kube_server: KubeServer, custom: client.CustomObjectsApi, make_adapter: Factory
) -> None:
    """etcd3 GetList: a continue token carries the first page's revision and the rest of the
    list is read there, so writes between pages do not show (a consistent list): a later
    object modified shows its old version, a deleted one is still listed, a new one is not."""
    for index in range(5):
        _create(custom, make_adapter(f"snap-{index}"))
    first = custom.list_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, limit=2)
    custom.patch_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, "snap-3", {"metadata": {"labels": {"changed": "yes"}}}
    )
    custom.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "snap-4")
    _create(custom, make_adapter("snap-35"))
    token, items = first["metadata"]["continue"], []
    while token:
        page = custom.list_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, limit=2, _continue=token)
        assert page["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
        items += page["items"]
        token = page["metadata"].get("continue")
    assert [i["metadata"]["name"] for i in items] == ["snap-2", "snap-3", "snap-4"]
    assert "labels" not in items[1]["metadata"]  # snap-3 as it was at the first page's revision
    fresh = custom.list_namespaced_custom_object(GROUP, VERSION, NS, PLURAL)
    assert [i["metadata"]["name"] for i in fresh["items"]] == [
        "snap-0", "snap-1", "snap-2", "snap-3", "snap-35"
    ]  # fmt: skip


def test_a_filtered_page_counts_no_remaining_items_and_may_end_empty(
    custom: client.CustomObjectsApi, make_adapter: Factory
) -> None:
    """With a selector the apiserver omits remainingItemCount (etcd counts keys, not matches)
    and hands a continue token whenever keys follow the page, matching or not."""
    for index in range(4):
        body = make_adapter(f"sel-{index}")
        body["metadata"]["labels"] = {"team": "a" if index < 2 else "b"}
        _create(custom, body)
    page = custom.list_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, limit=2, label_selector="team=a")
    assert [i["metadata"]["name"] for i in page["items"]] == ["sel-0", "sel-1"]
    assert "remainingItemCount" not in page["metadata"]
    rest = custom.list_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, limit=2, label_selector="team=a", _continue=page["metadata"]["continue"]
    )
    assert rest["items"] == [] and not rest["metadata"].get("continue")


def test_a_continue_token_older_than_the_history_expires(
    fixture_dirs: tuple[Path, Path],
    make_client: Callable[[KubeServer, str | None], client.ApiClient],
    make_adapter: Factory,
) -> None:
    """Once the revision of a token is compacted (here: pushed out of the stand-in's history
    of 50 writes) the next page is 410 Expired, and a fresh list starts over."""
    with KubeServer(crd_dir=fixture_dirs[0], rbac_dir=fixture_dirs[1], watch_history=50) as server:
        custom = client.CustomObjectsApi(make_client(server, None))
        for index in range(3):
            _create(custom, make_adapter(f"old-{index}"))
        first = custom.list_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, limit=1)
        for round_ in range(30):
            labels = {"metadata": {"labels": {"round": str(round_)}}}
            for name in ("old-0", "old-1"):
                custom.patch_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name, labels)
        with pytest.raises(ApiException) as caught:
            custom.list_namespaced_custom_object(
                GROUP, VERSION, NS, PLURAL, limit=1, _continue=first["metadata"]["continue"]
            )
        assert caught.value.status == 410
        assert _status(caught.value)["reason"] == "Expired"
        assert len(custom.list_namespaced_custom_object(GROUP, VERSION, NS, PLURAL)["items"]) == 3


def test_not_found_and_already_exists_bodies(custom: client.CustomObjectsApi, make_adapter: Factory) -> None:
    with pytest.raises(ApiException) as caught:
        custom.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "missing")
    assert caught.value.status == 404
    assert _status(caught.value) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'loraadapters.rackai.rackspace.com "missing" not found',
        "reason": "NotFound",
        "details": {"name": "missing", "group": GROUP, "kind": PLURAL},
        "code": 404,
    }
    _create(custom, make_adapter("dup"))
    with pytest.raises(ApiException) as caught:
        _create(custom, make_adapter("dup"))
    assert caught.value.status == 409
    assert _status(caught.value)["reason"] == "AlreadyExists"
    with pytest.raises(ApiException) as caught:
        _create(custom, make_adapter("x"), ns="nowhere")
    assert caught.value.status == 404
    assert _status(caught.value)["message"] == 'namespaces "nowhere" not found'


def test_status_subresource_and_generation_rules(
    custom: client.CustomObjectsApi, make_adapter: Factory
) -> None:
    body = make_adapter("gen")
    body["status"] = {"phase": "Ready"}
    created = _create(custom, body)
    assert created["metadata"]["generation"] == 1
    assert "status" not in created  # create ignores .status (status subresource enabled)
    rv0 = int(created["metadata"]["resourceVersion"])

    patched = custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, NS, PLURAL, "gen", {"status": {"phase": "Processing"}, "spec": {"model": "ignored"}}
    )
    assert patched["status"]["phase"] == "Processing"
    assert patched["spec"]["model"] == "llama3-8b-base"  # /status ignores everything else
    assert patched["metadata"]["generation"] == 1  # status writes don't bump generation
    rv1 = int(patched["metadata"]["resourceVersion"])
    assert rv1 > rv0

    labelled = custom.patch_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, "gen", {"metadata": {"labels": {"x": "y"}}, "status": {"phase": "Failed"}}
    )
    assert labelled["metadata"]["generation"] == 1  # metadata-only change
    assert labelled["status"]["phase"] == "Processing"  # main resource ignores .status

    spec_changed = custom.patch_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, "gen", {"spec": {"sourceFineTuningJob": "job-1"}}
    )
    assert spec_changed["metadata"]["generation"] == 2
    assert int(spec_changed["metadata"]["resourceVersion"]) > int(labelled["metadata"]["resourceVersion"])

    replaced = custom.replace_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "gen", spec_changed)
    assert replaced["metadata"]["resourceVersion"] == spec_changed["metadata"]["resourceVersion"]


def test_stale_resource_version_conflicts(custom: client.CustomObjectsApi, make_adapter: Factory) -> None:
    created = _create(custom, make_adapter("race"))
    stale = created["metadata"]["resourceVersion"]
    custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, NS, PLURAL, "race", {"status": {"phase": "Pending"}}
    )
    with pytest.raises(ApiException) as caught:
        custom.patch_namespaced_custom_object_status(
            GROUP,
            VERSION,
            NS,
            PLURAL,
            "race",
            {"metadata": {"resourceVersion": stale}, "status": {"phase": "Ready"}},
        )
    assert caught.value.status == 409
    assert _status(caught.value) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'Operation cannot be fulfilled on loraadapters.rackai.rackspace.com "race": '
        "the object has been modified; please apply your changes to the latest "
        "version and try again",
        "reason": "Conflict",
        "details": {"name": "race", "group": GROUP, "kind": PLURAL},
        "code": 409,
    }
    created["spec"]["model"] = "other"
    with pytest.raises(ApiException) as caught:
        custom.replace_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "race", created)
    assert caught.value.status == 409


def test_patch_types(custom: client.CustomObjectsApi, kube_server: Any, make_adapter: Factory) -> None:
    _create(custom, make_adapter("pt", tags=["pruned: not in the seed schema"]))
    url = f"{kube_server.url}/apis/{GROUP}/{VERSION}/namespaces/{NS}/{PLURAL}/pt"
    auth = {"Authorization": f"Bearer {kube_server.admin_token}"}

    def raw_patch(body: Any, content_type: str, suffix: str = "", **params: str) -> httpx.Response:
        return httpx.patch(
            url + suffix,
            content=json.dumps(body),
            params=params,
            headers={**auth, "Content-Type": content_type},
        )

    ops = [
        {"op": "test", "path": "/spec/model", "value": "llama3-8b-base"},
        {"op": "add", "path": "/spec/sourceFineTuningJob", "value": "job-7"},
    ]
    done = raw_patch(ops, "application/json-patch+json")
    assert done.status_code == 200
    assert done.json()["spec"] == {"model": "llama3-8b-base", "sourceFineTuningJob": "job-7"}
    failed = raw_patch(
        [{"op": "test", "path": "/spec/model", "value": "nope"}], "application/json-patch+json"
    )
    assert failed.status_code == 422
    strategic = raw_patch({"spec": {"model": "x"}}, "application/strategic-merge-patch+json")
    assert strategic.status_code == 415
    assert strategic.json()["reason"] == "UnsupportedMediaType"
    applied = raw_patch(
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "LoRAAdapter",
            "metadata": {"name": "pt"},
            "status": {"phase": "Ready"},
        },
        "application/apply-patch+yaml",
        "/status",
        fieldManager="t",
        force="true",
    )
    assert applied.status_code == 200
    assert applied.json()["status"]["phase"] == "Ready"
    assert applied.json()["spec"]["sourceFineTuningJob"] == "job-7"


def test_pod_strategic_merge_and_status(core: client.CoreV1Api) -> None:
    pod = {
        "metadata": {"name": "p1", "labels": {"loraflow.io/serving": "true"}},
        "spec": {
            "containers": [
                {"name": "engine", "image": "vllm", "ports": [{"name": "http", "containerPort": 8000}]},
                {"name": "side", "image": "busybox"},
            ]
        },
    }
    created = core.create_namespaced_pod(NS, pod)
    assert created.status.phase == "Pending"
    patched = core.patch_namespaced_pod(
        "p1", NS, {"spec": {"containers": [{"name": "engine", "image": "vllm:2"}]}}
    )
    assert [c.image for c in patched.spec.containers] == ["vllm:2", "busybox"]
    assert patched.spec.containers[0].ports[0].container_port == 8000
    assert patched.metadata.generation == 2
    status = core.patch_namespaced_pod_status(
        "p1",
        NS,
        {
            "status": {
                "phase": "Running",
                "podIP": "127.0.0.9",
                "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [
                    {
                        "name": "engine",
                        "ready": True,
                        "restartCount": 1,
                        "image": "vllm:2",
                        "imageID": "",
                        "containerID": "x",
                    }
                ],
            }
        },
    )
    assert status.status.pod_ip == "127.0.0.9"
    assert status.metadata.generation == 2  # status writes don't bump generation
    listed = core.list_namespaced_pod(
        NS, field_selector="status.phase=Running", label_selector="loraflow.io/serving=true"
    )
    assert [p.metadata.name for p in listed.items] == ["p1"]
    core.delete_namespaced_pod("p1", NS)
    assert core.list_namespaced_pod(NS).items == []


def test_finalizers_and_deletion_timestamp(custom: client.CustomObjectsApi, make_adapter: Factory) -> None:
    body = make_adapter("fin")
    body["metadata"]["finalizers"] = ["loraflow.io/unload"]
    _create(custom, body)
    deleting = custom.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "fin")
    assert deleting["metadata"]["deletionTimestamp"]
    assert deleting["metadata"]["deletionGracePeriodSeconds"] == 0
    still = custom.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "fin")
    assert still["metadata"]["finalizers"] == ["loraflow.io/unload"]
    with pytest.raises(ApiException) as caught:
        custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            NS,
            PLURAL,
            "fin",
            {"metadata": {"finalizers": ["loraflow.io/unload", "other/new"]}},
        )
    assert caught.value.status == 422
    custom.patch_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, "fin", {"metadata": {"finalizers": None}}
    )
    with pytest.raises(ApiException) as caught:
        custom.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "fin")
    assert caught.value.status == 404


def test_namespaces_events_and_deletecollection(
    core: client.CoreV1Api, custom: client.CustomObjectsApi, make_adapter: Factory
) -> None:
    core.create_namespace({"metadata": {"name": "loraflow"}})
    assert "loraflow" in [n.metadata.name for n in core.list_namespace().items]
    _create(custom, make_adapter("in-ns"), ns="loraflow")
    event = core.create_namespaced_event(
        "loraflow",
        {
            "metadata": {"name": "e1"},
            "involvedObject": {"kind": "LoRAAdapter", "name": "in-ns", "namespace": "loraflow"},
            "reason": "Loaded",
            "message": "ok",
            "type": "Normal",
        },
    )
    assert event.reason == "Loaded"
    found = core.list_namespaced_event("loraflow", field_selector="involvedObject.name=in-ns")
    assert [e.metadata.name for e in found.items] == ["e1"]
    custom.delete_collection_namespaced_custom_object(GROUP, VERSION, "loraflow", PLURAL)
    assert custom.list_namespaced_custom_object(GROUP, VERSION, "loraflow", PLURAL)["items"] == []


def test_lists_come_in_etcds_key_order_across_namespaces(
    core: client.CoreV1Api, custom: client.CustomObjectsApi, make_adapter: Factory
) -> None:
    """etcd orders the bytes of .../<namespace>/<name>: "team-b/..." sorts before "team/..."
    ('-' is below '/'), in a whole list and across pages, and a namespace's own list ends where
    its keys do (remainingItemCount counts only its own)."""
    for ns in ("team", "team-b"):
        core.create_namespace({"metadata": {"name": ns}})
        for name in ("x", "y"):
            _create(custom, make_adapter(name), ns)
    order = [("team-b", "x"), ("team-b", "y"), ("team", "x"), ("team", "y")]
    everywhere = custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)
    keys = [(i["metadata"]["namespace"], i["metadata"]["name"]) for i in everywhere["items"]]
    assert [k for k in keys if k[0].startswith("team")] == order
    paged, token = [], None
    while True:
        kwargs = {"_continue": token} if token else {}
        page = custom.list_cluster_custom_object(GROUP, VERSION, PLURAL, limit=1, **kwargs)
        paged += [(i["metadata"]["namespace"], i["metadata"]["name"]) for i in page["items"]]
        token = page["metadata"].get("continue")
        if not token:
            break
    assert paged == keys
    first = custom.list_namespaced_custom_object(GROUP, VERSION, "team-b", PLURAL, limit=1)
    assert first["metadata"]["remainingItemCount"] == 1
    rest = custom.list_namespaced_custom_object(
        GROUP, VERSION, "team-b", PLURAL, limit=1, _continue=first["metadata"]["continue"]
    )
    assert [i["metadata"]["name"] for i in rest["items"]] == ["y"] and not rest["metadata"].get("continue")
