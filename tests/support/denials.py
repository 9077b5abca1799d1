"""Every request the Kubernetes stand-in's RBAC refused, recorded for tests/reliability.

The stand-in answers 403 to a request its RBAC rules refuse but keeps no record of it, so
`record()` wraps the authorizer (tests/reliability/conftest.py calls it at collection time,
before any server starts) to note every denial; `test_rbac_used` asserts the functions'
ServiceAccount was never refused.
"""

from __future__ import annotations

import threading
from typing import NamedTuple

from devstack.standins.kube.errors import ApiError
from devstack.standins.kube.rbac import Attributes, Authorizer, User


class Denial(NamedTuple):
    user: str
    verb: str
    group: str
    resource: str
    subresource: str
    namespace: str


DENIALS: list[Denial] = []
_LOCK = threading.Lock()
_ORIGINAL = Authorizer.authorize


def _recording_authorize(self: Authorizer, user: User, attrs: Attributes) -> None:
    try:
        _ORIGINAL(self, user, attrs)
    except ApiError:
        with _LOCK:
            DENIALS.append(
                Denial(user.name, attrs.verb, attrs.group, attrs.resource, attrs.subresource, attrs.namespace)
            )
        raise


def record() -> None:
    """Wrap the authorizer once (idempotent: conftest may be imported more than once)."""
    if getattr(Authorizer.authorize, "__name__", "") != _recording_authorize.__name__:
        Authorizer.authorize = _recording_authorize  # type: ignore[method-assign]
