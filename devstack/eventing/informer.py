"""List and watch one kind on the real kube-apiserver, as client-go's Reflector does.

What Knative's adapters and its broker filter build on (`k8s.io/client-go/tools/cache/reflector.go`:
ListAndWatch), reduced to what the embedded stack needs:
- a list, then a watch from the list's `resourceVersion` with `allowWatchBookmarks=true`; every
  event, bookmarks included, moves the resume point, so a watch that ends (its `timeoutSeconds`,
  a dropped connection, a stopped kube-apiserver) resumes where the last one stopped;
- a resume point the server no longer holds is answered, on a real kube-apiserver, with HTTP 200
  and one `ERROR` event carrying a `410 Expired` Status ("too old resource version: 336 (339)"),
  not with an HTTP 410: then a relist, and `on_replace` with what the list holds (the reflector's
  `Replace`, logged at info level as client-go does, not as a failure). A kube-apiserver that
  was restarted answers every resume point from before its restart so: its watch cache starts
  at the current revision;
- `429 storage is (re)initializing` (a restarted kube-apiserver's custom resources for a moment
  after /readyz turns 200), 5xx and refused connections are retried with a capped backoff, as
  the reflector's backoff manager does.
`on_event(type, object)` gets ADDED / MODIFIED / DELETED in watch order; `on_replace(objects)`
gets the full list after each (re)list.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import ssl
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from kubernetes import client

log = logging.getLogger("devstack.eventing.informer")

WATCH_WINDOW_S = 30
"""Each watch asks the server to end it after this long (client-go picks 5-10 minutes)."""
BACKOFF_S = (0.1, 2.0)
EVENT_TYPES = ("ADDED", "MODIFIED", "DELETED")
Obj = dict[str, Any]


class Expired(Exception):
    """The server no longer holds the resume point (a 410 Expired / Gone)."""


@dataclass(frozen=True)
class Connection:
    """Where a kube-apiserver answers and with which credential."""

    url: str
    token: str
    ca_file: str | None = None

    @classmethod
    def of(cls, api: client.ApiClient) -> Connection:
        """The server, bearer token and CA of a kubernetes client (as a kubeconfig loaded it)."""
        conf = api.configuration
        keys = conf.api_key or {}
        token = str(keys.get("BearerToken") or keys.get("authorization") or "")
        return cls(str(conf.host).rstrip("/"), token.removeprefix("Bearer ").strip(), conf.ssl_ca_cert)

    def client(self, timeout: float) -> httpx.Client:
        verify: ssl.SSLContext | bool = (
            ssl.create_default_context(cafile=self.ca_file) if self.ca_file else True
        )
        return httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {self.token}", "Accept": "application/json"},
            verify=verify,
            timeout=httpx.Timeout(timeout, read=WATCH_WINDOW_S + 15),
        )


class Informer:
    """List+watch of `path` (a collection, e.g. `/apis/g/v/namespaces/ns/plural`) on a thread."""

    def __init__(
        self,
        connection: Connection,
        path: str,
        on_event: Callable[[str, Obj], None],
        on_replace: Callable[[Sequence[Obj]], None] | None = None,
        *,
        label_selector: str = "",
        name: str = "informer",
        timeout_s: float = 10.0,
        window_s: int = WATCH_WINDOW_S,
    ) -> None:
        self.path = path
        self.name = name
        self._on_event = on_event
        self._on_replace = on_replace
        self._params = {"labelSelector": label_selector} if label_selector else {}
        self.window_s = window_s
        self._http = connection.client(timeout_s)
        self._stop = threading.Event()
        self._response: httpx.Response | None = None
        self._lock = threading.Lock()
        self.resource_version = ""
        self.expired = 0
        """Watches the server answered with 410 Expired: each one was followed by a relist."""
        self.bookmarks = 0
        self.relists = 0
        self.failures = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self, initial_list: bool = True) -> Informer:
        """List once here (errors raise: the caller learns at start that it cannot watch), then
        watch on a thread. `initial_list=False`: the caller set `resource_version` itself."""
        if initial_list:
            self.relist()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            response = self._response
        if response is not None:
            _interrupt(response)
        self._thread.join(timeout=5)
        self._http.close()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    # -- list -------------------------------------------------------------------------------------
    def relist(self) -> list[Obj]:
        """The whole collection (paged), handed to `on_replace`; the watch resumes from its version."""
        items: list[Obj] = []
        params: dict[str, str] = {**self._params, "limit": "500"}
        while True:
            answer = self._http.get(self.path, params=params)
            _raise_for(answer)
            body = answer.json()
            items += body.get("items") or []
            cont = (body.get("metadata") or {}).get("continue")
            if not cont:
                break
            params["continue"] = cont
        self.resource_version = str(body["metadata"]["resourceVersion"])
        self.relists += 1
        if self._on_replace is not None:
            self._on_replace(items)
        return items

    # -- watch ------------------------------------------------------------------------------------
    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                self._watch()
                failures = 0
            except Expired as err:
                self.expired += 1
                log.info("%s: %s; relisting", self.name, err)
                failures = self._relist(failures)
            except Exception as err:
                if self._stop.is_set():
                    return
                self.failures += 1
                failures += 1
                # the first failure of an outage is worth a line; its repeats are not
                (log.warning if failures == 1 else log.debug)("%s: watch failed: %s", self.name, err)
                self._stop.wait(min(BACKOFF_S[1], BACKOFF_S[0] * 2 ** min(failures, 8)))

    def _relist(self, failures: int) -> int:
        while not self._stop.is_set():
            try:
                self.relist()
                return 0
            except Exception as err:
                failures += 1
                (log.warning if failures == 1 else log.debug)("%s: relist failed: %s", self.name, err)
                self._stop.wait(min(BACKOFF_S[1], BACKOFF_S[0] * 2 ** min(failures, 8)))
        return failures

    def _watch(self) -> None:
        params = {
            **self._params,
            "watch": "true",
            "resourceVersion": self.resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(self.window_s),
        }
        request = self._http.build_request("GET", self.path, params=params)
        response = self._http.send(request, stream=True)
        with self._lock:
            self._response = response
        try:
            if response.status_code != 200:
                response.read()
                _raise_for(response)
            for line in response.iter_lines():
                if self._stop.is_set():
                    return
                if line:
                    self._handle(json.loads(line))
        finally:
            with self._lock:
                self._response = None
            response.close()

    def _handle(self, event: Mapping[str, Any]) -> None:
        kind, obj = str(event.get("type")), dict(event.get("object") or {})
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise Expired(f"{obj.get('reason')}: {obj.get('message')}")
            raise RuntimeError(f"watch error {obj.get('code')} {obj.get('reason')}: {obj.get('message')}")
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if kind == "BOOKMARK":
            self.bookmarks += 1
        elif kind in EVENT_TYPES:
            self._on_event(kind, obj)
        if version:
            self.resource_version = str(version)


def _raise_for(answer: httpx.Response) -> None:
    if answer.status_code == 410:
        raise Expired(answer.text[:200])
    if answer.status_code != 200:
        raise RuntimeError(f"HTTP {answer.status_code}: {answer.text[:300]}")


def _interrupt(response: httpx.Response) -> None:
    """Wake the thread blocked reading `response`: closing a socket another thread reads does
    not wake it on Linux, shutting it down does."""
    stream = response.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    if isinstance(sock, socket.socket):
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(Exception):
        response.close()
