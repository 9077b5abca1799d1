"""18. The transport against what it calls: CPU per Kubernetes request of the functions' one
transport (functions/transport: keep-alive HTTP/1.1 on http.client's sockets) and of the
general client a user would pick instead (httpx, one Client with the same TLS context and
headers), each beside the real kube-apiserver's and etcd's CPU for the same requests.

Three requests a step makes most: a GET of one adapter, a merge PATCH of its status, a LIST
page of 100 adapters. Each client makes each request REPEAT times in turn, on kept connections,
after a warm-up; our CPU is this process's (`time.process_time`), the servers' from /proc less
their idle rate. Target: the transport costs no more CPU per request than the server it calls.
"""

from __future__ import annotations

import json
import ssl
import time
from collections.abc import Callable

import httpx

from bench import world as w
from bench.common import Result
from bench.cpu import idle_server_cpu, net, server_cpu
from devstack.kubernetes import ControlPlane
from functions.adapters.kube import HEADERS, KubeApi
from functions.adapters.kubeconfig import load
from functions.resources.kinds import VLLM_ADAPTER

Call = Callable[[str, str, bytes | None, str], None]


def _adapters(world: w.World, count: int) -> tuple[str, str]:
    ns = world.namespace()
    for index in range(count):
        world.create(VLLM_ADAPTER, ns, {"metadata": {"name": f"a{index}"}, "spec": {"model": "m"}})
    base = f"/apis/{VLLM_ADAPTER.group}/{VLLM_ADAPTER.version}/namespaces/{ns}/{VLLM_ADAPTER.plural}"
    return base, ns


def _ours(kubeconfig: str) -> tuple[Call, Callable[[], None]]:
    api = KubeApi(load(kubeconfig))

    def call(method: str, path: str, body: bytes | None, content_type: str) -> None:
        api.request(method, path, body=json.loads(body) if body else None, content_type=content_type)

    return call, api.close


def _httpx(plane: ControlPlane) -> tuple[Call, Callable[[], None]]:
    assert plane.tls is not None
    context = ssl.create_default_context(cadata=plane.tls.ca_pem.decode())
    client = httpx.Client(
        base_url=plane.url,
        verify=context,
        headers={**HEADERS, "Authorization": f"Bearer {plane.admin_token}"},
        timeout=30.0,
    )

    def call(method: str, path: str, body: bytes | None, content_type: str) -> None:
        headers = {"Content-Type": content_type} if body else {}
        response = client.request(method, path, content=body, headers=headers)
        response.raise_for_status()
        response.json()

    return call, client.close


def _measure(
    plane: ControlPlane,
    call: Call,
    requests: list[tuple[str, str, bytes | None, str]],
    repeat: int,
    idle: dict[str, float],
) -> dict[str, float]:
    for request in requests:  # warm: connections, TLS sessions
        call(*request)
    ours, servers, began = time.process_time(), server_cpu(plane), time.perf_counter()
    for _ in range(repeat):
        for request in requests:
            call(*request)
    elapsed = time.perf_counter() - began
    spent = net({k: v - servers.get(k, 0.0) for k, v in server_cpu(plane).items()}, idle, elapsed)
    count = repeat * len(requests)
    return {
        "ours_us": round((time.process_time() - ours) / count * 1e6, 1),
        "server_us": round(sum(spent.values()) / count * 1e6, 1),
        "wall_us": round(elapsed / count * 1e6, 1),
    }


def run(smoke: bool) -> Result:
    repeat = 20 if smoke else 200
    with w.world(functions=False) as world:
        base, _ = _adapters(world, 100)
        patch = json.dumps({"status": {"observedGeneration": 1}}).encode()
        kinds: dict[str, list[tuple[str, str, bytes | None, str]]] = {
            "get": [("GET", f"{base}/a0", None, "")],
            "patch status": [("PATCH", f"{base}/a1/status", patch, "application/merge-patch+json")],
            "list 100": [("GET", f"{base}?limit=100", None, "")],
        }
        plane = world.kube.plane
        kubeconfig = str(plane.write_kubeconfig(plane.dir / "bench-transport.kubeconfig"))
        idle = idle_server_cpu(plane)
        measured: dict[str, dict[str, dict[str, float]]] = {}
        for client, (call, close) in (("transport", _ours(kubeconfig)), ("httpx", _httpx(plane))):
            try:
                measured[client] = {k: _measure(plane, call, r, repeat, idle) for k, r in kinds.items()}
            finally:
                close()
    ours = measured["transport"]
    worst = max(ours[k]["ours_us"] / max(ours[k]["server_us"], 1e-9) for k in ours)
    mean_ours = sum(m["ours_us"] for m in ours.values()) / len(ours)
    mean_httpx = sum(m["ours_us"] for m in measured["httpx"].values()) / len(ours)
    return Result(
        name="transport",
        title="CPU per Kubernetes request: the functions' transport and httpx, beside the API server's",
        value=round(mean_ours, 1),
        unit="us of our CPU per request (mean of get, patch, list 100)",
        reference=round(mean_httpx, 1),
        ratio=round(mean_ours / mean_httpx, 3),
        target="the transport's CPU per request <= the API server's and etcd's for it",
        met=worst <= 1.0,
        details={"repeat": repeat, "by_request": measured, "worst_ours_over_server": round(worst, 3)},
        note="reference = httpx.Client on the same kept TLS connections; per request (us): "
        + "; ".join(
            f"{k}: transport {ours[k]['ours_us']:.0f}, httpx {measured['httpx'][k]['ours_us']:.0f}, "
            f"server {ours[k]['server_us']:.0f}"
            for k in ours
        ),
    )
