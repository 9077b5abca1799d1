"""Storage paths and engine paths, built only from validated names (pure).

Names reach us from events and objects; a name that is not a DNS label/subdomain could
smuggle `..` or `/` into a path, so every path is built from checked parts and the result
is checked again to lie under its root (no traversal).
"""

from __future__ import annotations

import posixpath
import re
from functools import lru_cache

from functions.errors import Reject

STORAGE_ROOT = "/loraadapters"
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
"""Always used with fullmatch: `$` would also match before a trailing newline (`"ns\n"`)."""


def is_label(value: str) -> bool:
    return len(value) <= 63 and _DNS_LABEL.fullmatch(value) is not None


def is_subdomain(value: str) -> bool:
    return len(value) <= 253 and _DNS_SUBDOMAIN.fullmatch(value) is not None


def check_label(value: str, what: str) -> str:
    if not is_label(value):
        raise Reject(f"{what} {value!r} is not a DNS label (RFC 1123)")
    return value


def check_subdomain(value: str, what: str) -> str:
    if not is_subdomain(value):
        raise Reject(f"{what} {value!r} is not a DNS subdomain (RFC 1123)")
    return value


def adapter_dir(namespace: str, model: str, name: str) -> str:
    """`/loraadapters/{namespace}/{model}/{name}/` (vllm layout), trailing slash included."""
    check_label(namespace, "namespace")
    check_subdomain(model, "model")
    check_subdomain(name, "adapter name")
    return f"{STORAGE_ROOT}/{namespace}/{model}/{name}/"


@lru_cache(maxsize=1 << 12)
def normal_path(path: str) -> str:
    """posixpath.normpath, remembered: a resync compares every listed root several times (each
    of a deployment's pods lists the same ones), and normalising was a third of its planning
    time; the mount root is normalised for every adapter."""
    return posixpath.normpath(path)


def engine_path(mount_root: str, storage_dir: str) -> str:
    """Where an engine sees a storage directory through the SeaweedFS mount (vLLM lora_path)."""
    root = normal_path(mount_root)
    joined = root + "/" + storage_dir.strip("/")
    if not _plainly_normal(joined):
        joined = posixpath.normpath(joined)
    if not joined.startswith(root.rstrip("/") + "/"):
        raise Reject(f"storage path {storage_dir!r} escapes the mount root")
    return joined


def is_under(path: str, directory: str) -> bool:
    """True when `path` lies strictly inside `directory` after normalisation (no `..` tricks)."""
    if "\x00" in path or not path.startswith("/"):
        return False
    stripped = path.rstrip("/")
    normal = stripped if _plainly_normal(stripped) else posixpath.normpath(path)
    return normal == stripped and normal.startswith(directory.rstrip("/") + "/")


def _plainly_normal(path: str) -> bool:
    """`posixpath.normpath(path) == path`, seen without normalising: an absolute path with no
    empty, `.` or `..` segment and no trailing slash (a name starting with a dot is sent to
    normpath too). A resync builds three paths for each of 100,000 adapters, and normpath (pure
    Python before 3.12) was a tenth of its judging time."""
    return path.startswith("/") and "//" not in path and "/." not in path and not path.endswith("/")


def check_storage_path(path: str) -> str:
    """A notification path we accept: absolute, normalised (no trailing slash), under /loraadapters/."""
    if not is_under(path, STORAGE_ROOT) or posixpath.normpath(path) != path:
        raise Reject(f"path {path!r} is not a normalised path under {STORAGE_ROOT}/")
    return path


def adapter_of_path(path: str) -> tuple[str, str, str] | None:
    """(namespace, model, name) of a file path under the vllm layout, if it has one."""
    parts = check_storage_path(path).split("/")
    # ['', 'loraadapters', ns, model, name, file...]
    if len(parts) < 6:
        return None
    namespace, model, name = parts[2], parts[3], parts[4]
    if not (is_label(namespace) and is_subdomain(model) and is_subdomain(name)):
        return None
    return namespace, model, name


_DIGEST = re.compile(r"[0-9a-f]{16,64}")
FROZEN_ROOT = "/loraflow-frozen"
"""Where verified file sets are frozen: outside /loraadapters/, so no tenant's upload path, S3
key of the adapters' bucket or notification under /loraadapters/ ever names a frozen file."""


def frozen_dir(namespace: str, model: str, name: str, file_set: str) -> str:
    """`/loraflow-frozen/{namespace}/{model}/{name}/{digest}/`: the frozen copy of one verified
    file set, named by its digest (`md5set:<digest>`), trailing slash included."""
    digest = file_set.removeprefix("md5set:")
    if not _DIGEST.fullmatch(digest):
        raise Reject(f"file set {file_set!r} is not a digest")
    check_label(namespace, "namespace")
    check_subdomain(model, "model")
    check_subdomain(name, "adapter name")
    return f"{FROZEN_ROOT}/{namespace}/{model}/{name}/{digest}/"


def frozen_path(upload_dir: str, frozen: str, path: str) -> str | None:
    """Where the frozen copy of the declared file `path` (under `upload_dir`) lives; None when
    `path` is not plainly inside `upload_dir` (admit refuses such a declaration)."""
    base = upload_dir.rstrip("/") + "/"
    if not is_under(path, base.rstrip("/")) or not path.startswith(base):
        return None
    return frozen.rstrip("/") + "/" + path[len(base) :]


def frozen_owner(root: str, namespace: str, mount_root: str) -> tuple[str, str] | None:
    """(model, name) when `root` is `{mount}/loraflow-frozen/{namespace}/{model}/{name}/{digest}`:
    a frozen set only loraflow loads (its LoRAAdapter may be gone); else None."""
    home = normal_path(mount_root).rstrip("/") + FROZEN_ROOT + "/" + namespace + "/"
    normal = normal_path(root) if root.startswith("/") else ""
    if not normal.startswith(home):
        return None
    parts = normal[len(home) :].split("/")
    if len(parts) != 3 or not all(parts) or not _DIGEST.fullmatch(parts[2]):
        return None
    return parts[0], parts[1]
