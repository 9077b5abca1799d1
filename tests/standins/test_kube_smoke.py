"""Start/stop, discovery and create/get through the real kubernetes client."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client, config

from devstack.standins.kube import KubeServer

GROUP, VERSION, PLURAL = "rackai.rackspace.com", "v1alpha1", "loraadapters"


def test_starts_fast_and_stops_without_leaks(
    fixture_dirs: tuple[Path, Path], make_adapter: Callable[..., dict[str, Any]]
) -> None:
    before = set(threading.enumerate())
    started = time.monotonic()
    server = KubeServer(crd_dir=fixture_dirs[0], rbac_dir=fixture_dirs[1]).start()
    assert time.monotonic() - started < 1.0
    assert server.url.startswith("http://127.0.0.1:")
    with client.ApiClient(server.client_configuration()) as api:
        custom = client.CustomObjectsApi(api)
        custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, make_adapter("a"))
        watcher = threading.Thread(target=lambda: _watch_quietly(custom))
        watcher.start()
        time.sleep(0.2)
        server.stop()
        watcher.join(timeout=5)
    assert not watcher.is_alive()
    assert set(threading.enumerate()) - before == set()
    with pytest.raises(httpx.ConnectError):
        httpx.get(server.url + "/version")


def _watch_quietly(custom: client.CustomObjectsApi) -> None:
    response = custom.list_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, watch=True, _preload_content=False
    )
    with pytest.raises(Exception):  # noqa: B017 - the server going away ends the stream
        for _line in response.stream():
            pass
        raise RuntimeError("stream ended")


def test_create_get(custom: client.CustomObjectsApi, make_adapter: Callable[..., dict[str, Any]]) -> None:
    created = custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, make_adapter("a1"))
    assert created["metadata"]["generation"] == 1
    got = custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "a1")
    assert got["metadata"]["uid"] == created["metadata"]["uid"]


def test_kubeconfig_for_the_python_client(fixture_dirs: tuple[Path, Path], tmp_path: Path) -> None:
    """kubernetes.config.load_kube_config works with the written kubeconfig (HTTP and TLS)."""
    for tls in (False, True):
        with KubeServer(crd_dir=fixture_dirs[0], tls=tls) as server:
            path = server.write_kubeconfig(tmp_path / f"kubeconfig-{tls}")
            api = config.new_client_from_config(str(path))
            names = [n.metadata.name for n in client.CoreV1Api(api).list_namespace().items]
            assert "default" in names
            api.close()
