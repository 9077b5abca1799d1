"""Every ServiceAccount of knative/rbac (functions.yaml, sources.yaml) and of the filer-source
component, asked of the real authorizer (a SubjectAccessReview per question, what `kubectl auth
can-i --as` asks, which answers a sample of them too): each (verb, resource) its role grants is
allowed, where it grants it; every other verb on those resources, and what no loraflow account
may touch (secrets, creating pods, tokens, roles), is denied. Both sides are read from the
manifests, so a grant added or dropped there changes what is asked."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest

from devstack.eventing.triggers import read_files

Kubectl = Callable[..., subprocess.CompletedProcess[str]]
ROOT = Path(__file__).resolve().parents[2]
FILER_SOURCE_RBAC = ROOT / "knative" / "components" / "filer-source" / "rbac.yaml"
MANIFESTS = [*sorted((ROOT / "knative" / "rbac").glob("*.yaml")), FILER_SOURCE_RBAC]
NAMESPACE = "loraflow"
VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")
SUBRESOURCE_VERBS = ("get", "update", "patch")
FORBIDDEN = [
    ("get", "secrets", ""),
    ("list", "secrets", ""),
    ("create", "pods", ""),
    ("delete", "pods", ""),
    ("create", "pods", "exec"),
    ("update", "pods", "status"),
    ("get", "configmaps", ""),
    ("create", "serviceaccounts", "token"),
    ("create", "rolebindings.rbac.authorization.k8s.io", ""),
    ("escalate", "clusterroles.rbac.authorization.k8s.io", ""),
    ("create", "customresourcedefinitions.apiextensions.k8s.io", ""),
    ("update", "leases.coordination.k8s.io", ""),
    ("*", "*", ""),
]
"""Asked of every account besides the other verbs on its own resources (no role grants these)."""


class Ask(NamedTuple):
    """One `kubectl auth can-i` question: verb, resource (plural.group), subresource, name, where."""

    verb: str
    resource: str
    subresource: str = ""
    name: str = ""
    namespace: str = ""
    """"" for every namespace (-A) or a cluster-scoped resource."""

    def review(self, user: str) -> dict[str, Any]:
        """The SubjectAccessReview of this question for `user` (a ServiceAccount, with the groups
        the API server gives one)."""
        plural, _, group = self.resource.partition(".")
        attributes = {
            "verb": self.verb,
            "resource": plural,
            "group": "*" if plural == "*" else group,
            "subresource": self.subresource,
            "name": self.name,
            "namespace": self.namespace,
        }
        namespace = user.split(":")[2]
        groups = ["system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"]
        return {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {"user": user, "groups": groups, "resourceAttributes": attributes},
        }

    def argv(self, user: str) -> list[str]:
        target = f"{self.resource}/{self.name}" if self.name else self.resource
        where = ["-n", self.namespace] if self.namespace else ["-A"]
        sub = [f"--subresource={self.subresource}"] if self.subresource else []
        return ["auth", "can-i", "--as", user, self.verb, target, *sub, *where]


class Account(NamedTuple):
    name: str
    allowed: frozenset[Ask]
    denied: frozenset[Ask]


def qualified(group: str, resource: str) -> tuple[str, str]:
    plural, _, subresource = resource.partition("/")
    return (f"{plural}.{group}" if group else plural), subresource


def accounts() -> list[Account]:
    """Each ServiceAccount with the questions its bindings' roles answer yes, and the rest no."""
    docs = read_files(MANIFESTS)
    roles = {(d["kind"], d["metadata"]["name"]): d for d in docs if d["kind"] in ("Role", "ClusterRole")}
    found = []
    for account in (d for d in docs if d["kind"] == "ServiceAccount"):
        name = account["metadata"]["name"]
        allowed: set[Ask] = set()
        for binding in (d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")):
            if not any(s["kind"] == "ServiceAccount" and s["name"] == name for s in binding["subjects"]):
                continue
            role = roles[(binding["roleRef"]["kind"], binding["roleRef"]["name"])]
            where = binding["metadata"].get("namespace", "")
            allowed |= grants(role, where)
        found.append(Account(name, frozenset(allowed), frozenset(denials(allowed))))
    return found


def grants(role: dict[str, Any], namespace: str) -> set[Ask]:
    out = set()
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                plural, sub = qualified(group, resource)
                for verb in rule["verbs"]:
                    for name in rule.get("resourceNames") or [""]:
                        out.add(Ask(verb, plural, sub, name, namespace))
    return out


def denials(allowed: set[Ask]) -> set[Ask]:
    """Every other verb on the resources granted (in the same scope), elsewhere for a namespaced
    grant, another object for a grant by name, and the FORBIDDEN list."""
    out = {Ask(verb, resource, sub, namespace=NAMESPACE) for verb, resource, sub in FORBIDDEN}
    for ask in allowed:
        verbs = SUBRESOURCE_VERBS if ask.subresource else VERBS
        out |= {ask._replace(verb=verb) for verb in verbs}
        if ask.namespace:
            out.add(ask._replace(namespace="default"))
        if ask.name:
            out.add(ask._replace(name="another"))
    return out - allowed


ACCOUNTS = accounts()


def test_the_manifests_name_every_account() -> None:
    """ingest and dead-letters hold no grant; every other account has some."""
    names = {a.name: bool(a.allowed) for a in ACCOUNTS}
    assert names == {
        "loraflow-ingest": False,
        "loraflow-dead-letters": False,
        "loraflow-admit": True,
        "loraflow-stat": True,
        "loraflow-verify": True,
        "loraflow-load": True,
        "loraflow-reload": True,
        "loraflow-unload": True,
        "loraflow-resync": True,
        "loraflow-sources": True,
        "loraflow-filer-source": True,
    }


@pytest.fixture(scope="module")
def installed(kubectl: Kubectl) -> None:
    """The filer-source component's Role (the core's RBAC came with the rendered tree)."""
    kubectl("apply", "--server-side", "--field-manager=loraflow-tests", "-f", str(FILER_SOURCE_RBAC))


@pytest.mark.parametrize("account", ACCOUNTS, ids=lambda a: a.name)
def test_each_account_may_do_what_its_role_grants_and_nothing_else(
    api: httpx.Client, installed: None, account: Account
) -> None:
    user = f"system:serviceaccount:{NAMESPACE}:{account.name}"
    answers = {}
    for ask in sorted(account.allowed | account.denied):
        answer = api.post("/apis/authorization.k8s.io/v1/subjectaccessreviews", json=ask.review(user))
        answer.raise_for_status()
        answers[ask] = "yes" if answer.json()["status"].get("allowed") else "no"
    assert {a for a in account.allowed if answers[a] != "yes"} == set(), "granted but denied"
    assert {a for a in account.denied if answers[a] != "no"} == set(), "allowed beyond the role"


@pytest.mark.parametrize("account", [a for a in ACCOUNTS if a.allowed], ids=lambda a: a.name)
def test_kubectl_auth_can_i_answers_as_the_reviews_do(
    kubectl: Kubectl, installed: None, account: Account
) -> None:
    """One granted and one denied question per account through the real kubectl (its
    impersonated SelfSubjectAccessReview), as an operator would check an account."""
    user = f"system:serviceaccount:{NAMESPACE}:{account.name}"
    granted, denied = min(account.allowed), min(account.denied)
    assert kubectl(*granted.argv(user), check=False).stdout.strip() == "yes"
    assert kubectl(*denied.argv(user), check=False).stdout.strip() == "no"
