"""Bearer-token authentication and RBAC authorization (rbac.authorization.k8s.io/v1 rules)."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from devstack.standins.kube import errors
from devstack.standins.kube.errors import ApiError
from devstack.standins.kube.resources import manifest_documents

JSON = dict[str, Any]
RBAC_KINDS = {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"}
ADMIN_USER = "kubernetes-admin"


@dataclass(frozen=True)
class User:
    """An authenticated user (authentication.k8s.io UserInfo)."""

    name: str
    groups: tuple[str, ...]

    @property
    def is_admin(self) -> bool:
        return "system:masters" in self.groups


class AuthorizedRequest(NamedTuple):
    """One authorized (user, verb, group, resource, subresource) combination."""

    user: str
    verb: str
    group: str
    resource: str
    subresource: str


@dataclass(frozen=True)
class Attributes:
    """authorizer.Attributes of a resource request."""

    verb: str
    group: str
    resource: str
    subresource: str
    namespace: str
    name: str


def user_groups(name: str) -> tuple[str, ...]:
    """ServiceAccount users get system:serviceaccounts[:<ns>] and system:authenticated."""
    parts = name.split(":")
    if name.startswith("system:serviceaccount:") and len(parts) == 4:
        return ("system:serviceaccounts", f"system:serviceaccounts:{parts[2]}", "system:authenticated")
    return ("system:authenticated",)


class Authenticator:
    """Static bearer tokens; no/unknown token -> 401 (apiserver token authenticator)."""

    def __init__(self) -> None:
        self._tokens: dict[str, User] = {}
        self.admin_token = self.issue(ADMIN_USER, ("system:masters", "system:authenticated"))

    def issue(self, name: str, groups: tuple[str, ...] = ()) -> str:
        token = secrets.token_urlsafe(24)
        self._tokens[token] = User(name, groups or user_groups(name))
        return token

    def authenticate(self, header: str | None) -> User:
        if not header or not header.startswith("Bearer "):
            raise errors.unauthorized()
        user = self._tokens.get(header[len("Bearer ") :].strip())
        if user is None:
            raise errors.unauthorized()
        return user


def _rule_allows(rule: JSON, attrs: Attributes) -> bool:
    """rbac/v1 RuleAllows: verbs, apiGroups, resources (`res/sub`, `*`, `*/sub`), resourceNames."""
    verbs, groups = rule.get("verbs") or [], rule.get("apiGroups") or []
    if not ("*" in verbs or attrs.verb in verbs) or not ("*" in groups or attrs.group in groups):
        return False
    combined = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
    resources = rule.get("resources") or []
    if not (
        "*" in resources
        or combined in resources
        or (attrs.subresource and f"*/{attrs.subresource}" in resources)
    ):
        return False
    names = rule.get("resourceNames") or []
    return not names or attrs.name in names


def _subject_matches(subject: JSON, user: User, binding_ns: str) -> bool:
    kind, name = subject.get("kind"), subject.get("name")
    if kind == "ServiceAccount":
        namespace = subject.get("namespace") or binding_ns
        return user.name == f"system:serviceaccount:{namespace}:{name}"
    if kind == "User":
        return user.name == name
    return kind == "Group" and name in user.groups


class Authorizer:
    """RBAC authorizer over Role/ClusterRole/RoleBinding/ClusterRoleBinding manifests."""

    def __init__(self, rbac_dir: Path | None, extra: Sequence[JSON] = ()) -> None:
        """`extra`: more RBAC documents (an optional component's, rendered by the stack)."""
        docs = manifest_documents(rbac_dir, RBAC_KINDS) + [d for d in extra if d.get("kind") in RBAC_KINDS]
        self.cluster_roles = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ClusterRole"}
        self.roles = {
            (d["metadata"].get("namespace", "default"), d["metadata"]["name"]): d
            for d in docs
            if d["kind"] == "Role"
        }
        self.bindings = [d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")]
        self.authorized: set[AuthorizedRequest] = set()

    def _cluster_role_rules(self, name: str) -> list[JSON]:
        """ClusterRole rules, including aggregated ones (aggregationRule.clusterRoleSelectors)."""
        role = self.cluster_roles.get(name) or {}
        rules = list(role.get("rules") or [])
        for selector in (role.get("aggregationRule") or {}).get("clusterRoleSelectors") or []:
            wanted = selector.get("matchLabels") or {}
            for other in self.cluster_roles.values():
                labels = other["metadata"].get("labels") or {}
                if other is not role and all(labels.get(k) == v for k, v in wanted.items()):
                    rules += other.get("rules") or []
        return rules

    def _rules_for(self, user: User, namespace: str) -> list[JSON]:
        rules: list[JSON] = []
        for binding in self.bindings:
            binding_ns = binding["metadata"].get("namespace", "")
            if binding["kind"] == "RoleBinding" and binding_ns != namespace:
                continue
            if not any(_subject_matches(s, user, binding_ns) for s in binding.get("subjects") or []):
                continue
            ref = binding.get("roleRef") or {}
            if ref.get("kind") == "ClusterRole":
                rules += self._cluster_role_rules(ref.get("name", ""))
            else:
                rules += (self.roles.get((binding_ns, ref.get("name", ""))) or {}).get("rules") or []
        return rules

    def authorize(self, user: User, attrs: Attributes) -> None:
        """Admins (system:masters) bypass RBAC; otherwise a matching rule or 403 Forbidden."""
        if user.is_admin:
            return
        if not any(_rule_allows(rule, attrs) for rule in self._rules_for(user, attrs.namespace)):
            raise self._forbidden(user, attrs)
        self.authorized.add(
            AuthorizedRequest(user.name, attrs.verb, attrs.group, attrs.resource, attrs.subresource)
        )

    @staticmethod
    def _forbidden(user: User, attrs: Attributes) -> ApiError:
        """The RBAC denial message of the apiserver's forbidden responder."""
        combined = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
        scope = f'in the namespace "{attrs.namespace}"' if attrs.namespace else "at the cluster scope"
        why = (
            f'User "{user.name}" cannot {attrs.verb} resource "{combined}" in API group '
            f'"{attrs.group}" {scope}'
        )
        return errors.forbidden(attrs.group, attrs.resource, attrs.name, why)
