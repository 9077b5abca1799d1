"""A TLS proxy in front of the real kube-apiserver that injects the faults the suites need.

The functions reach the API server through it (their kubeconfigs name it); everything is
forwarded unchanged over TLS to kube-apiserver, and the answers (watches too) are streamed
back, unless a fault matches first. A fault matches a request by verb and resource as the API
server names them (its RequestInfo: `get`, `list`, `watch`, `create`, `update`, `patch`,
`delete`, `deletecollection`; `loraadapters` or `loraadapters/status`) and either answers with
a `Status` of the server's shape (a 409 is the optimistic-lock conflict kube-apiserver
returns) or delays the request, then forwards it. It serves the certificate of the control
plane, so clients verify it with the same CA."""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any

from devstack.kubernetes.pki import Certificate
from devstack.seaweedfs.faultproxy import FaultProxy, _read_body

REASONS = {
    400: "BadRequest",
    403: "Forbidden",
    404: "NotFound",
    409: "Conflict",
    410: "Expired",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}
WATCH_READ_S = 3600.0
"""A watch may stay quiet for minutes: the upstream read waits as long as the client does."""


@dataclass
class KubeFault:
    """Answer `status` and/or wait `delay_s` for the next `times` matching requests (None: all)."""

    status: int | None = None
    times: int | None = 1
    verb: str | None = None
    resource: str | None = None
    delay_s: float = 0.0
    hits: int = 0

    def matches(self, verb: str, resource: str) -> bool:
        return (
            self.verb in (None, verb)
            and self.resource in (None, resource)
            and (self.times is None or self.hits < self.times)
        )


def request_info(method: str, target: str) -> tuple[str, str, str, str]:
    """(verb, resource[/subresource], group, name) of a request, as kube-apiserver's
    RequestInfoFactory reads the path: `/api/v1/...` or `/apis/<group>/<version>/...`, then
    `namespaces/<ns>/` unless the resource is namespaces itself."""
    split = urllib.parse.urlsplit(target)
    parts = [urllib.parse.unquote(p) for p in split.path.strip("/").split("/") if p]
    if parts[:1] == ["api"]:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, rest = parts[1], parts[3:]
    else:
        return method.lower(), "", "", ""
    if len(rest) >= 3 and rest[0] == "namespaces":
        rest = rest[2:]
    resource, name = [*rest, "", ""][:2]
    subresource = rest[2] if len(rest) > 2 else ""
    query = urllib.parse.parse_qs(split.query)
    watching = query.get("watch", [""])[0] in ("true", "1")
    verbs = {"POST": "create", "PUT": "update", "PATCH": "patch"}
    if method in verbs:
        verb = verbs[method]
    elif method == "DELETE":
        verb = "delete" if name else "deletecollection"
    elif watching:
        verb = "watch"
    else:
        verb = "get" if name else "list"
    return verb, f"{resource}/{subresource}" if subresource else resource, group, name


def status_body(code: int, group: str, resource: str, name: str) -> dict[str, Any]:
    """A metav1.Status as kube-apiserver writes it for `code` (apimachinery's errors package)."""
    plural = resource.split("/")[0]
    qualified = f"{plural}.{group}" if group else plural
    if code == 409:
        message = (
            f'Operation cannot be fulfilled on {qualified} "{name}": the object has been modified; '
            "please apply your changes to the latest version and try again"
        )
    else:
        message = f"injected fault ({code})"
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": REASONS.get(code, "Unknown"),
        "details": {"name": name, "group": group, "kind": plural},
        "code": code,
    }


class KubeFaultProxy(FaultProxy):
    """`url` is what clients use; `upstream` is kube-apiserver behind it."""

    scheme = "https"

    def __init__(self, upstream: str, tls: Certificate, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(upstream, host, port)
        self._upstream_tls = ssl.create_default_context(cafile=str(tls.ca_file))
        serving = tls.server_context()
        self._server.socket = serving.wrap_socket(
            self._server.socket, server_side=True, do_handshake_on_connect=False
        )
        self._kube_faults: list[KubeFault] = []
        self._kube_lock = threading.Lock()

    def inject_kube(
        self,
        status: int | None = None,
        times: int | None = 1,
        verb: str | None = None,
        resource: str | None = None,
        delay_s: float = 0.0,
    ) -> KubeFault:
        fault = KubeFault(status, times, verb, resource, delay_s)
        with self._kube_lock:
            self._kube_faults.append(fault)
        return fault

    def clear_faults(self) -> None:
        with self._kube_lock:
            self._kube_faults.clear()
        super().clear_faults()

    def _take_kube(self, verb: str, resource: str) -> KubeFault | None:
        with self._kube_lock:
            self.requests += 1
            for fault in self._kube_faults:
                if fault.matches(verb, resource):
                    fault.hits += 1
                    self.faults_fired += 1
                    return fault
        return None

    def _serve(self, request: BaseHTTPRequestHandler) -> None:
        body = _read_body(request)
        verb, resource, group, name = request_info(request.command, request.path)
        fault = self._take_kube(verb, resource)
        if fault is not None:
            if fault.delay_s:
                time.sleep(fault.delay_s)
            if fault.status is not None:
                _status(request, fault.status, status_body(fault.status, group, resource, name))
                return
        self._forward(request, body)

    def _connect(self) -> http.client.HTTPConnection:
        return _Upstream(*self._target, self._upstream_tls)

    def _unreachable(self, request: BaseHTTPRequestHandler, err: OSError) -> None:
        _status(
            request, 503, {**status_body(503, "", "", ""), "message": f"kube-apiserver unreachable: {err}"}
        )


class _Upstream(http.client.HTTPConnection):
    """kube-apiserver behind the proxy, over TLS. The socket is wrapped before it connects:
    Python 3.11.7's wrap of a connected socket leaks the socket it made when a stopping server
    resets the connection in between (python/cpython#113280)."""

    def __init__(self, host: str, port: int, context: ssl.SSLContext) -> None:
        super().__init__(host, port, timeout=WATCH_READ_S)
        self._tls = context

    def connect(self) -> None:
        sock = self._tls.wrap_socket(socket.socket(), server_hostname=self.host)
        try:
            sock.settimeout(self.timeout)
            # as http.client's own connect: without it Nagle holds the request behind the
            # handshake's last segment until the server's delayed ACK
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.connect((self.host, self.port))
        except OSError:
            sock.close()
            raise
        self.sock = sock


def _status(request: BaseHTTPRequestHandler, code: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    request.send_response(code)
    request.send_header("Content-Type", "application/json")
    request.send_header("Content-Length", str(len(data)))
    if code == 429:
        request.send_header("Retry-After", "1")
    request.end_headers()
    request.wfile.write(data)
