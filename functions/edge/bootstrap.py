"""The composition root: every dependency a handler talks to, typed by its port.

Production builds each client lazily on first use (never at import: a step that needs no engine
opens no connection for one), each on the transport `functions.transport.connect` chooses;
tests hand `Deps` their fakes by keyword instead:

    Deps(Settings(), kube=FakeKube(...), engines=FakeEngines())
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, TypeVar

from functions.observability import configure_logging
from functions.settings import Settings

if TYPE_CHECKING:
    from functions.ports import BrokerPort, ConfigsPort, EnginesPort, KubePort, StoragePort

T = TypeVar("T")


def utc_now() -> datetime:
    return datetime.now(UTC)


class Deps:
    """Built once per process; every port is built on first use unless given."""

    def __init__(
        self,
        settings: Settings,
        *,
        kube: KubePort | None = None,
        storage: StoragePort | None = None,
        configs: ConfigsPort | None = None,
        engines: EnginesPort | None = None,
        broker: BrokerPort | None = None,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self._kube = kube
        self._storage = storage
        self._configs = configs
        self._engines = engines
        self._broker = broker
        self._built: list[object] = []
        self._lock = threading.RLock()  # a port may be built from another (configs from storage)

    def _once(self, attribute: str, build: Callable[[], T]) -> T:
        # the server runs a step's requests on threads: two first events must not build two clients
        with self._lock:
            value: T | None = getattr(self, attribute)
            if value is None:
                value = build()
                setattr(self, attribute, value)
                self._built.append(value)
            return value

    def close(self) -> None:
        """Close the clients this Deps built; what a caller gave it stays the caller's to close.
        A step still running keeps working: a closed client closes each connection as it returns."""
        with self._lock:
            built, self._built = self._built, []
        for client in built:
            closer = getattr(client, "close", None)
            if callable(closer):
                closer()

    @property
    def kube(self) -> KubePort:
        return self._once("_kube", self._build_kube)

    @property
    def storage(self) -> StoragePort:
        return self._once("_storage", self._build_storage)

    @property
    def configs(self) -> ConfigsPort:
        """adapter_config.json contents, cached by content for the process's life."""
        return self._once("_configs", self._build_configs)

    @property
    def engines(self) -> EnginesPort:
        return self._once("_engines", self._build_engines)

    @property
    def broker(self) -> BrokerPort:
        return self._once("_broker", self._build_broker)

    # -- production adapters -------------------------------------------------------------------------
    def _build_kube(self) -> KubePort:
        from functions.adapters.kube import Kube, connect

        return Kube(connect(self.settings.kubeconfig))

    def _build_storage(self) -> StoragePort:
        from functions.adapters.storage import build_storage

        return build_storage(self.settings)

    def _build_configs(self) -> ConfigsPort:
        from functions.adapters.storage import ContentCache
        from functions.logic.adapter_config import CONFIG_MAX_BYTES

        return ContentCache(partial(self.storage.read_small, max_bytes=CONFIG_MAX_BYTES))

    def _build_engines(self) -> EnginesPort:
        from functions.adapters.engines import Engines

        s = self.settings
        return Engines(s.engine_timeout, keepalive_per_pod=s.load_concurrency, replace=s.vllm_replace)

    def _build_broker(self) -> BrokerPort:
        from functions.adapters.broker import Broker

        return Broker(self.settings.broker_url)


_made: dict[str, Deps] = {}
_made_lock = threading.Lock()


def deps(function: str = "") -> Deps:
    """The Deps of one function of this process, from the environment (the functions-framework
    entry points use it). In a cluster a process serves one function with its own
    ServiceAccount; the embedded stack serves all of them in one process, so `KUBECONFIG_<NAME>`
    (e.g. KUBECONFIG_LOAD) gives each function its own account's kubeconfig there."""
    with _made_lock:
        made = _made.get(function)
        if made is None:
            configure_logging()
            settings = Settings.from_env()
            own = os.environ.get(f"KUBECONFIG_{function.upper()}") if function else None
            made = _made[function] = Deps(
                settings.model_copy(update={"kubeconfig": own}) if own else settings
            )
        return made


def reset_deps() -> None:
    """Close and forget the process's Deps (the embedded stack changes the environment between
    runs); the next event builds them again from the environment."""
    with _made_lock:
        made = list(_made.values())
        _made.clear()
    for each in made:
        each.close()
