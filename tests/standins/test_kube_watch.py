"""Watch through kubernetes.watch: ADDED/MODIFIED/DELETED, replay, 410, bookmarks, selectors."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
from kubernetes import client, watch

from devstack.standins.kube import KubeServer

GROUP, VERSION, PLURAL, NS = "rackai.rackspace.com", "v1alpha1", "loraadapters", "default"
Factory = Callable[..., dict[str, Any]]


def _collect(custom: client.CustomObjectsApi, count: int, **kwargs: Any) -> list[tuple[str, str]]:
    events: list[tuple[str, str]] = []
    stream = watch.Watch().stream(
        custom.list_namespaced_custom_object, GROUP, VERSION, NS, PLURAL, timeout_seconds=5, **kwargs
    )
    for event in stream:
        events.append((event["type"], event["object"]["metadata"]["name"]))
        if len(events) >= count:
            break
    return events


def test_watch_added_modified_deleted(custom: client.CustomObjectsApi, make_adapter: Factory) -> None:
    custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, make_adapter("pre"))
    results: list[tuple[str, str]] = []
    watcher = threading.Thread(target=lambda: results.extend(_collect(custom, 4)))
    watcher.start()
    time.sleep(0.3)
    custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, make_adapter("live"))
    custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, NS, PLURAL, "live", {"status": {"phase": "Ready"}}
    )
    custom.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "live")
    watcher.join(timeout=10)
    assert results == [("ADDED", "pre"), ("ADDED", "live"), ("MODIFIED", "live"), ("DELETED", "live")]


def test_watch_finalizer_flow(custom: client.CustomObjectsApi, make_adapter: Factory) -> None:
    body = make_adapter("fin")
    body["metadata"]["finalizers"] = ["loraflow.io/unload"]
    created = custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, body)
    custom.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "fin")
    custom.patch_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "fin", {"metadata": {"finalizers": []}})
    events = []
    stream = watch.Watch().stream(
        custom.list_namespaced_custom_object,
        GROUP,
        VERSION,
        NS,
        PLURAL,
        resource_version=created["metadata"]["resourceVersion"],
        timeout_seconds=5,
    )
    for event in stream:
        events.append((event["type"], bool(event["object"]["metadata"].get("deletionTimestamp"))))
        if len(events) == 2:
            break
    assert events == [("MODIFIED", True), ("DELETED", True)]


def test_watch_replays_from_resource_version_and_filters(
    custom: client.CustomObjectsApi, make_adapter: Factory
) -> None:
    first = custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, make_adapter("one"))
    labelled = make_adapter("two")
    labelled["metadata"]["labels"] = {"pick": "me"}
    custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, labelled)
    custom.patch_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, "one", {"metadata": {"labels": {"pick": "me"}}}
    )
    replay = _collect(
        custom, 2, resource_version=first["metadata"]["resourceVersion"], label_selector="pick=me"
    )
    assert replay == [("ADDED", "two"), ("ADDED", "one")]  # "one" entered the selector


def test_watch_too_old_resource_version_is_410(fixture_dirs: Any) -> None:
    server = KubeServer(crd_dir=fixture_dirs[0], watch_history=3).start()
    try:
        headers = {"Authorization": f"Bearer {server.admin_token}"}
        url = f"{server.url}/api/v1/namespaces"
        for index in range(5):
            httpx.post(url, json={"metadata": {"name": f"ns{index}"}}, headers=headers)
        response = httpx.get(
            url, params={"watch": "true", "resourceVersion": "1"}, headers=headers, timeout=5
        )
        event = json.loads(response.text.splitlines()[0])
        assert event["type"] == "ERROR"
        assert (event["object"]["code"], event["object"]["reason"]) == (410, "Expired")
        assert event["object"]["message"].startswith("too old resource version: 1")
    finally:
        server.stop()


def test_watch_bookmarks_and_timeout(kube_server: KubeServer) -> None:
    kube_server.api.bookmark_interval_s = 0.1
    headers = {"Authorization": f"Bearer {kube_server.admin_token}"}
    started = time.monotonic()
    response = httpx.get(
        f"{kube_server.url}/apis/{GROUP}/{VERSION}/{PLURAL}",
        params={"watch": "1", "allowWatchBookmarks": "true", "timeoutSeconds": "1"},
        headers=headers,
        timeout=5,
    )
    assert 0.9 < time.monotonic() - started < 3
    types = {json.loads(line)["type"] for line in response.text.splitlines()}
    assert types == {"BOOKMARK"}
    assert response.headers["Transfer-Encoding"] == "chunked"


def test_a_finished_watch_does_not_poison_the_connection_pool(kube_server: KubeServer) -> None:
    """The kubernetes client pools one urllib3 connection set for watches and plain requests;
    a watch stream ends with the connection, which the server must announce (Connection: close)
    or the next POST on the pooled socket fails with RemoteDisconnected (found by the soak)."""
    with client.ApiClient(kube_server.client_configuration()) as api:
        core = client.CoreV1Api(api)
        for i in range(3):  # the first POST after a watch is the one that failed
            for _ in watch.Watch().stream(core.list_namespaced_pod, "default", timeout_seconds=1):
                pass
            core.create_namespace({"metadata": {"name": f"after-watch-{i}"}})
    with httpx.stream(
        "GET",
        f"{kube_server.url}/api/v1/namespaces/default/pods",
        params={"watch": "1", "timeoutSeconds": "1"},
        headers={"Authorization": f"Bearer {kube_server.admin_token}"},
    ) as response:
        assert response.headers["connection"] == "close"


def test_a_watcher_that_resets_its_connection_is_not_a_server_error(
    kube_server: KubeServer, capsys: Any
) -> None:
    """A watching client that goes away (a function process stopped mid-watch) resets its
    connection; the stream's last chunk then has nowhere to go. The apiserver drops such a
    stream silently; a traceback on the stand-in's stderr (socketserver's `handle_error`) said it
    was a failure of the server's (seen once at the end of `make run`)."""
    request = (
        f"GET /api/v1/namespaces/default/pods?watch=1&timeoutSeconds=5 HTTP/1.1\r\n"
        f"Host: {kube_server.host}\r\nAuthorization: Bearer {kube_server.admin_token}\r\n\r\n"
    ).encode()
    with socket.create_connection((kube_server.host, kube_server.port)) as watcher:
        watcher.sendall(request)
        assert watcher.recv(65536).startswith(b"HTTP/1.1 200")
        watcher.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    httpd = kube_server._httpd
    assert httpd is not None
    deadline = time.monotonic() + 5
    while httpd.connections and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not httpd.connections, "the stream did not end when its watcher went away"
    assert "Traceback" not in capsys.readouterr().err
