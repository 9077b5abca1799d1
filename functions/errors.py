"""Our exception tree: the edge maps each family to exactly one HTTP outcome.

    LoraflowError
    +-- Reject (ValueError) ........ 400: the event can never be processed (dead-lettered)
    |   +-- Unauthorized ............ 401: the webhook came without the right token
    +-- Retryable .................. 503: a dependency failed or raced; the Broker redelivers
    |   +-- KubeUnavailable, KubeConflict, StorageUnavailable, EngineUnavailable
    +-- Refused .................... 204: an answer given on purpose that no retry changes
        +-- KubeRefused ............. (403, 422, 400, etcd "request is too large")
        +-- ConfigError ............. (a kubeconfig or setting that cannot work)

A domain verdict (an MD5 mismatch, a missing Model) is not an exception: it is status.
A Refused is logged once as a warning, never as a crash; the resync repairs what it left.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import ValidationError

SHOWN_PROBLEMS = 5
"""How many validation problems a 400 names: enough to fix the sender; a flood helps nobody."""
SHOWN_KEY_CHARS = 64
"""A path names the sender's own keys (an unknown one, a map's): each is cut to this length."""


class LoraflowError(Exception):
    """Base of every error we raise on purpose."""


class Reject(LoraflowError, ValueError):
    """The event is malformed or names something invalid; retrying cannot help."""


class Unauthorized(Reject):
    """A request that must carry a credential (the SeaweedFS webhook token) did not -> 401."""


class BodyTooLarge(Reject):
    """A request body over the edge's limit: refused (413) before it is read past it."""


class Retryable(LoraflowError):
    """A dependency is down, slow or raced us; the Broker should deliver again later."""


class KubeUnavailable(Retryable):
    """The Kubernetes API answered 5xx/429, timed out, or could not be reached."""


class KubeConflict(Retryable):
    """A resourceVersion precondition kept failing after bounded re-reads."""


class StorageUnavailable(Retryable):
    """The filer or S3 answered 5xx, timed out, or could not be reached."""


class WebhookNotConfigured(Retryable):
    """The webhook has no token to check: it refuses every notification (503) until it has one."""


class EngineUnavailable(Retryable):
    """Some engine replicas could not be reached; status says which, a retry finishes the job."""


class Refused(LoraflowError):
    """Something answered no on purpose (RBAC, validation, size): retrying cannot help."""


class KubeRefused(Refused):
    """The API refused a request for a reason a retry will not fix (403, 422, 400, too large)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class ConfigError(Refused):
    """A kubeconfig, credential or setting that cannot work as given."""


def problems(err: ValidationError, limit: int = SHOWN_PROBLEMS) -> str:
    """pydantic's problems as `path.to.field: reason`, the first `limit` of them and how many
    more. Never the offending values (a hostile sender's text is not echoed back, nor a
    secret), and no documentation URLs: the path and the reason are what fixes a request."""
    found = err.errors(include_url=False, include_context=False, include_input=False)
    shown = [f"{_path(e['loc'])}: {e['msg']}" for e in found[:limit]]
    more = f" (and {len(found) - limit} more)" if len(found) > limit else ""
    return "; ".join(shown) + more


def _path(loc: tuple[int | str, ...]) -> str:
    parts = [str(p) if len(str(p)) <= SHOWN_KEY_CHARS else str(p)[:SHOWN_KEY_CHARS] + "..." for p in loc]
    return ".".join(parts) or "data"
