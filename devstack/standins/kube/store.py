"""In-memory object storage with apiserver write semantics and a bounded watch history."""

from __future__ import annotations

import bisect
import heapq
import json
import re
import secrets
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from devstack.standins.kube import errors
from devstack.standins.kube.errors import Cause
from devstack.standins.kube.resources import ResourceType
from devstack.standins.kube.validation import process

JSON = dict[str, Any]
Key = tuple[str, str]


def etcd_order(key: Key) -> str:
    """Where `key` (namespace, name) sorts: etcd orders the bytes of
    /registry/<group>/<plural>/<namespace>/<name>, so "team-b/x" comes before "team/x" ('-' is
    below '/'), not after it as the pair ("team-b", "x") would (k8s.io/apiserver storage/etcd3
    GetList reads a key range; the watch cache's btree keeps the same key strings)."""
    return f"{key[0]}/{key[1]}"


_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_NAME_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, "
    "'-' or '.', and must start and end with an alphanumeric character (e.g. "
    "'example.com', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
_IMMUTABLE_META = (
    "uid",
    "creationTimestamp",
    "generation",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "name",
    "namespace",
)
# etcd's default --max-request-bytes (DefaultMaxRequestBytes, etcd server/embed/config.go): a
# larger write fails with `etcdserver: request is too large`, which kube-apiserver answers as a
# plain 500 (https://github.com/kubernetes/kubernetes/issues/74600, .../issues/112152). Custom
# resources are stored as JSON, so a CR body between this and the apiserver's 3 MiB body limit
# gets past the apiserver and fails here.
ETCD_MAX_REQUEST_BYTES = 1536 * 1024
# Go's encoding/json escapes these inside strings (`\u003c`, `\u2028`, ...): the stored bytes grow.
_GO_ESCAPED = {"<": 5, ">": 5, "&": 5, "\u2028": 3, "\u2029": 3}


def now() -> str:
    """RFC 3339 timestamp at second precision, as metav1.Time serialises."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def clone(obj: JSON) -> JSON:
    """Deep copy via JSON (faster than copy.deepcopy for plain JSON trees)."""
    result: JSON = json.loads(json.dumps(obj))
    return result


@dataclass(frozen=True)
class WatchEvent:
    """One entry of the watch history (the apiserver's watch cache)."""

    rv: int
    key: Key
    type: str
    obj: JSON
    prev: JSON | None


@dataclass(frozen=True)
class Page:
    """One page of a list: the items, the revision it was read at, and where the next one starts."""

    items: list[JSON]
    rv: int
    last: Key | None
    """Key of the last item returned when keys remain after it (a continue token is due)."""
    remaining: int
    """Keys after the last item returned, at `rv` (etcd's Count minus the limit)."""


class Compacted(Exception):
    """The revision a continue token names is older than the history kept (etcd compacted it)."""


@dataclass(frozen=True)
class WriteOptions:
    """Per-request write options: `fieldValidation` and `dryRun`."""

    field_validation: str = "Warn"
    dry_run: bool = False


def stored_size(obj: JSON) -> int:
    """Bytes of obj as the apiserver hands a custom resource to etcd: Go encoding/json (compact,
    UTF-8, HTML-escaped) plus the newline json.Encoder appends (apimachinery
    runtime/serializer/json/json.go), without metadata.resourceVersion, which etcd3's store
    clears before writing. Approximations: built-in types are stored as protobuf upstream (a
    little smaller), and etcd measures its whole raft request, which adds the key and a
    transaction envelope of a few hundred bytes; only the object is counted here."""
    meta = {k: v for k, v in obj.get("metadata", {}).items() if k != "resourceVersion"}
    text = json.dumps({**obj, "metadata": meta}, separators=(",", ":"), ensure_ascii=False)
    escapes = sum(grow * text.count(char) for char, grow in _GO_ESCAPED.items())
    return len(text.encode("utf-8", "surrogatepass")) + escapes + 1


def _spec_part(obj: JSON) -> JSON:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


def _meta(obj: JSON) -> JSON:
    meta: JSON = obj.setdefault("metadata", {})
    return meta


class Store:
    """Objects by resource, one global resourceVersion counter, and watch notification."""

    def __init__(self, history: int = 10000, max_request_bytes: int = ETCD_MAX_REQUEST_BYTES) -> None:
        self._lock = threading.RLock()
        self.cond = threading.Condition(self._lock)
        # A condition per resource on the store's lock: a commit wakes only the watches of its
        # own resource, as kube-apiserver keeps a watch cache (cacher.Cacher) per resource and
        # dispatches each event to that resource's watchers only. One condition for all had
        # every watch thread (the sources', the workload's, the functions') wake for every
        # write, which in an upload storm cost the stand-in more than the writes themselves.
        self._changed: dict[Key, threading.Condition] = {}
        self.max_request_bytes = max_request_bytes  # etcd's --max-request-bytes; tests lower it
        self._objects: dict[Key, dict[Key, JSON]] = {}
        # Each resource's object keys in etcd's order (`etcd_order`): a page starts with a
        # bisection, so it costs its own size, not the collection's.
        self._keys: dict[Key, list[Key]] = {}
        # Each stored object's JSON, encoded on its first read: kube-apiserver's watch cache
        # keeps an object's serialization beside it (cacher's cachingObject) rather than
        # re-encoding it for every list that includes it.
        self._encoded: dict[tuple[Key, Key], tuple[JSON, bytes]] = {}
        self._rv = 0
        self._history: deque[WatchEvent] = deque(maxlen=history)
        self.closed = False
        self.warnings: threading.local = threading.local()

    # ------------------------------------------------------------ reads

    @property
    def resource_version(self) -> int:
        return self._rv

    def get(self, rtype: ResourceType, namespace: str, name: str) -> JSON:
        with self.cond:
            obj = self._objects.get(rtype.key, {}).get((namespace, name))
        if obj is None:
            raise errors.not_found(rtype.group, rtype.plural, name)
        return obj

    def list_objects(self, rtype: ResourceType, namespace: str | None) -> tuple[list[JSON], int]:
        """Objects in etcd's key order (`etcd_order`), and the list RV."""
        with self.cond:
            bucket = self._objects.get(rtype.key, {})
            return [bucket[k] for k in self._range(rtype.key, namespace, None)], self._rv

    def _range(self, rkey: Key, namespace: str | None, after: Key | None) -> Iterator[Key]:
        """Current keys of a resource in order: in `namespace` (None: all), after `after`."""
        keys = self._keys.get(rkey, [])
        start = f"{namespace}/" if namespace is not None else ""  # no key: every name is non-empty
        if after is not None and etcd_order(after) > start:
            start = etcd_order(after)
        bisect_from = bisect.bisect_right if after is not None else bisect.bisect_left
        index = bisect_from(keys, start, key=etcd_order)
        for position in range(index, len(keys)):
            key = keys[position]
            if namespace is not None and key[0] != namespace:
                return
            yield key

    def list_page(
        self,
        rtype: ResourceType,
        namespace: str | None,
        after: Key | None,
        rv: int | None,
        limit: int,
        predicate: Callable[[JSON], bool],
    ) -> Page:
        """One page as etcd3's store serves it (k8s.io/apiserver pkg/storage/etcd3 GetList):
        the keys after `after` read at revision `rv` (a continue token's; None: now), at most
        `limit` matching items (0: all). Objects changed since `rv` are shown as they were then
        (the version before their first change after it; created ones not at all, deleted ones
        still), from the watch history; Compacted when the history no longer reaches `rv`.
        A page is complete when `limit` items matched; a continue token is due when any key
        (matching or not) follows its last item, so a filtered list may end with an empty page."""
        with self.cond:
            at = self._rv if rv is None else rv
            bucket = self._objects.get(rtype.key, {})
            then = self._versions_at(rtype.key, at) if at < self._rv else {}
            older = sorted(
                (
                    k
                    for k, obj in then.items()
                    if obj is not None
                    and (namespace is None or k[0] == namespace)
                    and (after is None or etcd_order(k) > etcd_order(after))
                ),
                key=etcd_order,
            )
            current = (k for k in self._range(rtype.key, namespace, after) if k not in then)
            keys = heapq.merge(current, older, key=etcd_order)
            items: list[JSON] = []
            last: Key | None = None
            for key in keys:
                if limit and len(items) >= limit:
                    assert last is not None
                    return Page(items, at, last, self._count_after(rtype.key, namespace, last, then))
                obj = then.get(key) if key in then else bucket[key]
                if obj is not None and predicate(obj):
                    items.append(obj)
                    last = key
            return Page(items, at, None, 0)

    def encoded(self, rtype: ResourceType, obj: JSON) -> bytes:
        """`obj` as compact JSON, from the cache while it is the stored version."""
        meta = obj["metadata"]
        key = (rtype.key, (meta.get("namespace", ""), meta["name"]))
        cached = self._encoded.get(key)
        if cached is not None and cached[0] is obj:
            return cached[1]
        raw = json.dumps(obj, separators=(",", ":")).encode()
        if self._objects.get(rtype.key, {}).get(key[1]) is obj:
            self._encoded[key] = (obj, raw)
        return raw

    def _count_after(self, rkey: Key, namespace: str | None, last: Key, then: dict[Key, JSON | None]) -> int:
        """Keys after `last` (in `namespace`) as they were when `then` was taken: the current
        ones counted by bisection, corrected for what changed since."""
        keys, bucket = self._keys.get(rkey, []), self._objects.get(rkey, {})
        # "<namespace>0" follows every "<namespace>/<name>" ('0' is '/' + 1) and nothing else's
        end = (
            bisect.bisect_left(keys, f"{namespace}0", key=etcd_order) if namespace is not None else len(keys)
        )
        count = end - bisect.bisect_right(keys, etcd_order(last), key=etcd_order)
        for key, obj in then.items():
            if etcd_order(key) <= etcd_order(last) or (namespace is not None and key[0] != namespace):
                continue
            if key in bucket and obj is None:
                count -= 1  # created after the page's revision
            elif key not in bucket and obj is not None:
                count += 1  # deleted after it
        return count

    def _versions_at(self, rkey: Key, rv: int) -> dict[Key, JSON | None]:
        """Objects of a resource changed after `rv`, each as it was at `rv` (None: absent)."""
        events = self.events_after(rv)
        if events is None or rv > self._rv:
            raise Compacted(rv)
        then: dict[Key, JSON | None] = {}
        for event in events:
            if event.key != rkey:
                continue
            meta = event.obj["metadata"]
            then.setdefault((meta.get("namespace", ""), meta["name"]), event.prev)
        return then

    def namespace_exists(self, name: str) -> bool:
        with self.cond:
            return ("", name) in self._objects.get(("", "namespaces"), {})

    def events_after(self, rv: int) -> list[WatchEvent] | None:
        """History entries newer than rv; None when rv is older than the history keeps."""
        with self.cond:
            if self._history and self._history.maxlen == len(self._history) and rv < self._history[0].rv - 1:
                return None
            newer: list[WatchEvent] = []
            for event in reversed(self._history):
                if event.rv <= rv:
                    break
                newer.append(event)
            newer.reverse()
            return newer

    def oldest_rv(self) -> int:
        with self.cond:
            return self._history[0].rv if self._history else self._rv

    # ------------------------------------------------------------ commits

    def _commit(self, key: Key, obj: JSON, event_type: str, prev: JSON | None) -> JSON:
        """The etcd write: refused before anything changes (no new resourceVersion, no watch
        event) when the object is over etcd's request limit. A delete sends only the key."""
        if event_type != "DELETED" and stored_size(obj) > self.max_request_bytes:
            raise errors.etcd_request_too_large()
        self._rv += 1
        meta = _meta(obj)
        meta["resourceVersion"] = str(self._rv)
        obj_key = (meta.get("namespace", ""), meta["name"])
        bucket = self._objects.setdefault(key, {})
        keys = self._keys.setdefault(key, [])
        self._encoded.pop((key, obj_key), None)
        if event_type == "DELETED":
            if bucket.pop(obj_key, None) is not None:
                del keys[bisect.bisect_left(keys, etcd_order(obj_key), key=etcd_order)]
        else:
            if obj_key not in bucket:
                bisect.insort(keys, obj_key, key=etcd_order)
            bucket[obj_key] = obj
        self._history.append(WatchEvent(self._rv, key, event_type, obj, prev))
        self.cond.notify_all()
        changed = self._changed.get(key)
        if changed is not None:
            changed.notify_all()
        return obj

    def changed(self, key: Key) -> threading.Condition:
        """The condition notified on every commit to resource `key` (and on close); it shares
        the store's lock, so `with store.changed(k):` also holds `store.cond`."""
        with self.cond:
            found = self._changed.get(key)
            if found is None:
                found = self._changed[key] = threading.Condition(self._lock)
            return found

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()
            for changed in self._changed.values():
                changed.notify_all()

    # ------------------------------------------------------------ create

    def create(self, rtype: ResourceType, namespace: str, body: JSON, options: WriteOptions) -> JSON:
        """registry.Store.Create: uid, creationTimestamp, generation 1, a new resourceVersion;
        `.status` dropped when the status subresource is enabled (CRD API doc)."""
        obj = clone(body)
        obj["apiVersion"], obj["kind"] = rtype.api_version, rtype.kind
        meta = _meta(obj)
        self._check_namespace(rtype, namespace, meta)
        self._assign_name(rtype, meta)
        if rtype.status_subresource:
            obj.pop("status", None)
        if rtype.plural == "pods" and rtype.group == "":
            obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
        if rtype.plural == "namespaces" and rtype.group == "":
            obj["status"] = {"phase": "Active"}
        for field in ("uid", "resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds"):
            meta.pop(field, None)
        self._admit(rtype, obj, None, options)
        with self.cond:
            if (meta.get("namespace", ""), meta["name"]) in self._objects.get(rtype.key, {}):
                raise errors.already_exists(rtype.group, rtype.plural, meta["name"])
            meta.update(uid=str(uuid.uuid4()), creationTimestamp=now(), generation=1)
            if options.dry_run:
                return obj
            return self._commit(rtype.key, obj, "ADDED", None)

    def seed(self, rtype: ResourceType, namespace: str, objects: list[JSON]) -> None:
        """Store objects as a create and a status write would have left them, without the
        HTTP, admission and validation round trips: for benchmarks that need 100,000 objects
        (a cluster they did not build). Each gets a uid, a creationTimestamp, generation 1 and
        its own resourceVersion; `status` is kept. The caller vouches for the objects' shape."""
        stamp = now()
        with self.cond:
            for body in objects:
                obj = dict(body)
                obj["apiVersion"], obj["kind"] = rtype.api_version, rtype.kind
                meta = dict(obj.get("metadata") or {})
                meta.update(uid=str(uuid.uuid4()), creationTimestamp=stamp, generation=1)
                if rtype.namespaced:
                    meta["namespace"] = namespace
                obj["metadata"] = meta
                self._commit(rtype.key, obj, "ADDED", None)

    def _check_namespace(self, rtype: ResourceType, namespace: str, meta: JSON) -> None:
        if not rtype.namespaced:
            meta.pop("namespace", None)
            return
        if meta.get("namespace", namespace) != namespace:
            raise errors.bad_request(
                "the namespace of the provided object does not match the namespace sent on the request"
            )
        meta["namespace"] = namespace
        if not self.namespace_exists(namespace):
            raise errors.not_found("", "namespaces", namespace)

    def _assign_name(self, rtype: ResourceType, meta: JSON) -> None:
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + secrets.token_hex(3)[:5]
        if not meta.get("name"):
            raise errors.invalid(
                rtype.kind,
                rtype.group,
                "",
                [
                    Cause(
                        "FieldValueRequired",
                        "Required value: name or generateName is required",
                        "metadata.name",
                    )
                ],
            )

    # ------------------------------------------------------------ admission

    def _admit(self, rtype: ResourceType, obj: JSON, old: JSON | None, options: WriteOptions) -> None:
        """Name validation, CRD structural schema (prune, default, validate, CEL), Pod basics."""
        name = _meta(obj)["name"]
        causes: list[Cause] = []
        if old is None and (len(name) > 253 or not _NAME.match(name)):
            causes.append(
                Cause("FieldValueInvalid", f'Invalid value: "{name}": {_NAME_MSG}', "metadata.name")
            )
        if rtype.schema is not None:
            pruned, schema_causes = process(obj, rtype.schema, old)
            causes += schema_causes
            self._unknown_fields(pruned, options)
        if (
            rtype.plural == "pods"
            and rtype.group == ""
            and not _spec_part(obj).get("spec", {}).get("containers")
        ):
            causes.append(Cause("FieldValueRequired", "Required value", "spec.containers"))
        if causes:
            raise errors.invalid(rtype.kind, rtype.group, name, causes)

    def _unknown_fields(self, pruned: list[str], options: WriteOptions) -> None:
        """fieldValidation=Strict: unknown fields -> 400 `strict decoding error`; Warn -> header."""
        if not pruned or options.field_validation == "Ignore":
            return
        texts = [f'unknown field "{path}"' for path in pruned]
        if options.field_validation == "Strict":
            raise errors.bad_request("strict decoding error: " + ", ".join(texts))
        self.warnings.items = [*getattr(self.warnings, "items", []), *texts]

    # ------------------------------------------------------------ update

    def update(
        self,
        rtype: ResourceType,
        namespace: str,
        name: str,
        candidate: JSON,
        subresource: str,
        options: WriteOptions,
        require_rv: bool,
    ) -> JSON:
        """registry.Store.Update under the store lock (optimistic concurrency on RV)."""
        with self.cond:
            current = self.get(rtype, namespace, name)
            return self._update(rtype, current, clone(candidate), subresource, options, require_rv)

    def mutate(
        self,
        rtype: ResourceType,
        namespace: str,
        name: str,
        change: Callable[[JSON], JSON],
        subresource: str,
        options: WriteOptions,
    ) -> JSON:
        """Read-modify-write (PATCH): change(current copy) -> candidate, then update."""
        with self.cond:
            current = self.get(rtype, namespace, name)
            candidate = change(clone(current))
            return self._update(rtype, current, candidate, subresource, options, False)

    def _update(
        self,
        rtype: ResourceType,
        current: JSON,
        candidate: JSON,
        subresource: str,
        options: WriteOptions,
        require_rv: bool,
    ) -> JSON:
        cur_meta, cand_meta = current["metadata"], _meta(candidate)
        name = cur_meta["name"]
        self._precondition(rtype, cur_meta, cand_meta, require_rv)
        if cand_meta.get("name", name) != name:
            raise errors.bad_request(
                f"the name of the object ({cand_meta.get('name')}) does not "
                f"match the name on the URL ({name})"
            )
        merged = self._merge(rtype, current, candidate, subresource)
        self._admit(rtype, merged, current, options)
        self._check_finalizers(rtype, current, merged)
        if _spec_part(merged) != _spec_part(current):
            merged["metadata"]["generation"] = int(cur_meta.get("generation", 1)) + 1
        merged["metadata"]["resourceVersion"] = cur_meta["resourceVersion"]
        if merged == current or options.dry_run:
            return current if merged == current else merged
        if merged["metadata"].get("deletionTimestamp") and not merged["metadata"].get("finalizers"):
            return self._commit(rtype.key, merged, "DELETED", current)
        return self._commit(rtype.key, merged, "MODIFIED", current)

    def _precondition(self, rtype: ResourceType, cur_meta: JSON, cand_meta: JSON, require_rv: bool) -> None:
        """A stale metadata.resourceVersion in a PUT or patch body -> 409 Conflict; CRs reject
        an unconditional PUT (`must be specified for an update`) as apiextensions does."""
        wanted = cand_meta.get("resourceVersion")
        if not wanted and require_rv and not rtype.builtin:
            raise errors.invalid(
                rtype.kind,
                rtype.group,
                cur_meta["name"],
                [
                    Cause(
                        "FieldValueInvalid",
                        "Invalid value: 0x0: must be specified for an update",
                        "metadata.resourceVersion",
                    )
                ],
            )
        if wanted and wanted != cur_meta["resourceVersion"]:
            raise errors.conflict(rtype.group, rtype.plural, cur_meta["name"])

    @staticmethod
    def _merge(rtype: ResourceType, current: JSON, candidate: JSON, subresource: str) -> JSON:
        """Status subresource rules (CRD API doc): `/status` writes change only .status;
        main-resource writes keep the current .status; immutable metadata is kept."""
        if subresource == "status":
            merged = clone(current)
            if "status" in candidate:
                merged["status"] = candidate["status"]
            else:
                merged.pop("status", None)
            return merged
        merged = candidate
        merged["apiVersion"], merged["kind"] = rtype.api_version, rtype.kind
        if rtype.status_subresource:
            if "status" in current:
                merged["status"] = current["status"]
            else:
                merged.pop("status", None)
        meta = merged["metadata"]
        for field in _IMMUTABLE_META:
            if field in current["metadata"]:
                meta[field] = current["metadata"][field]
            else:
                meta.pop(field, None)
        return merged

    @staticmethod
    def _check_finalizers(rtype: ResourceType, current: JSON, merged: JSON) -> None:
        """apiserver: `no new finalizers can be added if the object is being deleted`."""
        if not current["metadata"].get("deletionTimestamp"):
            return
        old = set(current["metadata"].get("finalizers") or [])
        new = [f for f in merged["metadata"].get("finalizers") or [] if f not in old]
        if new:
            shown = ", ".join(json.dumps(f) for f in new)
            raise errors.invalid(
                rtype.kind,
                rtype.group,
                current["metadata"]["name"],
                [
                    Cause(
                        "FieldValueForbidden",
                        "Forbidden: no new finalizers can be added if the object "
                        f"is being deleted, found new finalizers []string{{{shown}}}",
                        "metadata.finalizers",
                    )
                ],
            )

    # ------------------------------------------------------------ delete

    def delete(
        self, rtype: ResourceType, namespace: str, name: str, preconditions: JSON, dry_run: bool = False
    ) -> JSON:
        """registry.Store.Delete: with finalizers, set deletionTimestamp and
        deletionGracePeriodSeconds=0 (MODIFIED) and keep the object; else remove it (DELETED)."""
        with self.cond:
            current = self.get(rtype, namespace, name)
            self._delete_preconditions(rtype, current, preconditions)
            if dry_run:
                return current
            if current["metadata"].get("finalizers"):
                if current["metadata"].get("deletionTimestamp"):
                    return current
                marked = clone(current)
                marked["metadata"].update(deletionTimestamp=now(), deletionGracePeriodSeconds=0)
                return self._commit(rtype.key, marked, "MODIFIED", current)
            if rtype.group == "" and rtype.plural == "namespaces":
                self._delete_namespace_content(name)
            return self._commit(rtype.key, clone(current), "DELETED", current)

    @staticmethod
    def _delete_preconditions(rtype: ResourceType, current: JSON, preconditions: JSON) -> None:
        meta = current["metadata"]
        for field, label in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
            wanted = preconditions.get(field)
            if wanted and wanted != meta[field]:
                raise errors.conflict(
                    rtype.group,
                    rtype.plural,
                    meta["name"],
                    (
                        f"Precondition failed: {label} in precondition: {wanted}, {label} in object "
                        f"meta: {meta[field]}"
                    ),
                )

    def _delete_namespace_content(self, namespace: str) -> None:
        """Namespace deletion removes the namespace's objects (the namespace controller's job)."""
        for key, bucket in list(self._objects.items()):
            for obj_key, obj in list(bucket.items()):
                if obj_key[0] != namespace:
                    continue
                self._commit(key, clone(obj), "DELETED", obj)
