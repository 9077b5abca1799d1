"""`loraflow upload`: put an adapter directory into the filer and declare its integrity.

Resumable per file: the adapter's storage directory is listed first (filer JSON listing,
paginated, `Md5` base64) and a file whose stored MD5 equals the local one is not sent again.
Every file is hashed and uploaded by streaming, never read whole into memory. Then the
vllm LoRAAdapter is created, or its spec merge-patched, with `spec.integrity.md5` keyed by
full storage paths, so verify can check exactly what was uploaded. With the S3 backend the
files go under the bucket's filer folder (`/buckets/<bucket>` + storage path), where the S3
gateway serves them as the objects the functions read (key: the storage path).

A filer started with `jwt.filer_signing` refuses writes without a bearer JWT: the tenant's
token (scoped to `/loraadapters/<namespace>`) goes on every PUT; listing needs none.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
from kubernetes import client
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from functions.adapters.storage import FilerStorage
from functions.errors import LoraflowError, Reject
from functions.logic.paths import adapter_dir
from functions.resources.kinds import MODEL, VLLM_ADAPTER
from loraflow.errors import CliError
from loraflow.kubeapi import KubeCall

CHUNK = 1 << 20
UPLOADED = "uploaded"
SKIPPED = "skipped (unchanged)"


@dataclass(frozen=True)
class LocalFile:
    relpath: str
    path: Path
    size: int
    md5: str


@dataclass(frozen=True)
class Outcome:
    file: LocalFile
    storage_path: str
    result: str


@dataclass(frozen=True)
class UploadReport:
    directory: str
    outcomes: list[Outcome]
    adapter: str
    """"created" or "updated"."""
    model_exists: bool = True
    """Whether the namespace has the Model the adapter names (else it waits for one)."""

    @property
    def uploaded(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.result == UPLOADED]

    @property
    def skipped(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.result == SKIPPED]


# -- local side ------------------------------------------------------------------------------
def md5_of(path: Path, advance: Callable[[int], None] = lambda _: None) -> str:
    """Hex MD5 of a file, read in CHUNK-sized blocks."""
    digest = hashlib.md5(usedforsecurity=False)
    with path.open("rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
            advance(len(block))
    return digest.hexdigest()


def local_files(directory: Path) -> list[Path]:
    """Regular files under `directory`, recursively, sorted by relative path."""
    if not directory.is_dir():
        raise CliError(f"{directory} is not a directory")
    files = sorted(p for p in directory.rglob("*") if p.is_file())
    if not files:
        raise CliError(f"{directory} holds no files to upload")
    return files


def hash_all(directory: Path, progress: Progress) -> list[LocalFile]:
    paths = local_files(directory)
    sizes = [p.stat().st_size for p in paths]
    task = progress.add_task("hashing", total=sum(sizes))
    hashed = [
        LocalFile(
            p.relative_to(directory).as_posix(), p, size, md5_of(p, lambda n: progress.advance(task, n))
        )
        for p, size in zip(paths, sizes, strict=True)
    ]
    progress.remove_task(task)
    return hashed


# -- filer side ------------------------------------------------------------------------------
def stored_md5s(
    filer_url: str, directory: str, page_size: int = 1000, filer_root: str = ""
) -> dict[str, str | None]:
    """Full storage path -> hex MD5 (None when the filer has none) of what is already stored
    (`filer_root`: the folder the storage paths are under in the filer, as `Target.filer_root`)."""
    try:
        with contextlib.closing(FilerStorage(filer_url, page_size)) as storage:
            files = storage.stat_dir(filer_root + directory)
    except (LoraflowError, ValueError) as err:
        raise CliError(f"cannot list {filer_root + directory} on the filer {filer_url}: {err}") from err
    return {f.path[len(filer_root) :]: f.md5 for f in files}


def _body(file: LocalFile, advance: Callable[[int], None]) -> Iterator[bytes]:
    with file.path.open("rb") as handle:
        while block := handle.read(CHUNK):
            advance(len(block))
            yield block


def put_file(http: httpx.Client, storage_path: str, file: LocalFile, advance: Callable[[int], None]) -> None:
    """Stream one file to the filer with its Content-MD5 (the filer refuses a corrupted body)."""
    content_md5 = base64.b64encode(bytes.fromhex(file.md5)).decode("ascii")
    headers = {"Content-MD5": content_md5, "Content-Type": "application/octet-stream"}
    try:
        response = http.put(quote(storage_path), content=_body(file, advance), headers=headers)
    except httpx.HTTPError as err:
        raise CliError(f"upload of {file.relpath} to {storage_path} failed: {err}") from err
    if response.status_code >= 300:
        detail = response.text.strip()[:200]
        if response.status_code == 401:
            detail += (
                " (a write token for this namespace is needed: --filer-token-file, $LORAFLOW_FILER_TOKEN)"
            )
        raise CliError(f"filer refused {storage_path}: HTTP {response.status_code} {detail}")


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    )


# -- the adapter object ----------------------------------------------------------------------
def adapter_body(namespace: str, name: str, model: str, md5: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": VLLM_ADAPTER.api_version,
        "kind": VLLM_ADAPTER.kind,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"model": model, "integrity": {"md5": md5}},
    }


def spec_patch(existing: dict[str, Any], model: str, md5: dict[str, str]) -> dict[str, Any]:
    """A merge patch that makes spec.model and spec.integrity.md5 exactly these (stale keys -> null)."""
    old = ((existing.get("spec") or {}).get("integrity") or {}).get("md5") or {}
    declared: dict[str, str | None] = {key: None for key in old if key not in md5}
    declared.update(md5)
    return {"spec": {"model": model, "integrity": {"md5": declared}}}


def apply_adapter(api: client.ApiClient, namespace: str, name: str, model: str, md5: dict[str, str]) -> str:
    """Create the vllm LoRAAdapter, or merge-patch its spec when it exists: "created"/"updated"."""
    kube = KubeCall(api, VLLM_ADAPTER)
    if kube.create(namespace, adapter_body(namespace, name, model, md5)):
        return "created"
    existing = kube.get(namespace, name)
    if existing is None:
        raise CliError(f"LoRAAdapter {namespace}/{name} exists and vanished while updating it; retry")
    kube.merge_patch(namespace, name, spec_patch(existing, model, md5))
    return "updated"


# -- the command -----------------------------------------------------------------------------
def upload(
    directory: Path,
    namespace: str,
    model: str,
    name: str,
    filer_url: str,
    api: Callable[[], client.ApiClient],
    console: Console,
    filer_root: str = "",
    filer_token: str | None = None,
) -> UploadReport:
    try:
        storage_dir = adapter_dir(namespace, model, name)
    except Reject as err:
        raise CliError(str(err)) from err
    with _progress(console) as progress:
        files = hash_all(directory, progress)
        stored = stored_md5s(filer_url, storage_dir, filer_root=filer_root)
        outcomes = _send(files, storage_dir, stored, filer_url, progress, filer_root, filer_token)
    md5 = {o.storage_path: o.file.md5 for o in outcomes}
    kube = api()
    action = apply_adapter(kube, namespace, name, model, md5)
    exists = KubeCall(kube, MODEL).get(namespace, model) is not None
    return UploadReport(storage_dir, outcomes, action, exists)


def _send(
    files: list[LocalFile],
    storage_dir: str,
    stored: dict[str, str | None],
    filer_url: str,
    progress: Progress,
    filer_root: str = "",
    filer_token: str | None = None,
) -> list[Outcome]:
    outcomes: list[Outcome] = []
    todo = [f for f in files if stored.get(storage_dir + f.relpath) != f.md5]
    task = progress.add_task("uploading", total=sum(f.size for f in todo))
    headers = {"Authorization": f"Bearer {filer_token}"} if filer_token else {}
    timeout = httpx.Timeout(60.0, connect=10.0)
    with httpx.Client(base_url=filer_url, timeout=timeout, headers=headers) as http:
        for file in files:
            path = storage_dir + file.relpath
            if file in todo:
                put_file(http, filer_root + path, file, lambda n: progress.advance(task, n))
                outcomes.append(Outcome(file, path, UPLOADED))
            else:
                outcomes.append(Outcome(file, path, SKIPPED))
    return outcomes
