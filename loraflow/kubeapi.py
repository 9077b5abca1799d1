"""The few Kubernetes calls the CLI makes, with API failures turned into one clear message."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError as Urllib3Error

from functions.resources.kinds import Kind
from loraflow.errors import CliError

Obj = dict[str, Any]
T = TypeVar("T")


def _message(err: ApiException) -> str:
    try:
        body = json.loads(err.body or "")
    except (TypeError, ValueError):
        return str(err.reason or err.status)
    return str(body.get("message") or err.reason) if isinstance(body, dict) else str(err.reason)


def call(what: str, request: Callable[[], T]) -> T:
    """Run one API request; connection failures and refusals become CliError."""
    try:
        return request()
    except ApiException as err:
        raise CliError(f"{what}: HTTP {err.status}: {_message(err)}") from err
    except (Urllib3Error, OSError) as err:
        raise CliError(f"{what}: cannot reach the Kubernetes API ({err})") from err


class KubeCall:
    """Custom objects of one kind: get, list, create, merge-patch."""

    def __init__(self, api: client.ApiClient, kind: Kind) -> None:
        self._custom = client.CustomObjectsApi(api)
        self._kind = kind

    def _args(self) -> tuple[str, str]:
        return self._kind.group, self._kind.version

    def get(self, namespace: str, name: str) -> Obj | None:
        group, version = self._args()
        try:
            found: Obj = self._custom.get_namespaced_custom_object(
                group, version, namespace, self._kind.plural, name
            )
        except ApiException as err:
            if err.status == 404:
                return None
            what = f"get {self._kind.kind} {namespace}/{name}"
            raise CliError(f"{what}: HTTP {err.status}: {_message(err)}") from err
        except (Urllib3Error, OSError) as err:
            raise CliError(f"get {self._kind.kind}: cannot reach the Kubernetes API ({err})") from err
        return found

    def list(self, namespace: str | None) -> list[Obj]:
        """Every object of the kind in `namespace` (None = all namespaces); [] when the kind is unknown."""
        group, version = self._args()
        try:
            if namespace is None:
                found = self._custom.list_cluster_custom_object(group, version, self._kind.plural)
            else:
                found = self._custom.list_namespaced_custom_object(
                    group, version, namespace, self._kind.plural
                )
        except ApiException as err:
            if err.status == 404:
                return []
            raise CliError(f"list {self._kind.plural}: HTTP {err.status}: {_message(err)}") from err
        except (Urllib3Error, OSError) as err:
            raise CliError(f"list {self._kind.plural}: cannot reach the Kubernetes API ({err})") from err
        items: list[Obj] = found.get("items") or []
        return items

    def create(self, namespace: str, body: Obj) -> bool:
        """True when created, False when it already exists."""
        group, version = self._args()
        name = body["metadata"]["name"]
        try:
            self._custom.create_namespaced_custom_object(group, version, namespace, self._kind.plural, body)
        except ApiException as err:
            if err.status == 409:
                return False
            raise CliError(
                f"create {self._kind.kind} {namespace}/{name}: HTTP {err.status}: {_message(err)}"
            ) from err
        except (Urllib3Error, OSError) as err:
            raise CliError(f"create {self._kind.kind}: cannot reach the Kubernetes API ({err})") from err
        return True

    def merge_patch(self, namespace: str, name: str, body: Obj) -> Obj:
        group, version = self._args()
        patched: Obj = call(
            f"patch {self._kind.kind} {namespace}/{name}",
            lambda: self._custom.patch_namespaced_custom_object(
                group,
                version,
                namespace,
                self._kind.plural,
                name,
                body,
                _content_type="application/merge-patch+json",
            ),
        )
        return patched


def list_pods(api: client.ApiClient, namespace: str, selector: str) -> list[Obj]:
    """Pods as plain JSON dicts (camelCase, like the functions read them)."""
    core = client.CoreV1Api(api)
    response = call(
        f"list pods {selector}",
        lambda: core.list_namespaced_pod(namespace, label_selector=selector, _preload_content=False),
    )
    items: list[Obj] = json.loads(response.data).get("items") or []
    return items
