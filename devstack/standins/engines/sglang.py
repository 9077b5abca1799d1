"""SGLang stand-in replica (SRT HTTP server with ``--enable-lora``).

Mirrors, per route:

* ``POST /load_lora_adapter`` / ``POST /unload_lora_adapter`` (no ``/v1``):
  python/sglang/srt/entrypoints/http_server.py (``200 if result.success else 400``),
  python/sglang/srt/managers/tokenizer_manager.py (or tokenizer_control_mixin.py)
  ``load_lora_adapter`` / ``unload_lora_adapter`` ("LoRA is not enabled" check),
  python/sglang/srt/lora/lora_manager.py ``LoRAManager.validate_new_adapter`` /
  ``create_lora_update_result`` and python/sglang/srt/lora/lora_registry.py
  ``LoRARegistry.unregister``. Body: ``LoRAUpdateOutput`` = ``{"success", "error_message",
  "loaded_adapters"}``.
* ``GET /v1/models``: python/sglang/srt/entrypoints/openai/serving_models (PR #12229): base card
  (``root`` = served model name) then ``{"id": lora_name, "root": lora_path, "parent": base}``.
* ``GET /health``: http_server.py ``health`` (200 empty; 503 while starting).
* ``GET /server_info`` (and its deprecated alias ``GET /get_server_info``): http_server.py
  ``server_info``, ``{**dataclasses.asdict(server_args), ...scheduler info, "version"}``: the
  LoRA settings below are reported there under their ``ServerArgs`` names.
* ``POST /v1/completions`` with ``model`` = an adapter name (or ``base:adapter``): the OpenAI
  route; before the request runs, tokenizer_manager.py ``_resolve_lora_path`` touches the
  adapter in the registry (lora_registry.py ``get_unregistered_loras``: ``move_to_end``) and
  reloads an evicted one. The answer carries ``served_by`` (base.py ``completion_body``).
* Body validation: FastAPI (``LoadLoRAAdapterReqInput`` dataclass) -> 422 ``{"detail": [...]}``.

Choices where versions / the seed differ (switchable):

* ``duplicate_status=400`` (SGLang) or ``409`` (what the seed documents).
* ``serialize_updates=False``: upstream holds one ``lora_update_lock`` for every load/unload
  (the scheduler is single-threaded); the stand-in serialises per name only so that unrelated
  loads overlap (benchmarks); ``True`` restores the global lock.
* ``loaded_adapters`` is the full map on success and on failures raised by the LoRA manager
  (duplicate, bad path, rank, pinned slots); ``null`` on tokenizer-level failures (LoRA not
  enabled, unknown name on unload), as upstream.

Capacity (``max_loaded_loras``; None, the default, is unbounded), ``capacity_mode``:

* ``"evict"`` (PR #11526 onwards): tokenizer_control_mixin.py ``load_lora_adapter`` registers the
  new adapter, then while the registry holds more than ``max_loaded_loras`` unloads
  ``LoRARegistry.lru_lora_name(exclude_pinned=True)`` (the registry is an OrderedDict kept in
  use order) and drops it from the answer's ``loaded_adapters``: 200, the evicted name gone from
  ``/v1/models``. Nothing unpinned left: 400 "Didn't find any LoRA adapters when trying to evict
  LRU LoRA adapter. LoRA registry is: ..." with the new adapter left registered. Every name
  ever loaded stays in ``lora_ref_cache`` (explicit unloads included, a restart clears it): a
  request naming one that is not registered loads it again from its cached path, reading the
  files anew; a name never loaded is a 400 "Got LoRA adapter that has never been loaded".
* ``"refuse"`` (before it): ``load_lora_adapter`` checks first, under ``lora_update_lock``:
  at ``max_loaded_loras`` a load is a 400 "Cannot load LoRA adapter <n> at path <p>. Maximum
  number of loaded LoRA adapters is N. Please unload some LoRA adapters before loading new ones."
  (a duplicate at capacity gets this answer, not "already loaded"); nothing is reloaded
  implicitly.

``max_loras_per_batch`` is the GPU memory pool: a request whose adapter holds no slot takes one,
putting out another chosen by ``lora_eviction_policy`` (lora/mem_pool.py with
lora/eviction_policy.py: ``lru`` the least recently used, ``fifo`` the first loaded; pinned
adapters keep theirs). server_args.py checks ``max_loaded_loras >= max_loras_per_batch`` at
start: the stand-in refuses to be built otherwise.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from email.message import Message
from pathlib import Path
from typing import Any, ClassVar

from devstack.standins.engines.answers import DROP, JSON, METHOD_NOT_ALLOWED, NOT_FOUND, Answer, Response
from devstack.standins.engines.base import (
    AdapterInvalid,
    AdapterNotFound,
    AdapterRankTooHigh,
    EngineReplica,
    LoadedAdapter,
    completion_body,
    media_type,
    parse_json_object,
)
from devstack.standins.engines.base import check_adapter_dir as _check

_ROUTES = {
    "/health": ("GET", "health"),
    "/health_generate": ("GET", "health"),
    "/v1/models": ("GET", "models"),
    "/load_lora_adapter": ("POST", "load"),
    "/unload_lora_adapter": ("POST", "unload"),
    "/server_info": ("GET", "info"),
    "/get_server_info": ("GET", "info"),
    "/v1/completions": ("POST", "completion"),
}
CAPACITY_MODES = ("evict", "refuse")
EVICTION_POLICIES = ("lru", "fifo")
LORA_NOT_ENABLED = "LoRA is not enabled. Please set `--enable-lora` to enable LoRA."


class SglangReplica(EngineReplica):
    """An SGLang replica (see module docstring for the rules)."""

    engine: ClassVar[str] = "sglang"
    CONFIGURABLE: ClassVar[dict[str, type]] = {
        **EngineReplica.CONFIGURABLE,
        "duplicate_status": int,
        "lora_enabled": bool,
        "serialize_updates": bool,
        "max_loras_per_batch": int,
        "capacity_mode": str,
        "lora_eviction_policy": str,
        "info_patch": dict,
    }

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        served_model: str = "base-model",
        mount_root: Path | str | None = None,
        max_lora_rank: int = 64,
        static_adapters: dict[str, str] | None = None,
        load_latency_s: float = 0.0,
        *,
        duplicate_status: int = 400,
        lora_enabled: bool = True,
        serialize_updates: bool = False,
        max_loras_per_batch: int = 8,
        max_loaded_loras: int | None = None,
        capacity_mode: str = "evict",
        lora_eviction_policy: str = "lru",
        **kwargs: Any,
    ) -> None:
        super().__init__(
            host=host,
            port=port,
            served_model=served_model,
            mount_root=mount_root,
            max_lora_rank=max_lora_rank,
            static_adapters=static_adapters,
            load_latency_s=load_latency_s,
            **kwargs,
        )
        self._validate_setting("duplicate_status", duplicate_status)
        self.duplicate_status = duplicate_status
        self.lora_enabled = lora_enabled
        self.serialize_updates = serialize_updates
        self.max_loras_per_batch = max_loras_per_batch
        self._validate_setting("capacity_mode", capacity_mode)
        self._validate_setting("lora_eviction_policy", lora_eviction_policy)
        if max_loaded_loras is not None and max_loaded_loras < max_loras_per_batch:
            # server_args.py check_lora_server_args: the engine does not start
            raise ValueError(
                f"max_loaded_loras ({max_loaded_loras}) must be >= "
                f"max_loras_per_batch ({max_loras_per_batch})"
            )
        self.max_loaded_loras = max_loaded_loras
        self.capacity_mode = capacity_mode
        self.lora_eviction_policy = lora_eviction_policy
        self.info_patch: dict[str, Any] = {}
        """Keys laid over the server info answer (a test's garbage: ``{"max_loaded_loras": "x"}``)."""
        self._update_lock = threading.Lock()
        self._ref_cache: dict[str, tuple[str, bool]] = {}
        """lora_ref_cache: every name loaded since the start -> (path, pinned)."""
        self._gpu: OrderedDict[str, None] = OrderedDict()
        """The GPU memory pool's slots (max_loras_per_batch), in eviction order."""

    def forget_memory(self) -> None:
        self._ref_cache = {}
        self._gpu = OrderedDict()

    def memory(self) -> dict[str, Any]:
        with self._lock:
            return {"reloadable": sorted(self._ref_cache), "gpu": list(self._gpu)}

    def _validate_setting(self, key: str, value: Any) -> None:
        super()._validate_setting(key, value)
        if key == "duplicate_status" and value not in (400, 409):
            raise ValueError("duplicate_status must be 400 or 409")
        if key == "max_loras_per_batch" and value < 1:
            raise ValueError("max_loras_per_batch must be >= 1")
        if key == "capacity_mode" and value not in CAPACITY_MODES:
            raise ValueError(f"capacity_mode must be one of {CAPACITY_MODES}")
        if key == "lora_eviction_policy" and value not in EVICTION_POLICIES:
            raise ValueError(f"lora_eviction_policy must be one of {EVICTION_POLICIES}")

    # ---- bodies ------------------------------------------------------------------------

    def _map(self) -> dict[str, str]:
        return {a.name: a.path for a in self._adapters.values()}

    def result(
        self,
        success: bool,
        error_message: str | None = None,
        *,
        with_adapters: bool = True,
        status: int | None = None,
    ) -> Response:
        """``LoRAUpdateOutput`` as http_server.py serialises it (200 if success else 400)."""
        with self._lock:
            adapters = self._map() if with_adapters else None
        body = {"success": success, "error_message": error_message, "loaded_adapters": adapters}
        return Response.json(status or (200 if success else 400), body)

    def error_answer(self, route: str, status: int, message: str) -> Response:
        if route == "health":
            return Response(status)
        if route == "models":  # sglang/srt/entrypoints/openai/protocol.py ErrorResponse
            return Response.json(
                status,
                {"object": "error", "message": message, "type": "error", "param": None, "code": status},
            )
        body = {"success": False, "error_message": message, "loaded_adapters": None}
        return Response.json(status, body)

    @staticmethod
    def _validation_error(loc: str, msg: str, err_type: str, given: Any) -> Response:
        """FastAPI ``RequestValidationError`` default handler (422)."""
        detail = [{"type": err_type, "loc": ["body", loc] if loc else ["body"], "msg": msg, "input": given}]
        return Response.json(422, {"detail": detail})

    # ---- routing -----------------------------------------------------------------------

    def route_name(self, method: str, path: str) -> str | None:
        entry = _ROUTES.get(path)
        return entry[1] if entry else None

    def route(self, method: str, path: str, headers: Message, body: bytes) -> Answer:
        entry = _ROUTES.get(path)
        if entry is None:
            return NOT_FOUND
        if method != entry[0]:
            return METHOD_NOT_ALLOWED
        name = entry[1]
        if name == "health":
            return Response(200)
        if name == "models":
            return self.listing_answer(self.models_payload)
        if name == "info":
            return Response.json(200, self.server_info())
        if media_type(headers) != JSON:
            return self._validation_error(
                "",
                "Input should be a valid dictionary or object to extract fields from",
                "model_attributes_type",
                body.decode("utf-8", "replace"),
            )
        data = parse_json_object(body)
        if data is None:
            return self._validation_error("", "JSON decode error", "json_invalid", {})
        if name == "completion":
            return self._completion(data)
        required = ("lora_name", "lora_path") if name == "load" else ("lora_name",)
        for key in required:
            if key not in data:
                return self._validation_error(key, "Field required", "missing", data)
            if not isinstance(data[key], str):
                return self._validation_error(key, "Input should be a valid string", "string_type", data[key])
        if not self.lora_enabled:
            return self.result(False, LORA_NOT_ENABLED, with_adapters=False)
        with self._maybe_global_lock():
            if name == "load":
                return self._load(data["lora_name"], data["lora_path"], bool(data.get("pinned")))
            return self._unload(data["lora_name"])

    @contextlib.contextmanager
    def _maybe_global_lock(self) -> Iterator[None]:
        if self.serialize_updates:
            with self._update_lock:
                yield
        else:
            yield

    # ---- /v1/models --------------------------------------------------------------------

    def models_payload(self) -> dict[str, Any]:
        cards: list[dict[str, Any]] = [
            {
                "id": self.served_model,
                "object": "model",
                "created": self.created,
                "owned_by": "sglang",
                "root": self.served_model,
                "parent": None,
                "max_model_len": self.max_model_len,
            }
        ]
        for adapter in self.adapters():
            cards.append(
                {
                    "id": adapter.name,
                    "object": "model",
                    "created": self.created,
                    "owned_by": "sglang",
                    "root": adapter.path,
                    "parent": self.served_model,
                    "max_model_len": None,
                }
            )
        return {"object": "list", "data": cards}

    # ---- load / unload -----------------------------------------------------------------

    def _load(self, name: str, path: str, pinned: bool) -> Answer:
        with self.name_lock(name):
            with self._lock:
                exists = name in self._adapters
                pinned_count = sum(1 for a in self._adapters.values() if a.pinned)
                count = len(self._adapters)
            limit = self.max_loaded_loras
            if self.capacity_mode == "refuse" and limit is not None and count >= limit:
                return self.result(
                    False,
                    f"Cannot load LoRA adapter {name} at path {path}. Maximum number of loaded LoRA "
                    f"adapters is {limit}. Please unload some LoRA adapters before loading new ones.",
                    with_adapters=False,
                )
            if exists:  # LoRAManager.validate_new_adapter
                return self.result(
                    False,
                    f"Failed to load LoRA adapter {name} because it is already loaded",
                    status=self.duplicate_status,
                )
            if pinned and pinned_count >= self.max_loras_per_batch - 1:
                return self.result(
                    False,
                    f"Failed to load LoRA adapter {name} as a pinned adapter. It is not allowed "
                    "to pin all slots in the LoRA memory pool to avoid starvation for unpinned "
                    "adapters and base models. Please increase your `--max-loras-per-batch` or "
                    "load it as unpinned LoRA adapters.",
                )
            with self.load_window() as (gen, start):
                failure: Answer | None = None
                try:
                    checked = _check(self.read_adapter(path), self.max_lora_rank)
                except AdapterNotFound:
                    failure = self.result(
                        False,
                        f"Failed to load LoRA adapter {name}: Can't find 'adapter_config.json' at '{path}'",
                    )
                except AdapterRankTooHigh as exc:
                    failure = self.result(
                        False,
                        f"LoRA adapter {name} with rank {exc.rank} is incompatible with the current "
                        "LoRA memory pool configuration. Please ensure that the LoRA adapter's rank "
                        "is within the configured `--max-lora-rank` and that the target modules are "
                        "included in `--lora-target-modules`.",
                    )
                except AdapterInvalid as exc:
                    failure = self.result(False, f"Failed to load LoRA adapter {name}: {exc}")
            if failure is not None:  # answered once the load's time is up, as a success is
                self.record_load(name, start, False)
                return failure
            with self._lock:
                lost = self._generation != gen
                stuck: str | None = None
                if not lost:
                    self.put_adapter(LoadedAdapter(name, path, pinned=pinned, md5s=checked.md5s))
                    self._ref_cache[name] = (path, pinned)
                    stuck = self._evict_over_limit()
            self.record_load(name, start, not lost)
            if lost:
                return DROP
            if stuck is not None:
                return self.result(False, stuck, with_adapters=False)
        return self.result(True)

    def _evict_over_limit(self) -> str | None:
        """Unload the least recently used unpinned adapters while the registry is over
        ``max_loaded_loras`` (caller holds the lock); the error when none is left to unload."""
        limit = self.max_loaded_loras
        if self.capacity_mode != "evict" or limit is None:
            return None
        while len(self._adapters) > limit:
            victim = next((n for n, a in self._adapters.items() if not a.pinned), None)
            if victim is None:
                registry = {n: a.path for n, a in self._adapters.items()}
                return (
                    "Didn't find any LoRA adapters when trying to evict LRU LoRA adapter. "
                    f"LoRA registry is: {registry}"
                )
            self.drop_adapter(victim)
            self._gpu.pop(victim, None)
            self.evictions += 1
        return None

    # ---- server info and requests ------------------------------------------------------

    def server_info(self) -> dict[str, Any]:
        """``/server_info``: the ServerArgs fields (those the stand-in models), then the patch."""
        info: dict[str, Any] = {
            "model_path": self.model_path,
            "served_model_name": self.served_model,
            "enable_lora": self.lora_enabled,
            "max_lora_rank": self.max_lora_rank,
            "max_loras_per_batch": self.max_loras_per_batch,
            "max_loaded_loras": self.max_loaded_loras,
            "lora_eviction_policy": self.lora_eviction_policy,
            "lora_paths": [{"lora_name": n, "lora_path": p} for n, p in self.static_adapters.items()],
            "dp_size": 1,
            "version": "0.5.3-devstack",
        }
        return {**info, **self.info_patch}

    def _completion(self, data: dict[str, Any]) -> Answer:
        """``POST /v1/completions``: the adapter a request names is touched as traffic does."""
        model = data.get("model")
        if not isinstance(model, str) or not model:
            return self._validation_error("model", "Field required", "missing", data)
        name = model.split(":", 1)[1] if model.startswith(self.served_model + ":") else model
        if name == self.served_model:
            return Response.json(200, completion_body(self, model, None, False))
        reloaded = False
        with self._lock:
            registered = name in self._adapters
            if registered:
                self._adapters.move_to_end(name)  # get_unregistered_loras: a lookup is a use
            cached = self._ref_cache.get(name)
        if not registered:
            if self.capacity_mode != "evict" or cached is None:
                known = list(self._ref_cache) if self.capacity_mode == "evict" else list(self.loaded)
                return self._request_error(
                    f"Got LoRA adapter that has never been loaded: {name}\nAll loaded adapters: {known}."
                )
            answer = self._load(name, cached[0], cached[1])  # _resolve_lora_path's implicit load
            if isinstance(answer, Response) and answer.status != 200:
                message = json.loads(answer.body).get("error_message") or ""
                if "already loaded" not in message:
                    return self._request_error(f"Failed to implicitly load LoRA adapter {name}: {message}")
            if not isinstance(answer, Response):
                return answer
            reloaded = True
            with self._lock:
                self.reloads += 1
        with self._lock:
            adapter = self._adapters.get(name)
            if adapter is None:  # evicted by a concurrent load before this request acquired it
                return self._request_error(f"LoRA adapter {name} was unloaded while the request waited")
            self._take_gpu_slot(name)
        return Response.json(200, completion_body(self, model, adapter, reloaded))

    def _take_gpu_slot(self, name: str) -> None:
        """A batch's adapter gets a slot of the GPU pool (caller holds the lock): a hit under
        ``lru`` counts as a use; a miss puts out the first unpinned slot in eviction order."""
        if name in self._gpu:
            if self.lora_eviction_policy == "lru":
                self._gpu.move_to_end(name)
            return
        while len(self._gpu) >= self.max_loras_per_batch:
            victim = next(
                (n for n in self._gpu if not (n in self._adapters and self._adapters[n].pinned)), None
            )
            if victim is None:
                break
            del self._gpu[victim]
        self._gpu[name] = None

    def _request_error(self, message: str) -> Response:
        """A request the tokenizer manager refuses (ValueError -> 400 ErrorResponse)."""
        return Response.json(
            400,
            {"object": "error", "message": message, "type": "BadRequestError", "param": None, "code": 400},
        )

    def _unload(self, name: str) -> Answer:
        with self.name_lock(name):
            with self._lock:
                exists = name in self._adapters
                keys = list(self._adapters)
            if not exists:  # LoRARegistry.unregister -> ValueError -> success=False, 400
                return self.result(
                    False,
                    f"LoRA with name {name} does not exist. Loaded LoRAs: odict_keys({keys!r})",
                    with_adapters=False,
                )
            if self.unload_latency_s > 0:
                time.sleep(self.unload_latency_s)
            with self._lock:
                self.drop_adapter(name)
        return self.result(True)
