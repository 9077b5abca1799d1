"""vLLM stand-in replica (OpenAI-compatible server with runtime LoRA updating).

Mirrors, per route:

* ``POST /v1/load_lora_adapter`` / ``POST /v1/unload_lora_adapter``:
  vllm/entrypoints/serve/lora/api_router.py (routes registered only when
  ``envs.VLLM_ALLOW_RUNTIME_LORA_UPDATING``; ``Depends(validate_json_request)``) and
  vllm/entrypoints/openai/models/serving.py ``OpenAIServingModels.load_lora_adapter`` /
  ``unload_lora_adapter`` / ``_check_load_lora_adapter_request`` /
  ``_check_unload_lora_adapter_request`` (older: vllm/entrypoints/openai/serving_models.py).
* ``GET /v1/models``: ``OpenAIServingModels.show_available_models`` (base cards, then LoRA cards).
* ``GET /health``: vllm/entrypoints/openai/api_server.py ``health`` (200, empty body).
* Error bodies: vllm/entrypoints/serve/utils/error_response.py / ``ErrorResponse``
  (nested ``{"error": {...}}`` since v0.10.1, PR #22099; flat ``{"object": "error", ...}`` before).

Choices where versions differ (all switchable):

* ``error_shape="nested"`` (current) or ``"flat"`` (< v0.10.1).
* ``old_content_type_415=False``: a non-JSON Content-Type answers 400 ``BadRequestError``
  (current: ``RequestValidationError``); ``True`` answers 415 ``{"detail": "Unsupported Media
  Type: Only 'application/json' is allowed"}`` (older ``HTTPException``).
* ``invalid_adapter_status=400``: an unreadable / non-LoRA ``adapter_config.json`` answers 400
  ``BadRequestError`` (older releases); 500 gives ``InternalServerError`` (current code). A rank
  above ``max_lora_rank`` is always 400 ``BadRequestError`` (upstream ``BADREQUEST_CASES``).
* ``supports_load_inplace=True``: ``load_inplace`` honoured (PR #31326) and the "already loaded"
  message carries the in-place hint; ``False`` gives the older short message and ignores it.
* ``unload_frees=False``: unload drops the name from the frontend registry only
  (``OpenAIServingModels.unload_lora_adapter`` is ``del self.lora_requests[lora_name]``, issue
  #54839): the worker keeps the weights in its CPU cache and GPU slot until LRU puts them out,
  and a load under the same name gets a fresh ``lora_int_id``, so both copies are cached.
  ``True`` is the fix proposed in PR #54939 (``engine_client.remove_lora`` first).

Capacity (vllm/lora/worker_manager.py ``LRUCacheWorkerLoRAManager``, vllm/lora/model_manager.py
``LRUCacheLoRAModelManager``; vllm/config/lora.py ``LoRAConfig``: ``max_loras`` default 1,
``max_cpu_loras`` default ``max_loras``, and at least it):

* ``/v1/models`` lists every name loaded and not unloaded: the frontend registry is unbounded,
  and a load answers 200 whatever the worker holds.
* A load calls ``engine_client.add_lora``: the worker's CPU cache (``max_cpu_loras`` entries,
  keyed by ``lora_int_id``) takes the weights and, when full, first removes the least recently
  used (``remove_oldest_adapter``). Pinning exists only through the Python API.
* ``POST /v1/completions`` with ``model`` = an adapter name (``_check_model``: an unknown name is
  404 "The model `<n>` does not exist."): ``_apply_adapters`` re-reads an adapter the cache lost
  from its ``lora_path`` (``_load_adapter``), evicting the least recently used, then activates it
  in one of ``max_loras`` GPU slots (LRU as well). The answer carries ``served_by`` (base.py
  ``completion_body``): the MD5s of what was read, at the load or again at this request.
"""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict
from email.message import Message
from http import HTTPStatus
from pathlib import Path
from typing import Any, ClassVar, Literal

from devstack.standins.engines.answers import DROP, JSON, METHOD_NOT_ALLOWED, NOT_FOUND, Answer, Response
from devstack.standins.engines.base import (
    AdapterInvalid,
    AdapterNotFound,
    AdapterRankTooHigh,
    EngineReplica,
    LoadedAdapter,
    check_adapter_dir,
    completion_body,
    media_type,
    parse_json_object,
)

_ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError"}
_ROUTES = {
    "/health": ("GET", "health"),
    "/v1/models": ("GET", "models"),
    "/v1/load_lora_adapter": ("POST", "load"),
    "/v1/unload_lora_adapter": ("POST", "unload"),
    "/v1/completions": ("POST", "completion"),
}
_LORA_IDS = itertools.count(1)
"""vllm/lora/request.py ids: one per load, process-wide (models.py ``get_lora_id``)."""
_LORA_PATHS = frozenset({"/v1/load_lora_adapter", "/v1/unload_lora_adapter"})
UNSUPPORTED_MEDIA = "Unsupported Media Type: Only 'application/json' is allowed"


class VllmReplica(EngineReplica):
    """A vLLM replica with ``--enable-lora`` (see module docstring for the rules)."""

    engine: ClassVar[str] = "vllm"
    CONFIGURABLE: ClassVar[dict[str, type]] = {
        **EngineReplica.CONFIGURABLE,
        "runtime_lora_updating": bool,
        "error_shape": str,
        "old_content_type_415": bool,
        "invalid_adapter_status": int,
        "supports_load_inplace": bool,
        "unload_frees": bool,
    }

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        served_model: str = "base-model",
        mount_root: Path | str | None = None,
        max_lora_rank: int = 64,
        static_adapters: dict[str, str] | None = None,
        runtime_lora_updating: bool = True,
        load_latency_s: float = 0.0,
        *,
        error_shape: Literal["nested", "flat"] = "nested",
        old_content_type_415: bool = False,
        invalid_adapter_status: int = 400,
        supports_load_inplace: bool = True,
        max_loras: int = 1,
        max_cpu_loras: int | None = None,
        unload_frees: bool = False,
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
        self.runtime_lora_updating = runtime_lora_updating
        self.error_shape: str = error_shape
        self.old_content_type_415 = old_content_type_415
        self.invalid_adapter_status = invalid_adapter_status
        self.supports_load_inplace = supports_load_inplace
        self._validate_setting("error_shape", error_shape)
        self._validate_setting("invalid_adapter_status", invalid_adapter_status)
        cpu = max_loras if max_cpu_loras is None else max_cpu_loras
        if max_loras < 1 or cpu < max_loras:
            # LoRAConfig.__post_init__: max_cpu_loras must be >= max_loras (the engine does not start)
            raise ValueError(f"max_cpu_loras ({cpu}) must be >= max_loras ({max_loras}) >= 1")
        self.max_loras = max_loras
        self.max_cpu_loras = cpu
        self.unload_frees = unload_frees
        self._ids: dict[str, int] = {}
        """lora_requests: name -> lora_int_id of the frontend registry."""
        self._cpu: OrderedDict[int, LoadedAdapter] = OrderedDict()
        """The worker's CPU cache, least recently used first."""
        self._gpu: OrderedDict[int, None] = OrderedDict()
        """The ``max_loras`` GPU slots, least recently used first."""

    def forget_memory(self) -> None:
        self._ids = {}
        self._cpu = OrderedDict()
        self._gpu = OrderedDict()

    def memory(self) -> dict[str, Any]:
        with self._lock:
            return {
                # `md5s`: what the cached weights were read from; `current`: the entry a request
                # naming the adapter uses (an unloaded name's old entry is never used again)
                "cpu": [
                    {
                        "id": i,
                        "name": a.name,
                        "path": a.path,
                        "md5s": dict(a.md5s),
                        "current": self._ids.get(a.name) == i,
                    }
                    for i, a in self._cpu.items()
                ],
                "gpu": list(self._gpu),
                "resident": sorted({a.name for i, a in self._cpu.items() if self._ids.get(a.name) == i}),
            }

    def _cache(self, lora_id: int, adapter: LoadedAdapter) -> None:
        """``add_adapter`` (caller holds the lock): into the CPU cache, the oldest out if full."""
        if lora_id in self._cpu:
            self._cpu[lora_id] = adapter
            self._cpu.move_to_end(lora_id)
            return
        while len(self._cpu) >= self.max_cpu_loras:
            old, _ = self._cpu.popitem(last=False)
            self._gpu.pop(old, None)
            self.evictions += 1
        self._cpu[lora_id] = adapter

    def _validate_setting(self, key: str, value: Any) -> None:
        super()._validate_setting(key, value)
        if key == "error_shape" and value not in ("nested", "flat"):
            raise ValueError("error_shape must be 'nested' or 'flat'")
        if key == "invalid_adapter_status" and value not in (400, 500):
            raise ValueError("invalid_adapter_status must be 400 or 500")

    # ---- errors ------------------------------------------------------------------------

    def error(self, status: int, message: str, err_type: str | None = None) -> Response:
        """``create_error_response`` in vLLM's serving base: ErrorResponse JSON, HTTP ``status``."""
        if err_type is None:
            err_type = _ERROR_TYPES.get(status) or HTTPStatus(status).phrase.replace(" ", "")
        if self.error_shape == "flat":
            body: dict[str, Any] = {
                "object": "error",
                "message": message,
                "type": err_type,
                "param": None,
                "code": status,
            }
        else:
            body = {"error": {"message": message, "type": err_type, "param": None, "code": status}}
        return Response.json(status, body)

    def error_answer(self, route: str, status: int, message: str) -> Response:
        if route == "health":
            return Response(status)
        return self.error(status, message)

    # ---- routing -----------------------------------------------------------------------

    def route_name(self, method: str, path: str) -> str | None:
        entry = _ROUTES.get(path)
        return entry[1] if entry else None

    def route(self, method: str, path: str, headers: Message, body: bytes) -> Answer:
        entry = _ROUTES.get(path)
        if entry is None or (path in _LORA_PATHS and not self.runtime_lora_updating):
            return NOT_FOUND  # route not registered (VLLM_ALLOW_RUNTIME_LORA_UPDATING unset)
        if method != entry[0]:
            return METHOD_NOT_ALLOWED
        name = entry[1]
        if name == "health":
            return Response(200)
        if name == "models":
            return self.listing_answer(self.models_payload)
        if media_type(headers) != JSON:  # validate_json_request
            if self.old_content_type_415:
                return Response.json(415, {"detail": UNSUPPORTED_MEDIA})
            return self.error(400, UNSUPPORTED_MEDIA, "BadRequestError")
        data = parse_json_object(body)
        if data is None:  # FastAPI RequestValidationError -> 400 in vLLM's handler
            return self.error(400, "Request body must be a JSON object.", "BadRequestError")
        if name == "completion":
            return self._completion(data)
        if name == "load":
            return self._load(data)
        return self._unload(data)

    # ---- /v1/models --------------------------------------------------------------------

    def _permission(self) -> list[dict[str, Any]]:
        return [
            {
                "id": f"modelperm-{self.host.replace('.', '')}{self.port}",
                "object": "model_permission",
                "created": self.created,
                "allow_create_engine": False,
                "allow_sampling": True,
                "allow_logprobs": True,
                "allow_search_indices": False,
                "allow_view": True,
                "allow_fine_tuning": False,
                "organization": "*",
                "group": None,
                "is_blocking": False,
            }
        ]

    def models_payload(self) -> dict[str, Any]:
        """``show_available_models``: base card, then one card per adapter (load order)."""
        cards: list[dict[str, Any]] = [
            {
                "id": self.served_model,
                "object": "model",
                "created": self.created,
                "owned_by": "vllm",
                "root": self.model_path,
                "parent": None,
                "max_model_len": self.max_model_len,
                "permission": self._permission(),
            }
        ]
        for adapter in self.adapters():
            cards.append(
                {
                    "id": adapter.name,
                    "object": "model",
                    "created": self.created,
                    "owned_by": "vllm",
                    "root": adapter.path,
                    "parent": self.served_model,
                    "max_model_len": None,
                    "permission": self._permission(),
                }
            )
        return {"object": "list", "data": cards}

    # ---- load / unload -----------------------------------------------------------------

    def _already_loaded(self, name: str) -> str:
        if self.supports_load_inplace:
            return (
                f"The lora adapter '{name}' has already been loaded. If you want to load the "
                "adapter in place, set 'load_inplace' to True."
            )
        return f"The lora adapter '{name}' has already been loaded."

    def _load(self, data: dict[str, Any]) -> Answer:
        """``OpenAIServingModels.load_lora_adapter`` (+ ``_check_load_lora_adapter_request``)."""
        name, path = data.get("lora_name"), data.get("lora_path")
        if (name is not None and not isinstance(name, str)) or (
            path is not None and not isinstance(path, str)
        ):
            return self.error(400, "lora_name and lora_path must be strings.", "BadRequestError")
        if not name or not path:
            return self.error(400, "Both 'lora_name' and 'lora_path' must be provided.", "InvalidUserInput")
        inplace = bool(data.get("load_inplace", False)) and self.supports_load_inplace
        with self.name_lock(name):  # lora_resolver_lock[lora_name]
            with self._lock:
                exists = name in self._adapters
            if exists and not inplace:
                return self.error(400, self._already_loaded(name), "InvalidUserInput")
            with self.load_window() as (gen, start):
                failure: Answer | None = None
                try:
                    checked = check_adapter_dir(self.read_adapter(path), self.max_lora_rank)
                except AdapterNotFound:
                    # vllm/lora/worker_manager.py: LoRAAdapterNotFoundError -> 404 NotFoundError
                    failure = self.error(
                        404, f"Loading lora {name} failed: No adapter found for {path}", "NotFoundError"
                    )
                except AdapterRankTooHigh as exc:
                    # vllm/lora/peft_helper.py PEFTHelper.validate_legacy
                    failure = self.error(
                        400,
                        f"LoRA rank {exc.rank} is greater than max_lora_rank {exc.max_rank}.",
                        "BadRequestError",
                    )
                except AdapterInvalid as exc:
                    failure = self.error(self.invalid_adapter_status, f"Loading lora {name} failed: {exc}")
            if failure is not None:  # answered once the load's time is up, as a success is
                self.record_load(name, start, False)
                return failure
            with self._lock:
                if self._generation != gen:  # engine restarted while loading
                    lost = True
                else:
                    lost = False
                    current = self._adapters.get(name)
                    if current is not None:  # in place: same lora_int_id, same position
                        current.path = path
                        current.static = False
                        current.md5s = checked.md5s
                        self._adapters._changed()  # the listing's `root` names the new path
                        lora_id = self._ids.setdefault(name, next(_LORA_IDS))
                    else:
                        self.put_adapter(LoadedAdapter(name, path, md5s=checked.md5s))
                        lora_id = self._ids[name] = next(_LORA_IDS)
                    self._cache(lora_id, LoadedAdapter(name, path, md5s=checked.md5s))
            self.record_load(name, start, not lost)
            if lost:
                return DROP
        return Response(200, f"Success: LoRA adapter '{name}' added successfully.".encode())

    def _unload(self, data: dict[str, Any]) -> Answer:
        """``OpenAIServingModels.unload_lora_adapter`` (``lora_int_id`` is accepted, ignored)."""
        name = data.get("lora_name")
        if not isinstance(name, str) or not name:
            return self.error(
                400,
                "'lora_name' needs to be provided to unload a LoRA adapter.",
                "InvalidUserInput",
            )
        with self.name_lock(name):
            with self._lock:
                exists = name in self._adapters
            if not exists:
                return self.error(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError")
            if self.unload_latency_s > 0:
                time.sleep(self.unload_latency_s)
            with self._lock:
                self.drop_adapter(name)
                lora_id = self._ids.pop(name, None)
                if self.unload_frees and lora_id is not None:
                    self._cpu.pop(lora_id, None)
                    self._gpu.pop(lora_id, None)
        return Response(200, f"Success: LoRA adapter '{name}' removed successfully.".encode())

    def _completion(self, data: dict[str, Any]) -> Answer:
        """``POST /v1/completions``: the named adapter's weights are used as a request uses them."""
        model = data.get("model")
        if not isinstance(model, str) or not model:
            return self.error(400, "The model field is required.", "BadRequestError")
        if model == self.served_model:
            return Response.json(200, completion_body(self, model, None, False))
        with self._lock:
            registered = self._adapters.get(model)
            lora_id = self._ids.get(model)
            if lora_id is None and registered is not None:  # --lora-modules: an id at start
                lora_id = self._ids[model] = next(_LORA_IDS)
            cached = self._cpu.get(lora_id) if lora_id is not None else None
            if cached is not None:
                self._cpu.move_to_end(lora_id)  # type: ignore[arg-type]
        if registered is None or lora_id is None:
            return self.error(404, f"The model `{model}` does not exist.", "NotFoundError")
        reloaded = False
        if cached is None:  # WorkerLoRAManager._load_adapter: read from lora_path again
            try:
                checked = check_adapter_dir(self.read_adapter(registered.path), self.max_lora_rank)
            except AdapterNotFound:
                missing = f"Loading lora {model} failed: No adapter found for {registered.path}"
                return self.error(404, missing, "NotFoundError")
            except (AdapterRankTooHigh, AdapterInvalid) as exc:
                return self.error(500, f"Loading lora {model} failed: {exc}", "InternalServerError")
            cached = LoadedAdapter(model, registered.path, md5s=checked.md5s)
            reloaded = True
            with self._lock:
                self._cache(lora_id, cached)
                self.reloads += 1
        with self._lock:
            if lora_id in self._gpu:
                self._gpu.move_to_end(lora_id)
            else:
                while len(self._gpu) >= self.max_loras:
                    self._gpu.popitem(last=False)
                self._gpu[lora_id] = None
        return Response.json(200, completion_body(self, model, cached, reloaded))
