"""The functions' own Kubernetes client (functions.adapters.kube, .kubeconfig, .keepalive) against
the real kube-apiserver: what it makes of the server's refusals (an object too large for etcd, an
RBAC denial), and TLS as a kubeconfig sets it up (the CA trusted, the name checked)."""

from __future__ import annotations

import base64
import json
import ssl
from collections.abc import Callable, Sequence
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from devstack.kubernetes import ControlPlane
from devstack.kubernetes.pki import issue
from functions.adapters.kube import Kube
from functions.errors import KubeRefused, KubeUnavailable
from functions.resources.kinds import MODEL, POD, VLLM_ADAPTER
from functions.transport import KeepAlive, TransportError
from tests.support.connect_proxy import ConnectProxy

ClientOf = Callable[[Path], Kube]
"""The `client_of` fixture (tests/kubernetes/conftest.py): the functions' client of a kubeconfig."""


@pytest.mark.parametrize(
    ("padding", "refusal"),
    [
        (1_600_000, "etcdserver: request is too large"),  # over etcd's --max-request-bytes (1.5 MiB)
        (2_500_000, "trying to send message larger than max"),  # over the apiserver's etcd client's 2 MiB
        (3_200_000, "Request entity too large: limit is 3145728"),  # over the apiserver's own body limit
    ],
    ids=["etcd", "etcd-client", "apiserver"],
)
def test_an_object_too_large_to_store_is_refused_not_retried(
    plane: ControlPlane,
    api: httpx.Client,
    namespace: str,
    tmp_path: Path,
    client_of: ClientOf,
    padding: int,
    refusal: str,
) -> None:
    """Each limit a write can meet is a permanent refusal (KubeRefused, 413: what stat shrinks its
    status on), never KubeUnavailable (which the Broker would redeliver forever); nothing is written."""
    pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
    api.post(f"/api/v1/namespaces/{namespace}/pods", json=pod).raise_for_status()
    client = client_of(plane.write_kubeconfig(tmp_path / "kubeconfig"))
    with pytest.raises(KubeRefused) as refused:
        client.write_status(POD, namespace, "p", lambda obj: {**obj["status"], "message": "x" * padding})
    assert refused.value.status == 413
    assert refusal in str(refused.value)
    stored = client.get(POD, namespace, "p")
    assert stored is not None and "message" not in (stored.get("status") or {})


def test_a_function_account_is_refused_what_its_role_does_not_grant(
    plane: ControlPlane, api: httpx.Client, namespace: str, tmp_path: Path, client_of: ClientOf
) -> None:
    """The product's client with a TokenRequest token of an account bound to resync's ClusterRole
    in one namespace (its own account stays clean for the audit's "never denied" check): its lists
    are served, a list of Models (granted `get` only) is a permanent 403 refusal."""
    api.post(
        f"/api/v1/namespaces/{namespace}/serviceaccounts", json={"metadata": {"name": "reader"}}
    ).raise_for_status()
    binding = {
        "metadata": {"name": "reader"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "loraflow-resync",
        },
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
    }
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings"
    api.post(rbac, json=binding).raise_for_status()
    token = plane.service_account_token(namespace, "reader")
    reader = client_of(plane.write_kubeconfig(tmp_path / "kubeconfig", token))
    assert reader.list_all(VLLM_ADAPTER, namespace) == []
    with pytest.raises(KubeRefused) as refused:
        reader.list_all(MODEL, namespace)
    assert refused.value.status == 403
    assert f"{namespace}:reader" in str(refused.value) and "cannot list resource" in str(refused.value)


def test_keepalive_tls_checks_the_name_asked_for(plane: ControlPlane) -> None:
    """The certificate is checked against `server_name` (a kubeconfig's tls-server-name) when
    given, else against the host of the URL."""
    assert plane.tls is not None
    context = ssl.create_default_context(cadata=plane.tls.ca_pem.decode())
    headers = {"Authorization": f"Bearer {plane.admin_token}"}
    with closing(KeepAlive(plane.url.replace("127.0.0.1", "localhost"), context)) as by_host:
        assert by_host.request("GET", "/api/v1/namespaces", headers, None).status == 200
    with closing(KeepAlive(plane.url, context, server_name="localhost")) as by_name:
        assert by_name.request("GET", "/api/v1/namespaces", headers, None).status == 200
    with (
        closing(KeepAlive(plane.url, context, server_name="api.elsewhere.example")) as wrong,
        pytest.raises(TransportError, match="certificate"),
    ):
        wrong.request("GET", "/api/v1/namespaces", headers, None)


def kubeconfig_with(plane: ControlPlane, path: Path, **cluster: Any) -> Path:
    """The admin kubeconfig with its cluster entry changed (a None value removes the key)."""
    config = plane.kubeconfig()
    entry = config["clusters"][0]["cluster"]
    entry.update(cluster)
    config["clusters"][0]["cluster"] = {k: v for k, v in entry.items() if v is not None}
    path.write_text(json.dumps(config))
    return path


def test_the_devstack_kubeconfig_works_as_written(
    plane: ControlPlane, namespace: str, tmp_path: Path, client_of: ClientOf
) -> None:
    """certificate-authority-data and a bearer token, as `make serve` writes them."""
    client = client_of(plane.write_kubeconfig(tmp_path / "kubeconfig"))
    assert client.get(POD, namespace, "absent") is None
    assert client.list_all(POD, namespace) == []


def test_a_kubeconfigs_tls_server_name_is_the_name_checked(
    plane: ControlPlane, namespace: str, tmp_path: Path, client_of: ClientOf
) -> None:
    named = kubeconfig_with(plane, tmp_path / "named", **{"tls-server-name": "localhost"})
    assert client_of(named).list_all(POD, namespace) == []
    elsewhere = kubeconfig_with(plane, tmp_path / "elsewhere", **{"tls-server-name": "api.elsewhere.example"})
    with pytest.raises(KubeUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
        client_of(elsewhere).list_all(POD, namespace)


def test_the_functions_client_verifies_the_servers_ca(
    plane: ControlPlane, tmp_path: Path, client_of: ClientOf
) -> None:
    """A server whose certificate another CA signed is refused: the CA data is used, not
    skipped (and neither is the system's bundle enough)."""
    other = issue(tmp_path / "other-pki")
    foreign = kubeconfig_with(
        plane, tmp_path / "foreign", **{"certificate-authority-data": base64.b64encode(other.ca_pem).decode()}
    )
    with pytest.raises(KubeUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
        client_of(foreign).get(POD, "default", "absent")
    system_only = kubeconfig_with(plane, tmp_path / "system", **{"certificate-authority-data": None})
    with pytest.raises(KubeUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
        client_of(system_only).get(POD, "default", "absent")


def test_lists_page_through_continue_tokens_and_select_by_label(
    plane: ControlPlane, api: httpx.Client, namespace: str, tmp_path: Path, client_of: ClientOf
) -> None:
    for index in range(5):
        body = {
            "apiVersion": VLLM_ADAPTER.api_version,
            "kind": "LoRAAdapter",
            "metadata": {"name": f"a{index}", "labels": {"team": "a" if index % 2 else "b"}},
            "spec": {"model": "m"},
        }
        api.post(f"/apis/rackai.rackspace.com/v1alpha1/namespaces/{namespace}/loraadapters", json=body)
    client = client_of(plane.write_kubeconfig(tmp_path / "kubeconfig"))
    paged = client.list_all(VLLM_ADAPTER, namespace, page_size=2)
    assert [o["metadata"]["name"] for o in paged] == ["a0", "a1", "a2", "a3", "a4"]
    selected = client.list_all(VLLM_ADAPTER, namespace, "team=a", page_size=1)
    assert [o["metadata"]["name"] for o in selected] == ["a1", "a3"]


def test_a_sized_list_sets_each_page_limit_from_the_page_before_it(
    plane: ControlPlane, api: httpx.Client, namespace: str, tmp_path: Path, client_of: ClientOf
) -> None:
    """The real server takes a different limit with each continue token: pages of 1, 2, 3, ...
    objects, each sized from what the last one held, and no object lost or repeated."""
    for index in range(7):
        body = {
            "apiVersion": VLLM_ADAPTER.api_version,
            "kind": "LoRAAdapter",
            "metadata": {"name": f"a{index}"},
            "spec": {"model": "m"},
        }
        api.post(f"/apis/rackai.rackspace.com/v1alpha1/namespaces/{namespace}/loraadapters", json=body)
    seen: list[list[str]] = []

    def size(last: Sequence[dict[str, Any]]) -> int:
        seen.append([o["metadata"]["name"] for o in last])
        return len(last) + 1

    client = client_of(plane.write_kubeconfig(tmp_path / "kubeconfig"))
    names = [o["metadata"]["name"] for o in client.iter(VLLM_ADAPTER, namespace, page_size=size)]
    assert names == [f"a{index}" for index in range(7)]
    assert seen == [[], ["a0"], ["a1", "a2"], ["a3", "a4", "a5"]]


def test_a_recorded_event_is_admitted_and_recorded_once_per_window(
    plane: ControlPlane, api: httpx.Client, namespace: str, tmp_path: Path, client_of: ClientOf
) -> None:
    """The product's core/v1 Event as the real server validates it; the same failure met again
    in the window is the same Event (its name), not a second one."""
    body = {
        "apiVersion": VLLM_ADAPTER.api_version,
        "kind": "LoRAAdapter",
        "metadata": {"name": "e"},
        "spec": {"model": "m"},
    }
    adapter = api.post(
        f"/apis/rackai.rackspace.com/v1alpha1/namespaces/{namespace}/loraadapters", json=body
    ).json()
    client = client_of(plane.write_kubeconfig(tmp_path / "kubeconfig"))
    now = datetime.now(UTC)
    for _ in range(2):
        client.record_event(adapter, "Warning", "ModelNotFound", "no Model m", "admit", now)
    (event,) = api.get(f"/api/v1/namespaces/{namespace}/events").json()["items"]
    assert (event["type"], event["reason"], event["message"]) == ("Warning", "ModelNotFound", "no Model m")
    assert event["involvedObject"]["uid"] == adapter["metadata"]["uid"]
    assert event["source"] == {"component": "loraflow-admit"}


def test_a_kubeconfig_proxy_url_tunnels_every_request_through_the_proxy(
    plane: ControlPlane, namespace: str, tmp_path: Path, client_of: ClientOf
) -> None:
    """A kubeconfig's `proxy-url` (an HTTP CONNECT proxy): the client's requests reach the real
    API server only through the tunnel, the certificate still checked end to end."""
    proxy = ConnectProxy()
    try:
        config = plane.kubeconfig()
        config["clusters"][0]["cluster"]["proxy-url"] = proxy.url
        path = tmp_path / "kubeconfig"
        path.write_text(json.dumps(config), encoding="utf-8")
        client = client_of(path)
        assert client.list_all(VLLM_ADAPTER, namespace) == []
        assert client.get(POD, namespace, "absent") is None
        host, port = plane.url.removeprefix("https://").rsplit(":", 1)
        assert proxy.tunnels and set(proxy.tunnels) == {f"{host}:{port}"}
    finally:
        proxy.stop()
