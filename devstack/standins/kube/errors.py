"""Kubernetes `Status` error bodies, shaped like k8s.io/apimachinery/pkg/api/errors."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

JSON = dict[str, Any]


@dataclass(frozen=True)
class Cause:
    """One `details.causes[]` entry (metav1.StatusCause)."""

    reason: str
    message: str
    field: str

    def text(self) -> str:
        """Rendered like field.Error.Error(): `<field>: <message>`."""
        return f"{self.field}: {self.message}" if self.field else self.message

    def to_json(self) -> JSON:
        return {"reason": self.reason, "message": self.message, "field": self.field}


@dataclass
class ApiError(Exception):
    """An error answered as a `Status` object (kind Status, apiVersion v1, status Failure)."""

    code: int
    reason: str
    message: str
    details: JSON | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.code} {self.reason}: {self.message}"

    def body(self) -> JSON:
        """metav1.Status in its field order; `reason` and `details` are omitempty (an error the
        apiserver does not map, like etcd's, has neither)."""
        status: JSON = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
        }
        if self.reason:
            status["reason"] = self.reason
        if self.details is not None:
            status["details"] = self.details
        status["code"] = self.code
        return status


def qualified(group: str, resource: str) -> str:
    """`schema.GroupResource.String()`: `loraadapters.rackai.rackspace.com` or `pods`."""
    return f"{resource}.{group}" if group else resource


def _details(name: str, group: str, kind: str) -> JSON:
    details: JSON = {"name": name, "kind": kind} if name else {"kind": kind}
    if group:
        details["group"] = group
    return details


def not_found(group: str, resource: str, name: str) -> ApiError:
    """apimachinery errors.NewNotFound: 404 NotFound `<res.group> "<name>" not found`."""
    message = f'{qualified(group, resource)} "{name}" not found'
    return ApiError(404, "NotFound", message, _details(name, group, resource))


def already_exists(group: str, resource: str, name: str) -> ApiError:
    """apimachinery errors.NewAlreadyExists: 409 AlreadyExists."""
    message = f'{qualified(group, resource)} "{name}" already exists'
    return ApiError(409, "AlreadyExists", message, _details(name, group, resource))


def conflict(group: str, resource: str, name: str, why: str | None = None) -> ApiError:
    """apimachinery errors.NewConflict with the storage's OptimisticLockErrorMsg."""
    why = why or (
        "the object has been modified; please apply your changes to the latest version and try again"
    )
    message = f'Operation cannot be fulfilled on {qualified(group, resource)} "{name}": {why}'
    return ApiError(409, "Conflict", message, _details(name, group, resource))


def invalid(kind: str, group: str, name: str, causes: list[Cause]) -> ApiError:
    """apimachinery errors.NewInvalid: 422 Invalid, `<Kind.group> "<name>" is invalid: ...`."""
    texts = [cause.text() for cause in causes]
    joined = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    group_kind = f"{kind}.{group}" if group else kind
    message = f'{group_kind} "{name}" is invalid: {joined}'
    details = _details(name, group, kind)
    details["causes"] = [cause.to_json() for cause in causes]
    return ApiError(422, "Invalid", message, details)


def forbidden(group: str, resource: str, name: str, why: str) -> ApiError:
    """apimachinery errors.NewForbidden: `<res.group> ["<name>" ]is forbidden: <why>`."""
    target = qualified(group, resource)
    message = f'{target} "{name}" is forbidden: {why}' if name else f"{target} is forbidden: {why}"
    return ApiError(403, "Forbidden", message, _details(name, group, resource))


def unauthorized() -> ApiError:
    """apiserver authentication failure: 401 Unauthorized, message `Unauthorized`."""
    return ApiError(401, "Unauthorized", "Unauthorized")


def bad_request(message: str) -> ApiError:
    """apimachinery errors.NewBadRequest: 400 BadRequest."""
    return ApiError(400, "BadRequest", message)


def expired(message: str) -> ApiError:
    """apimachinery errors.NewResourceExpired: 410 Gone, reason Expired."""
    return ApiError(410, "Expired", message)


def unsupported_media_type(content_type: str, accepted: list[str]) -> ApiError:
    """apiserver PATCH with an unsupported Content-Type: 415 UnsupportedMediaType."""
    message = (
        f"the body of the request was in an unknown format - accepted media types include: "
        f"{', '.join(accepted)}"
    )
    del content_type
    return ApiError(415, "UnsupportedMediaType", message)


def method_not_allowed(verb: str) -> ApiError:
    """apiserver: an unsupported verb on a resource answers 405 MethodNotAllowed."""
    message = f"the server does not allow this method on the requested resource ({verb})"
    return ApiError(405, "MethodNotAllowed", message)


def not_found_path() -> ApiError:
    """apiserver: unknown path answers 404 NotFound `the server could not find the requested resource`."""
    return ApiError(404, "NotFound", "the server could not find the requested resource", {})


def internal(message: str) -> ApiError:
    """apimachinery errors.NewInternalError: 500 InternalError."""
    return ApiError(
        500, "InternalError", f"Internal error occurred: {message}", {"causes": [{"message": message}]}
    )


def request_entity_too_large(limit: int) -> ApiError:
    """apimachinery errors.NewRequestEntityTooLargeError, as limitedReadBody
    (apiserver/pkg/endpoints/handlers/rest.go) answers a body over MaxRequestBodyBytes:
    `Error from server (RequestEntityTooLarge): Request entity too large: limit is 3145728`
    (https://github.com/kubernetes/kubernetes/issues/105863)."""
    return ApiError(413, "RequestEntityTooLarge", f"Request entity too large: limit is {limit}")


def etcd_request_too_large() -> ApiError:
    """etcd's ErrRequestTooLarge, which the apiserver does not map to a Status: ErrorToAPIStatus
    (apiserver/pkg/endpoints/handlers/responsewriters/status.go) answers 500 with no reason and
    the error text (https://github.com/kubernetes/kubernetes/issues/74600, .../issues/112152)."""
    return ApiError(500, "", "etcdserver: request is too large")
