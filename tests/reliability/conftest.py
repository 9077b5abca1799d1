"""Reliability suite: re-uses the functions harness (`world`) and records RBAC denials.

The Kubernetes stand-in answers 403 to a request its RBAC rules refuse but keeps no record of
it, so the authorizer is wrapped here (at collection time, before any server starts) to note
every denial; `test_rbac_used` asserts the functions' ServiceAccount was never refused.
"""

from __future__ import annotations

import threading
from typing import NamedTuple

from devstack.kube.errors import ApiError
from devstack.kube.rbac import Attributes, Authorizer, User
from tests.functions.conftest import world  # noqa: F401


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


if getattr(Authorizer.authorize, "__name__", "") != _recording_authorize.__name__:
    Authorizer.authorize = _recording_authorize  # type: ignore[method-assign]
