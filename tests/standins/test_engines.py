"""Behaviour tests of the vLLM / SGLang engine stand-ins over real HTTP (httpx)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from devstack.standins.engines import EngineFleet, SglangReplica, VllmReplica, reserved_addresses
from devstack.standins.engines.base import AdapterFiles, LoadedAdapter

MODEL = "llama3-8b-base"


def write_adapter(root: Path, rel: str, *, rank: int = 16, peft_type: str = "LORA") -> Path:
    d = root / rel
    d.mkdir(parents=True, exist_ok=True)
    (d / "adapter_config.json").write_text(json.dumps({"peft_type": peft_type, "r": rank}))
    return d


@pytest.fixture(scope="module")
def fleet() -> Iterator[EngineFleet]:
    with EngineFleet(port=0) as f:
        yield f


@pytest.fixture
def mount(tmp_path: Path) -> Path:
    root = tmp_path / "mnt"
    for name in ("a", "b", "c"):
        write_adapter(root, f"loraadapters/ns/{MODEL}/{name}")
    write_adapter(root, "big", rank=128)
    write_adapter(root, "ia3", peft_type="IA3")
    (root / "badjson").mkdir()
    (root / "badjson" / "adapter_config.json").write_text("{not json")
    (root / "empty").mkdir()
    return root


_counter = iter(range(10_000))


@pytest.fixture
def vllm(fleet: EngineFleet, mount: Path) -> Iterator[VllmReplica]:
    key = f"v{next(_counter)}"
    r = fleet.create(key, "vllm", served_model=MODEL, mount_root=mount, max_lora_rank=64)
    assert isinstance(r, VllmReplica)
    yield r
    fleet.remove(key)


@pytest.fixture
def sglang(fleet: EngineFleet, mount: Path) -> Iterator[SglangReplica]:
    key = f"s{next(_counter)}"
    r = fleet.create(key, "sglang", served_model=MODEL, mount_root=mount, max_lora_rank=64)
    assert isinstance(r, SglangReplica)
    yield r
    fleet.remove(key)


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=5) as c:
        yield c


def path_of(name: str) -> str:
    return f"/loraadapters/ns/{MODEL}/{name}"


# ------------------------------------------------------------------------------------------
# vLLM
# ------------------------------------------------------------------------------------------


def vload(c: httpx.Client, r: VllmReplica, name: str, path: str, **extra: object) -> httpx.Response:
    return c.post(f"{r.url}/v1/load_lora_adapter", json={"lora_name": name, "lora_path": path, **extra})


def test_vllm_load_unload_success_text(vllm: VllmReplica, client: httpx.Client) -> None:
    resp = vload(client, vllm, "a", path_of("a"))
    assert resp.status_code == 200
    assert resp.text == "Success: LoRA adapter 'a' added successfully."
    assert "content-type" not in resp.headers
    assert vllm.loaded == {"a": path_of("a")}
    resp = client.post(f"{vllm.url}/v1/unload_lora_adapter", json={"lora_name": "a", "lora_int_id": 3})
    assert resp.status_code == 200
    assert resp.text == "Success: LoRA adapter 'a' removed successfully."
    assert vllm.loaded == {}


def test_a_replica_says_which_of_some_names_it_serves(vllm: VllmReplica, client: httpx.Client) -> None:
    assert vload(client, vllm, "a", path_of("a")).status_code == 200
    assert vload(client, vllm, "b", path_of("b")).status_code == 200
    assert vllm.serving(["a", "c", "b", "gone"]) == {"a", "b"}
    assert vllm.serving([]) == set()


def test_vllm_already_loaded_and_inplace(vllm: VllmReplica, client: httpx.Client, mount: Path) -> None:
    assert vload(client, vllm, "a", path_of("a")).status_code == 200
    resp = vload(client, vllm, "a", path_of("a"))
    assert resp.status_code == 400
    assert resp.json() == {
        "error": {
            "message": "The lora adapter 'a' has already been loaded. If you want to load the adapter "
            "in place, set 'load_inplace' to True.",
            "type": "InvalidUserInput",
            "param": None,
            "code": 400,
        }
    }
    resp = vload(client, vllm, "a", path_of("b"), load_inplace=True)
    assert resp.status_code == 200
    assert vllm.loaded == {"a": path_of("b")}
    vllm.configure(supports_load_inplace=False)
    resp = vload(client, vllm, "a", path_of("a"), load_inplace=True)
    assert resp.status_code == 400
    assert resp.json()["error"]["message"] == "The lora adapter 'a' has already been loaded."


def test_vllm_flat_error_shape(vllm: VllmReplica, client: httpx.Client) -> None:
    vllm.configure(error_shape="flat")
    resp = client.post(f"{vllm.url}/v1/unload_lora_adapter", json={"lora_name": "nope"})
    assert resp.status_code == 404
    assert resp.json() == {
        "object": "error",
        "message": "The lora adapter 'nope' cannot be found.",
        "type": "NotFoundError",
        "param": None,
        "code": 404,
    }


def test_vllm_unload_errors(vllm: VllmReplica, client: httpx.Client) -> None:
    resp = client.post(f"{vllm.url}/v1/unload_lora_adapter", json={"lora_name": "nope"})
    assert resp.status_code == 404
    assert resp.json()["error"] == {
        "message": "The lora adapter 'nope' cannot be found.",
        "type": "NotFoundError",
        "param": None,
        "code": 404,
    }
    resp = client.post(f"{vllm.url}/v1/unload_lora_adapter", json={"lora_name": ""})
    assert resp.status_code == 400
    assert resp.json()["error"]["type"] == "InvalidUserInput"
    assert resp.json()["error"]["message"] == "'lora_name' needs to be provided to unload a LoRA adapter."


@pytest.mark.parametrize(
    "body", [{"lora_name": "a"}, {"lora_path": "/x"}, {"lora_name": "", "lora_path": "/x"}]
)
def test_vllm_missing_fields(vllm: VllmReplica, client: httpx.Client, body: dict[str, str]) -> None:
    resp = client.post(f"{vllm.url}/v1/load_lora_adapter", json=body)
    assert resp.status_code == 400
    assert resp.json()["error"]["type"] == "InvalidUserInput"
    assert resp.json()["error"]["message"] == "Both 'lora_name' and 'lora_path' must be provided."


def test_vllm_bad_paths_and_configs(vllm: VllmReplica, client: httpx.Client) -> None:
    for path in ("/loraadapters/missing", "/empty"):
        resp = vload(client, vllm, "x", path)
        assert resp.status_code == 404
        assert resp.json()["error"] == {
            "message": f"Loading lora x failed: No adapter found for {path}",
            "type": "NotFoundError",
            "param": None,
            "code": 404,
        }
    resp = vload(client, vllm, "big", "/big")
    assert resp.status_code == 400
    assert resp.json()["error"]["type"] == "BadRequestError"
    assert resp.json()["error"]["message"] == "LoRA rank 128 is greater than max_lora_rank 64."
    resp = vload(client, vllm, "ia3", "/ia3")
    assert resp.status_code == 400
    assert resp.json()["error"]["type"] == "BadRequestError"
    assert "peft_type" in resp.json()["error"]["message"]
    vllm.configure(invalid_adapter_status=500)
    resp = vload(client, vllm, "bj", "/badjson")
    assert resp.status_code == 500
    assert resp.json()["error"]["type"] == "InternalServerError"
    assert vllm.loaded == {}


def test_vllm_absolute_path_and_mount_prefix(fleet: EngineFleet, mount: Path, client: httpx.Client) -> None:
    r = fleet.create(
        "prefix", "vllm", served_model=MODEL, mount_root=mount, engine_mount_prefix="/mnt/seaweedfs"
    )
    try:
        abs_path = str(mount / "loraadapters" / "ns" / MODEL / "a")
        assert vload(client, r, "abs", abs_path).status_code == 200  # type: ignore[arg-type]
        seaweed = f"/mnt/seaweedfs/loraadapters/ns/{MODEL}/b"
        assert vload(client, r, "sw", seaweed).status_code == 200  # type: ignore[arg-type]
        assert r.loaded == {"abs": abs_path, "sw": seaweed}
    finally:
        fleet.remove("prefix")


def test_vllm_routes_absent_without_flag(fleet: EngineFleet, mount: Path, client: httpx.Client) -> None:
    r = fleet.create("noflag", "vllm", served_model=MODEL, mount_root=mount, runtime_lora_updating=False)
    try:
        for route in ("load_lora_adapter", "unload_lora_adapter"):
            resp = client.post(f"{r.url}/v1/{route}", json={"lora_name": "a", "lora_path": path_of("a")})
            assert resp.status_code == 404
            assert resp.json() == {"detail": "Not Found"}
        assert client.get(f"{r.url}/v1/models").status_code == 200
    finally:
        fleet.remove("noflag")


def test_vllm_content_type(vllm: VllmReplica, client: httpx.Client) -> None:
    body = json.dumps({"lora_name": "a", "lora_path": path_of("a")})
    url = f"{vllm.url}/v1/load_lora_adapter"
    resp = client.post(url, content=body, headers={"Content-Type": "text/plain"})
    assert resp.status_code == 400
    assert resp.json()["error"]["message"] == "Unsupported Media Type: Only 'application/json' is allowed"
    vllm.configure(old_content_type_415=True)
    resp = client.post(url, content=body)  # no content type at all
    assert resp.status_code == 415
    assert resp.json() == {"detail": "Unsupported Media Type: Only 'application/json' is allowed"}
    resp = client.post(url, content=body, headers={"Content-Type": "application/json; charset=utf-8"})
    assert resp.status_code == 200


def test_vllm_models_and_static(fleet: EngineFleet, mount: Path, client: httpx.Client) -> None:
    r = fleet.create(
        "static",
        "vllm",
        served_model=MODEL,
        mount_root=mount,
        static_adapters={"sql": path_of("c")},
        model_path="/models/llama3",
    )
    try:
        assert vload(client, r, "a", path_of("a")).status_code == 200  # type: ignore[arg-type]
        data = client.get(f"{r.url}/v1/models").json()
        assert data["object"] == "list"
        base, sql, a = data["data"]
        assert base["id"] == MODEL and base["parent"] is None and base["root"] == "/models/llama3"
        assert base["owned_by"] == "vllm" and base["max_model_len"] == 4096 and base["permission"]
        assert sql == {**sql, "id": "sql", "root": path_of("c"), "parent": MODEL, "max_model_len": None}
        assert a == {**a, "id": "a", "root": path_of("a"), "parent": MODEL, "object": "model"}
        # restart forgets dynamic adapters; static ones come back
        r.restart(unhealthy_for_s=0.3)
        assert client.get(f"{r.url}/health").status_code == 503
        assert not r.healthy
        assert r.loaded == {"sql": path_of("c")}
        time.sleep(0.35)
        resp = client.get(f"{r.url}/health")
        assert resp.status_code == 200 and resp.content == b""
        assert [c["id"] for c in client.get(f"{r.url}/v1/models").json()["data"]] == [MODEL, "sql"]
    finally:
        fleet.remove("static")


def test_unknown_route_and_method(vllm: VllmReplica, client: httpx.Client) -> None:
    assert client.get(f"{vllm.url}/nope").json() == {"detail": "Not Found"}
    assert client.get(f"{vllm.url}/v1/load_lora_adapter").status_code == 405


# ------------------------------------------------------------------------------------------
# SGLang
# ------------------------------------------------------------------------------------------


def sload(c: httpx.Client, r: SglangReplica, name: str, path: str, **extra: object) -> httpx.Response:
    return c.post(f"{r.url}/load_lora_adapter", json={"lora_name": name, "lora_path": path, **extra})


def test_sglang_load_unload(sglang: SglangReplica, client: httpx.Client) -> None:
    resp = sload(client, sglang, "a", path_of("a"), pinned=True)
    assert resp.status_code == 200
    assert resp.json() == {"success": True, "error_message": None, "loaded_adapters": {"a": path_of("a")}}
    assert client.post(f"{sglang.url}/v1/load_lora_adapter", json={}).status_code == 404
    resp = client.post(f"{sglang.url}/unload_lora_adapter", json={"lora_name": "a"})
    assert resp.status_code == 200
    assert resp.json() == {"success": True, "error_message": None, "loaded_adapters": {}}


@pytest.mark.parametrize("status", [400, 409])
def test_sglang_duplicate(fleet: EngineFleet, mount: Path, client: httpx.Client, status: int) -> None:
    r = fleet.create(f"dup{status}", "sglang", served_model=MODEL, mount_root=mount, duplicate_status=status)
    try:
        assert sload(client, r, "a", path_of("a")).status_code == 200  # type: ignore[arg-type]
        resp = sload(client, r, "a", path_of("a"))  # type: ignore[arg-type]
        assert resp.status_code == status
        assert resp.json() == {
            "success": False,
            "error_message": "Failed to load LoRA adapter a because it is already loaded",
            "loaded_adapters": {"a": path_of("a")},
        }
    finally:
        fleet.remove(f"dup{status}")


def test_sglang_errors(sglang: SglangReplica, client: httpx.Client) -> None:
    sload(client, sglang, "b", path_of("b"))
    resp = client.post(f"{sglang.url}/unload_lora_adapter", json={"lora_name": "zz"})
    assert resp.status_code == 400
    assert resp.json() == {
        "success": False,
        "error_message": "LoRA with name zz does not exist. Loaded LoRAs: odict_keys(['b'])",
        "loaded_adapters": None,
    }
    resp = sload(client, sglang, "big", "/big")
    assert resp.status_code == 400
    assert resp.json()["error_message"].startswith(
        "LoRA adapter big with rank 128 is incompatible with the current LoRA memory pool configuration"
    )
    resp = sload(client, sglang, "ia3", "/ia3")
    assert resp.status_code == 400 and "peft_type" in resp.json()["error_message"]
    resp = sload(client, sglang, "m", "/missing")
    assert resp.status_code == 400 and resp.json()["success"] is False
    resp = client.post(f"{sglang.url}/load_lora_adapter", json={"lora_name": "x"})
    assert resp.status_code == 422
    assert resp.json()["detail"][0]["loc"] == ["body", "lora_path"]
    sglang.configure(lora_enabled=False)
    resp = sload(client, sglang, "c", path_of("c"))
    assert resp.status_code == 400
    assert resp.json() == {
        "success": False,
        "error_message": "LoRA is not enabled. Please set `--enable-lora` to enable LoRA.",
        "loaded_adapters": None,
    }


def test_sglang_models_and_restart(sglang: SglangReplica, client: httpx.Client) -> None:
    sload(client, sglang, "a", path_of("a"))
    base, a = client.get(f"{sglang.url}/v1/models").json()["data"]
    assert base["id"] == MODEL and base["root"] == MODEL and base["parent"] is None
    assert a["id"] == "a" and a["root"] == path_of("a") and a["parent"] == MODEL
    resp = client.post(f"{sglang.url}/_devstack/restart", json={"unhealthy_for_s": 0.3})
    assert resp.status_code == 200 and resp.json()["restarts"] == 1
    assert client.get(f"{sglang.url}/health").status_code == 503
    assert sload(client, sglang, "a", path_of("a")).status_code == 503
    time.sleep(0.35)
    assert client.get(f"{sglang.url}/health").status_code == 200
    assert sglang.loaded == {}


# ------------------------------------------------------------------------------------------
# Faults, admin, concurrency, fleet
# ------------------------------------------------------------------------------------------


def test_fault_status_times_routes(vllm: VllmReplica, client: httpx.Client) -> None:
    resp = client.post(f"{vllm.url}/_devstack/faults", json={"status": 500, "times": 2, "routes": ["load"]})
    assert resp.status_code == 200
    assert client.get(f"{vllm.url}/v1/models").status_code == 200  # other route untouched
    for _ in range(2):
        resp = vload(client, vllm, "a", path_of("a"))
        assert resp.status_code == 500 and resp.json()["error"]["type"] == "InternalServerError"
    assert vload(client, vllm, "a", path_of("a")).status_code == 200
    state = client.get(f"{vllm.url}/_devstack/state").json()
    assert state["calls"]["load"] == 3 and state["calls"]["models"] == 1
    assert state["loaded"] == {"a": path_of("a")} and state["healthy"] is True


def test_fault_delay_timeout(sglang: SglangReplica, client: httpx.Client) -> None:
    sglang.inject(delay_s=0.5, times=1)
    with pytest.raises(httpx.ReadTimeout):
        client.get(f"{sglang.url}/health", timeout=0.1)
    time.sleep(0.45)
    assert client.get(f"{sglang.url}/health").status_code == 200


def test_fault_refuse(vllm: VllmReplica, client: httpx.Client) -> None:
    client.post(f"{vllm.url}/_devstack/faults", json={"refuse": True, "times": 2})
    for _ in range(2):
        with pytest.raises(httpx.TransportError):
            client.get(f"{vllm.url}/v1/models")
    assert client.get(f"{vllm.url}/v1/models").status_code == 200
    assert vllm.calls["models"] == 3


@pytest.mark.parametrize("status", [None, 500])
def test_fault_restart_mid_load(vllm: VllmReplica, client: httpx.Client, status: int | None) -> None:
    assert vload(client, vllm, "a", path_of("a")).status_code == 200
    spec: dict[str, object] = {"restart_mid_load": True}
    if status is not None:
        spec["status"] = status
    client.post(f"{vllm.url}/_devstack/faults", json=spec)
    if status is None:
        with pytest.raises(httpx.TransportError):
            vload(client, vllm, "b", path_of("b"))
    else:
        assert vload(client, vllm, "b", path_of("b")).status_code == 500
    assert vllm.loaded == {} and vllm.restarts == 1
    assert vload(client, vllm, "b", path_of("b")).status_code == 200


def test_restart_during_inflight_load_drops(sglang: SglangReplica, client: httpx.Client) -> None:
    sglang.configure(load_latency_s=0.3)
    errors: list[BaseException] = []

    def go() -> None:
        try:
            sload(client, sglang, "a", path_of("a"))
        except httpx.TransportError as exc:
            errors.append(exc)

    t = threading.Thread(target=go)
    t.start()
    time.sleep(0.1)
    sglang.restart(unhealthy_for_s=0)
    t.join()
    assert len(errors) == 1 and sglang.loaded == {}


def test_clear_faults_and_config_over_http(vllm: VllmReplica, client: httpx.Client) -> None:
    client.post(f"{vllm.url}/_devstack/faults", json=[{"status": 503, "times": None}])
    assert client.get(f"{vllm.url}/health").status_code == 503
    assert client.get(f"{vllm.url}/_devstack/faults").json()["faults"][0]["times"] is None
    assert client.delete(f"{vllm.url}/_devstack/faults").status_code == 200
    assert client.get(f"{vllm.url}/health").status_code == 200
    assert client.post(f"{vllm.url}/_devstack/faults", json={"bogus": 1}).status_code == 400
    resp = client.post(f"{vllm.url}/_devstack/config", json={"load_latency_s": 0.1})
    assert resp.status_code == 200 and resp.json()["load_latency_s"] == 0.1
    assert client.post(f"{vllm.url}/_devstack/config", json={"nope": 1}).status_code == 400


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_concurrent_loads_overlap(fleet: EngineFleet, tmp_path: Path, engine: str) -> None:
    for i in range(10):
        write_adapter(tmp_path, f"ad{i}")
    r = fleet.create(f"conc-{engine}", engine, mount_root=tmp_path, load_latency_s=0.1)  # type: ignore[arg-type]
    prefix = "/v1" if engine == "vllm" else ""
    try:
        with httpx.Client(timeout=5) as c, ThreadPoolExecutor(10) as pool:
            t0 = time.monotonic()
            codes = list(
                pool.map(
                    lambda i: (
                        c.post(
                            f"{r.url}{prefix}/load_lora_adapter",
                            json={"lora_name": f"ad{i}", "lora_path": f"/ad{i}"},
                        ).status_code
                    ),
                    range(10),
                )
            )
            elapsed = time.monotonic() - t0
        assert codes == [200] * 10
        loads = httpx.get(f"{r.url}/_devstack/state").json()["loads"]
        assert len(loads) == 10 and all(x["ok"] for x in loads)
        # overlap: the last start happens before the first end
        assert max(x["start"] for x in loads) < min(x["end"] for x in loads)
        assert elapsed < 0.9
    finally:
        fleet.remove(f"conc-{engine}")


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_load_latency_is_the_loads_whole_time_its_reads_included(
    vllm: VllmReplica, sglang: SglangReplica, client: httpx.Client, engine: str
) -> None:
    """A load answers once `load_latency_s` is up, its file reads counted in it (a real engine's
    load time is mostly reading the weights): reads of 0.6 s under a latency of 1 s answer after
    ~1 s, not 1.6 s; a load whose files are missing answers after the latency too."""
    replica: VllmReplica | SglangReplica = vllm if engine == "vllm" else sglang
    replica.configure(load_latency_s=1.0)
    read = replica.read_adapter

    def slow_read(path: str) -> AdapterFiles | None:
        time.sleep(0.6)
        return read(path)

    replica.read_adapter = slow_read  # type: ignore[method-assign]
    load = vload if isinstance(replica, VllmReplica) else sload
    for name, path, ok in (("a", path_of("a"), True), ("b", "/nowhere/b", False)):
        started = time.monotonic()
        answer = load(client, replica, name, path)  # type: ignore[arg-type]
        elapsed = time.monotonic() - started
        assert (answer.status_code == 200) == ok, answer.text
        assert 1.0 <= elapsed < 1.45, elapsed


def test_same_name_serialised(vllm: VllmReplica) -> None:
    vllm.configure(load_latency_s=0.1)
    with httpx.Client(timeout=5) as c, ThreadPoolExecutor(3) as pool:
        codes = sorted(pool.map(lambda _: vload(c, vllm, "a", path_of("a")).status_code, range(3)))
    assert codes == [200, 400, 400]


def test_fleet_distinct_addresses_and_release(mount: Path) -> None:
    with EngineFleet(port=0, mount_root=mount) as f:
        replicas = [f.create(f"r{i}", "vllm" if i % 2 else "sglang") for i in range(6)]
        hosts = {r.host for r in replicas}
        assert len(hosts) == 6 and all(h.startswith("127.") for h in hosts)
        assert hosts <= reserved_addresses()
        for r in replicas:
            assert httpx.get(f"{r.url}/health").status_code == 200
        gone = replicas[0].host
        f.remove("r0")
        assert gone not in reserved_addresses()
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{replicas[0].url}/health", timeout=1)
    assert not hosts & reserved_addresses()


def test_fixed_port_start_stop_fast(mount: Path) -> None:
    with EngineFleet(port=18000, mount_root=mount) as f:
        t0 = time.monotonic()
        rs = [f.create(f"p{i}", "vllm") for i in range(20)]
        per_replica = (time.monotonic() - t0) / 20
        assert per_replica < 0.1
        assert {r.port for r in rs} == {18000} and len({r.url for r in rs}) == 20
        with httpx.Client() as c:  # keep-alive: one connection serves many requests
            for _ in range(5):
                assert c.get(f"{rs[0].url}/health").status_code == 200
        t0 = time.monotonic()
    assert time.monotonic() - t0 < 2


def test_an_idle_replica_sleeps_until_a_connection_and_still_stops_promptly() -> None:
    """poll_interval_s=None: the serving loop waits for a connection instead of waking 20 times
    a second (5,000 of them in one process); stop() connects to wake it."""
    replica = VllmReplica(host="127.0.0.1", poll_interval_s=None).start()
    with httpx.Client(timeout=5) as http:
        assert http.get(replica.url + "/v1/models").status_code == 200
    started = time.monotonic()
    replica.stop()
    assert time.monotonic() - started < 2
    with pytest.raises(httpx.ConnectError):
        httpx.get(replica.url + "/v1/models", timeout=1)


def test_the_listing_follows_every_change_of_the_adapters(vllm: VllmReplica, client: httpx.Client) -> None:
    """The /v1/models answer is encoded once per state: a load, a direct change of the state
    and a restart each show at once."""

    def names() -> list[str]:
        cards = client.get(vllm.url + "/v1/models").json()["data"]
        return [c["id"] for c in cards if c.get("parent")]

    assert names() == []
    with vllm._lock:
        vllm._adapters["a"] = LoadedAdapter("a", "/mnt/a")
    assert names() == ["a"]
    with vllm._lock:
        vllm._adapters.pop("a")
    assert names() == []
    with vllm._lock:
        vllm._adapters["b"] = LoadedAdapter("b", "/mnt/b")
    vllm.restart(unhealthy_for_s=0)
    assert names() == []
