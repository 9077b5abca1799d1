"""Our small exception hierarchy: the edge maps each family to exactly one HTTP outcome.

- Reject: the event can never be processed -> 400 (the Broker dead-letters it);
  Unauthorized (a Reject) -> 401.
- Retryable: a dependency failed or raced -> 503 (the Broker redelivers with backoff).
A domain verdict (an MD5 mismatch, a missing Model) is not an exception: it is status.
"""

from __future__ import annotations


class LoraflowError(Exception):
    """Base of every error we raise on purpose."""


class Reject(LoraflowError, ValueError):
    """The event is malformed or names something invalid; retrying cannot help."""


class Unauthorized(Reject):
    """A request that must carry a credential (the SeaweedFS webhook token) did not -> 401."""


class Retryable(LoraflowError):
    """A dependency is down, slow or raced us; the Broker should deliver again later."""


class KubeUnavailable(Retryable):
    """The Kubernetes API answered 5xx/429, timed out, or could not be reached."""


class KubeConflict(Retryable):
    """A resourceVersion precondition kept failing after bounded re-reads."""


class StorageUnavailable(Retryable):
    """The filer or S3 answered 5xx, timed out, or could not be reached."""


class EngineUnavailable(Retryable):
    """Some engine replicas could not be reached; status says which, a retry finishes the job."""
