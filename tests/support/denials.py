"""Every request kube-apiserver's RBAC authorizer refused, read from its audit log: the
decision `forbid` it records beside each request (tests/reliability/test_rbac_used asserts the
functions' ServiceAccounts were never refused)."""

from __future__ import annotations

from typing import NamedTuple

from devstack.kubernetes.audit import AuditLog


class Denial(NamedTuple):
    user: str
    verb: str
    group: str
    resource: str
    subresource: str
    namespace: str


def denials(audit: AuditLog) -> list[Denial]:
    return [
        Denial(r.user, r.verb, r.group, r.resource, r.subresource, r.namespace)
        for r in audit.since(0)
        if r.decision == "forbid"
    ]
