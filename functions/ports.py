"""The seams between the steps and the world: what a handler may ask of each dependency.

Small Protocols, so that `Deps` is typed end to end (mypy checks every call a handler makes),
the production adapters in `functions/adapters/` satisfy them structurally, and the fakes in
`tests/support/fakes.py` are type-checked against the same contract. The values that cross a
port (`StoredFile`, `CallResult`) are defined here, beside it: the ports sit below the adapters
and import none of them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple, Protocol

from cloudevents.http import CloudEvent

from functions.logic.capacity import Capacity
from functions.logic.pods import Endpoint
from functions.logic.serving import ListingFailure
from functions.resources.kinds import Kind
from functions.settings import Settings

Obj = dict[str, Any]
StatusFn = Callable[[Obj], Obj | None]
"""Given the current object, the whole desired status (None: leave it alone)."""
FinalizersFn = Callable[[Obj], list[str] | None]
PageSize = int | Callable[[Sequence[Obj]], int]
"""A list's page size (`limit`), or how to size each page from the one before it (called with
no objects for the first): a kind whose objects vary widely in size is paged by their weight."""


class Written(NamedTuple):
    """Outcome of a guarded write: the object before and as stored, and whether we changed it."""

    obj: Obj
    changed: bool
    before: Obj | None = None
    """The object the successful attempt started from (after any 409 re-reads)."""


class StoredFile(NamedTuple):
    """A file as storage lists it."""

    path: str
    size: int
    md5: str | None
    """Hex MD5 as the backend reported it; None when it reported none."""
    version: str | None = None
    """For a file listed without an MD5: a token that changes whenever its bytes do (the filer's
    chunk file ids, inode and mtime; the S3 ETag), so that a same-size replacement is seen."""


class CallResult(NamedTuple):
    """An engine's answer to a load, replace or unload."""

    ok: bool
    reason: str
    message: str = ""
    retryable: bool = False
    holds: Mapping[str, str] | None = None
    """What the engine holds after a load, name -> path, when its answer says (SGLang)."""


class KubePort(Protocol):
    def get(self, kind: Kind, namespace: str, name: str) -> Obj | None: ...

    def iter(
        self,
        kind: Kind,
        namespace: str | None = None,
        label_selector: str | None = None,
        page_size: PageSize = 500,
    ) -> Iterator[Obj]: ...

    def list_all(
        self,
        kind: Kind,
        namespace: str | None = None,
        label_selector: str | None = None,
        page_size: int = 500,
    ) -> list[Obj]: ...

    def write_status(
        self, kind: Kind, namespace: str, name: str, desired: StatusFn, current: Obj | None = None
    ) -> Written | None: ...

    def write_finalizers(
        self, kind: Kind, namespace: str, name: str, desired: FinalizersFn, current: Obj | None = None
    ) -> Written | None: ...

    def record_event(
        self, obj: Obj, event_type: str, reason: str, message: str, component: str, now: datetime
    ) -> None: ...

    @property
    def server(self) -> tuple[str, int] | None:
        """(host, port) of the API server: never an engine endpoint."""
        ...


class StoragePort(Protocol):
    def stat_dir(self, directory: str) -> list[StoredFile]:
        """Every file under `directory` (recursively), sorted by path; [] when it does not exist."""
        ...

    def hash_file(self, path: str, max_bytes: int) -> str | None:
        """Hex MD5 of the content, streamed; None when larger than `max_bytes` or gone."""
        ...

    def read_small(self, path: str, max_bytes: int) -> bytes | None:
        """The content of a small file; None when missing or larger than `max_bytes`."""
        ...

    copy_checks_md5: bool
    """True when `copy_file` stores the copy only if its bytes hash to `md5`."""

    def copy_file(self, source: str, target: str, size: int, md5: str) -> bool:
        """Copy, `target` replaced; False when the source is gone, not `size` long, or (when
        `copy_checks_md5`) not `md5`."""
        ...

    def delete_tree(self, directory: str) -> None:
        """Delete `directory` recursively; nothing there is no error."""
        ...


class ConfigsPort(Protocol):
    def get(self, path: str, md5: str | None) -> bytes | None:
        """A small file by path, cached by its MD5 when one is known."""
        ...


class EnginesPort(Protocol):
    def healthy(self, endpoint: Endpoint) -> bool: ...

    def listing(self, endpoint: Endpoint) -> dict[str, str] | ListingFailure: ...

    def capacity(self, endpoint: Endpoint) -> Capacity | None:
        """What the engine reports of its capacity (SGLang's server info), None: nothing."""
        ...

    def load(self, endpoint: Endpoint, name: str, path: str, inplace: bool = False) -> CallResult: ...

    def unload(self, endpoint: Endpoint, name: str) -> CallResult: ...

    def replace(self, endpoint: Endpoint, name: str, path: str) -> CallResult: ...


class BrokerPort(Protocol):
    def publish(self, event: CloudEvent, timeout: float | None = None) -> None:
        """POST the event to the Broker; `timeout` caps this attempt."""
        ...


class ServingPorts(Protocol):
    """What the serving steps' I/O (functions/adapters/fleet.py) reads and calls. The steps'
    `Deps` is one: fleet sits below the edge, so it names the ports, not the composition root."""

    @property
    def settings(self) -> Settings: ...

    @property
    def clock(self) -> Callable[[], datetime]: ...

    @property
    def kube(self) -> KubePort: ...

    @property
    def engines(self) -> EnginesPort: ...

    @property
    def configs(self) -> ConfigsPort: ...
