"""`make run`: the whole adapter lifecycle on the embedded stack, narrated for a newcomer.

Steps: targets (a Model, a 3-replica vLLM ModelDeployment, a 2-replica SGLang
InferenceService) -> four adapters (two good vllm adapters, one whose declared MD5 is wrong,
one sglang adapter) -> files uploaded through the filer -> convergence -> an engine restart ->
a scale-up to 5 -> an adapter deletion. Every wait is on the truth: the engines' own
`/v1/models` listings and the adapters' status, never on a fixed sleep. Exit code 0 when
everything converged, 1 with the reason otherwise.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import httpx
from kubernetes import client
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from devstack.stack import Stack
from functions.resources.kinds import (
    INFERENCE_SERVICE,
    INFERENCE_SERVICE_LABEL,
    MODEL,
    MODEL_DEPLOYMENT,
    MODEL_DEPLOYMENT_LABEL,
    SGLANG_ADAPTER,
    VLLM_ADAPTER,
    Kind,
)

NAMESPACE = "loraflow-demo"
MODEL_NAME = "llama3-8b-base"
DEPLOYMENT = "llama3-8b"
SERVICE = "qwen-chat"
STEP_TIMEOUT_S = 20.0


class NotConverged(Exception):
    """A step's expectation did not hold in time; the message says which."""


# -- what the narration does with the stack --------------------------------------------------------
@dataclass
class StackUser:
    """What a user does with kubectl, curl and the filer, against one namespace.

    The narration needs exactly this; the tests' `tests.support.cluster.Cluster` builds on it."""

    stack: Stack
    namespace: str = NAMESPACE

    def create(self, kind: Kind, name: str, spec: dict[str, Any]) -> None:
        body = {
            "apiVersion": kind.api_version,
            "kind": kind.kind,
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": spec,
        }
        self.stack.custom.create_namespaced_custom_object(
            kind.group, kind.version, self.namespace, kind.plural, body
        )

    def get(self, kind: Kind, name: str) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = self.stack.custom.get_namespaced_custom_object(
                kind.group, kind.version, self.namespace, kind.plural, name
            )
        except client.ApiException as err:
            if err.status == 404:
                return None
            raise
        return found

    def patch(self, kind: Kind, name: str, body: dict[str, Any]) -> None:
        self.stack.custom.patch_namespaced_custom_object(
            kind.group, kind.version, self.namespace, kind.plural, name, body
        )

    def delete(self, kind: Kind, name: str) -> None:
        self.stack.custom.delete_namespaced_custom_object(
            kind.group, kind.version, self.namespace, kind.plural, name
        )

    def upload(self, path: str, content: bytes) -> str:
        """Store through the stack's storage (filer or S3 gateway; it notifies); returns the MD5."""
        self.stack.upload(path, content)
        return hashlib.md5(content, usedforsecurity=False).hexdigest()

    def pods(self, selector: str) -> list[dict[str, Any]]:
        pods = self.stack.workload.pods(self.namespace, selector)
        return [p for p in pods if _ready(p) and not p["metadata"].get("deletionTimestamp")]

    def listing(self, pod: dict[str, Any]) -> set[str] | None:
        """The adapters a pod's engine reports in `/v1/models` (None when it does not answer)."""
        port = pod["spec"]["containers"][0]["ports"][0]["containerPort"]
        url = f"http://{pod['status']['podIP']}:{port}/v1/models"
        try:
            models = self.stack.http.get(url, timeout=2).json()
        except (httpx.HTTPError, ValueError):
            return None
        return {m["id"] for m in models.get("data") or [] if m.get("parent")}


def _ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            return dict(cond)
    return {}


# -- adapters -------------------------------------------------------------------------------------------
@dataclass
class Adapter:
    name: str
    kind: Kind
    target: str
    rank: int
    corrupt: bool = False
    engine_name: str = ""

    @property
    def label(self) -> str:
        return "vLLM" if self.kind is VLLM_ADAPTER else "SGLang"

    @property
    def selector(self) -> str:
        label = MODEL_DEPLOYMENT_LABEL if self.kind is VLLM_ADAPTER else INFERENCE_SERVICE_LABEL
        return f"{label}={self.target}"

    @property
    def handle(self) -> str:
        """The name the engine knows it by (vllm: metadata.name; sglang: spec.name)."""
        return self.engine_name or self.name


ADAPTERS = [
    Adapter("finance-qa", VLLM_ADAPTER, DEPLOYMENT, rank=8),
    Adapter("legal-summaries", VLLM_ADAPTER, DEPLOYMENT, rank=16),
    Adapter("bad-checksum", VLLM_ADAPTER, DEPLOYMENT, rank=8, corrupt=True),
    Adapter("support-tone", SGLANG_ADAPTER, SERVICE, rank=16, engine_name="support-tone"),
]


def adapter_files(rank: int) -> dict[str, bytes]:
    return {
        "adapter_config.json": json.dumps({"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank}).encode(),
        "adapter_model.safetensors": os.urandom(4096),
    }


@dataclass
class Row:
    name: str
    kind: str
    phase: str
    ready: str
    loaded_in: str
    reason: str


def status_row(cluster: StackUser, adapter: Adapter) -> Row:
    """One line of `kubectl get`-like status, with LOADED-IN counted from the engines."""
    obj = cluster.get(adapter.kind, adapter.name)
    pods = cluster.pods(adapter.selector)
    loaded = sum(1 for p in pods if adapter.handle in (cluster.listing(p) or set()))
    if obj is None:
        return Row(adapter.name, adapter.label, "(deleted)", "-", f"{loaded}/{len(pods)}", "")
    status = obj.get("status") or {}
    if adapter.kind is VLLM_ADAPTER:
        phase, ready = str(status.get("phase", "Pending")), str(status.get("ready", False))
        blame = _condition(obj, "Ready") if status.get("phase") == "Failed" else _condition(obj, "Loaded")
    else:
        phase = "Available" if _condition(obj, "Available").get("status") == "True" else "Unavailable"
        ready = _condition(obj, "Loaded").get("status", "Unknown")
        blame = _condition(obj, "Error") or _condition(obj, "Loaded")
    reason = str(blame.get("reason", ""))
    if obj["metadata"].get("deletionTimestamp"):
        phase = "Terminating"
    return Row(adapter.name, adapter.label, phase, ready, f"{loaded}/{len(pods)}", reason)


def status_table(cluster: StackUser, title: str) -> Table:
    table = Table(title=title, title_justify="left")
    for column in ("NAME", "KIND", "PHASE/AVAILABLE", "READY/LOADED", "LOADED-IN", "REASON"):
        table.add_column(column)
    for adapter in ADAPTERS:
        row = status_row(cluster, adapter)
        table.add_row(row.name, row.kind, row.phase, row.ready, row.loaded_in, row.reason)
    return table


# -- the narrated run ------------------------------------------------------------------------------------
class Demo:
    def __init__(self, stack: Stack, console: Console | None = None) -> None:
        self.stack = stack
        self.cluster = StackUser(stack)
        self.console = console or Console()
        self.timings: list[tuple[str, float]] = []
        self._live: Live | None = None
        self._step = ""
        self._started = time.monotonic()

    # -- plumbing -----------------------------------------------------------------------------------------
    def say(self, message: str) -> None:
        elapsed = time.monotonic() - self._started
        console = self._live.console if self._live else self.console
        console.print(f"  [green]✓[/] [dim]{elapsed:6.2f}s[/] {message}")

    @contextmanager
    def step(self, title: str) -> Iterator[None]:
        self.console.rule(f"[bold]{title}")
        self._step = title
        started = time.monotonic()
        with Live(self._view(), console=self.console, refresh_per_second=8, transient=True) as live:
            self._live = live
            try:
                yield
            finally:
                self._live = None
        self.timings.append((title, time.monotonic() - started))

    def _view(self) -> Group:
        return Group(status_table(self.cluster, f"{self._step} ..."))

    def wait(self, what: str, check: Callable[[], bool], timeout: float = STEP_TIMEOUT_S) -> None:
        """Poll `check` (re-rendering the live view) until true; NotConverged after `timeout`."""
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                raise NotConverged(f"{what}: not reached within {timeout:.0f}s")
            if self._live is not None:
                self._live.update(self._view())
            time.sleep(0.15)
        if self._live is not None:
            self._live.update(self._view())

    # -- truth ------------------------------------------------------------------------------------------
    def loaded_everywhere(self, adapter: Adapter, expected_pods: int) -> bool:
        pods = self.cluster.pods(adapter.selector)
        listings = [self.cluster.listing(p) for p in pods]
        return len(pods) == expected_pods and all(adapter.handle in (s or set()) for s in listings)

    def loaded_nowhere(self, adapter: Adapter) -> bool:
        pods = self.cluster.pods(adapter.selector)
        return all(adapter.handle not in (self.cluster.listing(p) or {adapter.handle}) for p in pods)

    def phase_is(self, adapter: Adapter, phase: str) -> bool:
        return status_row(self.cluster, adapter).phase == phase

    # -- steps --------------------------------------------------------------------------------------------
    def create_targets(self) -> None:
        self.stack.core.create_namespace({"metadata": {"name": NAMESPACE}})
        self.say(f"namespace {NAMESPACE} created")
        self.cluster.create(MODEL, MODEL_NAME, {"displayName": "Llama 3 8B", "tags": ["llama3", "base"]})
        self.say(f"Model {MODEL_NAME} created")
        names = [a.name for a in ADAPTERS if a.kind is VLLM_ADAPTER]
        self.cluster.create(
            MODEL_DEPLOYMENT, DEPLOYMENT, {"model": MODEL_NAME, "replicas": 3, "loraAdapters": names}
        )
        self.say(f"ModelDeployment {DEPLOYMENT} created (vLLM, 3 replicas, adapters {', '.join(names)})")
        self.cluster.create(
            INFERENCE_SERVICE, SERVICE, {"runtime": "sglang", "model": "qwen2.5-7b", "replicas": 2}
        )
        self.say(f"InferenceService {SERVICE} created (SGLang, 2 replicas)")
        self.wait(
            "3 vLLM pods Ready", lambda: len(self.cluster.pods(f"{MODEL_DEPLOYMENT_LABEL}={DEPLOYMENT}")) == 3
        )
        self.wait(
            "2 SGLang pods Ready", lambda: len(self.cluster.pods(f"{INFERENCE_SERVICE_LABEL}={SERVICE}")) == 2
        )
        self.say("5 engine pods Ready (3 vLLM, 2 SGLang), each on its own 127.0.0.x address")

    def create_adapters(self) -> dict[str, dict[str, bytes]]:
        files: dict[str, dict[str, bytes]] = {}
        for adapter in ADAPTERS:
            files[adapter.name] = adapter_files(adapter.rank)
            if adapter.kind is VLLM_ADAPTER:
                self.cluster.create(VLLM_ADAPTER, adapter.name, self._vllm_spec(adapter, files[adapter.name]))
                note = " (declares a WRONG md5 on purpose)" if adapter.corrupt else ""
                self.say(f"LoRAAdapter {adapter.name} created: model {MODEL_NAME}, rank {adapter.rank}{note}")
            else:
                path = self._sglang_dir(adapter)
                self.write_sglang(adapter, files[adapter.name])
                self.cluster.create(
                    SGLANG_ADAPTER,
                    adapter.name,
                    {
                        "name": adapter.engine_name,
                        "path": str(path),
                        "inferenceServiceRef": {"name": SERVICE},
                    },
                )
                self.say(f"LoRAAdapter {adapter.name} (SGLang kind) created: path {path}")
        return files

    def _vllm_dir(self, adapter: Adapter) -> str:
        return f"/loraadapters/{NAMESPACE}/{MODEL_NAME}/{adapter.name}/"

    def _sglang_storage_dir(self, adapter: Adapter) -> str:
        return f"/sglang-adapters/{adapter.name}"

    def _sglang_dir(self, adapter: Adapter) -> str:
        return f"{self.stack.mount_root}{self._sglang_storage_dir(adapter)}"

    def _vllm_spec(self, adapter: Adapter, files: dict[str, bytes]) -> dict[str, Any]:
        md5 = {
            self._vllm_dir(adapter) + name: hashlib.md5(content, usedforsecurity=False).hexdigest()
            for name, content in files.items()
        }
        if adapter.corrupt:
            md5[self._vllm_dir(adapter) + "adapter_model.safetensors"] = "0" * 32
        return {
            "model": MODEL_NAME,
            "displayName": adapter.name.replace("-", " ").title(),
            "integrity": {"md5": md5},
        }

    def write_sglang(self, adapter: Adapter, files: dict[str, bytes]) -> None:
        """The sglang kind has no storage step: its files are already at spec.path, which the SGLang pods
        see through their SeaweedFS mount (so they are put there through the storage)."""
        directory = self._sglang_storage_dir(adapter)
        for name, content in files.items():
            self.cluster.upload(f"{directory}/{name}", content)
        self.say(
            f"{adapter.name}: adapter_config.json + weights placed at spec.path (the SGLang pods' volume)"
        )

    def upload(self, files: dict[str, dict[str, bytes]]) -> None:
        for adapter in ADAPTERS:
            if adapter.kind is VLLM_ADAPTER:  # the sglang kind needs no upload
                for name, content in files[adapter.name].items():
                    digest = self.cluster.upload(self._vllm_dir(adapter) + name, content)
                    self.say(
                        f"uploaded {self._vllm_dir(adapter)}{name} ({len(content)} B, md5 {digest[:8]}…)"
                    )

    def converge(self) -> None:
        good = [a for a in ADAPTERS if not a.corrupt]
        for adapter in good:
            pods = 3 if adapter.kind is VLLM_ADAPTER else 2
            if adapter.kind is VLLM_ADAPTER:
                self.wait(f"{adapter.name} Ready", partial(self.phase_is, adapter, "Ready"))
                self.say(f"{adapter.name}: files verified, phase Ready")
            else:
                self.wait(f"{adapter.name} Available", partial(self.phase_is, adapter, "Available"))
                self.say(f"{adapter.name}: Available")
            self.wait(
                f"{adapter.name} loaded in {pods} pods",
                partial(self.loaded_everywhere, adapter, pods),
            )
            self.say(f"{adapter.name}: loaded into {pods}/{pods} pods (engines' /v1/models)")
            # the engines answer before the load step has reported it: its event follows
            self.wait(f"{adapter.name}'s adapter.loaded event", partial(self._reported_loaded, adapter))
            self.say(f"{adapter.name}: {self.trace_of(adapter)}")
        corrupt = next(a for a in ADAPTERS if a.corrupt)
        self.wait(f"{corrupt.name} Failed", lambda: self._failed_integrity(corrupt))
        self.say(f"{corrupt.name}: phase Failed, reason IntegrityCheckFailed, loaded nowhere")

    def trace_of(self, adapter: Adapter) -> str:
        """The trace of the chain of events that loaded `adapter`: every event a step emitted
        carries the trace of the event that caused it (W3C traceparent), so one trace id names
        the whole chain, from the event that started it to adapter.loaded."""
        trace_id = self._loaded_trace(adapter)
        if trace_id is None:
            return "no trace on its adapter.loaded event"
        chain: list[str] = []
        for entry in self._received():
            type_ = str(entry["type"])
            # io.loraflow.adapter.loaded.v2 -> loaded (one name per fact, whatever its version)
            short = re.sub(r"\.v[0-9]+$", "", type_.removeprefix("io.loraflow.")).removeprefix("adapter.")
            if type_.startswith("dev.knative."):
                kind = "apiserver" if ".apiserver." in type_ else "source"
                short = f"{kind} {type_.rpartition('.')[2]}"
            if entry.get("trace_id") == trace_id and short not in chain:
                chain.append(short)
        return f"trace {trace_id} ({' -> '.join(chain)})"

    def _received(self) -> list[dict[str, Any]]:
        return [e for e in self.stack.broker.log.since(0) if e["outcome"] == "received"]

    def _loaded_trace(self, adapter: Adapter) -> str | None:
        """The trace id of the newest adapter.loaded event the broker received for `adapter`."""
        subject = adapter.kind.path(NAMESPACE, adapter.name)
        loaded = [
            e
            for e in self._received()
            if e["type"] == "io.loraflow.adapter.loaded.v1" and e["subject"] == subject and e.get("trace_id")
        ]
        return str(loaded[-1]["trace_id"]) if loaded else None

    def _reported_loaded(self, adapter: Adapter) -> bool:
        return self._loaded_trace(adapter) is not None

    def _failed_integrity(self, adapter: Adapter) -> bool:
        row = status_row(self.cluster, adapter)
        return row.phase == "Failed" and row.reason == "IntegrityCheckFailed" and self.loaded_nowhere(adapter)

    def restart(self) -> None:
        pod = self.cluster.pods(f"{MODEL_DEPLOYMENT_LABEL}={DEPLOYMENT}")[0]["metadata"]["name"]
        self.stack.workload.restart(NAMESPACE, pod, wait=False)
        self.say(f"engine in pod {pod} restarted (adapters lost, pod not Ready, restartCount +1)")
        vllm = [a for a in ADAPTERS if a.kind is VLLM_ADAPTER and not a.corrupt]
        self.wait(f"{pod} reloaded", lambda: self._pod_has(pod, vllm))
        self.say(f"{pod} Ready again -> reloaded {', '.join(a.name for a in vllm)}")

    def _pod_has(self, pod_name: str, adapters: list[Adapter]) -> bool:
        pods = [
            p
            for p in self.cluster.pods(f"{MODEL_DEPLOYMENT_LABEL}={DEPLOYMENT}")
            if p["metadata"]["name"] == pod_name
        ]
        listing = self.cluster.listing(pods[0]) if pods else None
        return listing is not None and all(a.handle in listing for a in adapters)

    def scale_up(self) -> None:
        self.cluster.patch(MODEL_DEPLOYMENT, DEPLOYMENT, {"spec": {"replicas": 5}})
        self.say(f"ModelDeployment {DEPLOYMENT} scaled 3 -> 5")
        for adapter in (a for a in ADAPTERS if a.kind is VLLM_ADAPTER and not a.corrupt):
            self.wait(f"{adapter.name} in 5 pods", partial(self.loaded_everywhere, adapter, 5))
            self.say(f"{adapter.name}: loaded into the new replicas (5/5)")

    def delete(self) -> None:
        adapter = next(a for a in ADAPTERS if a.name == "legal-summaries")
        self.cluster.delete(VLLM_ADAPTER, adapter.name)
        self.say(f"LoRAAdapter {adapter.name} deleted (finalizer loraflow.io/unload holds it)")
        self.wait(f"{adapter.name} unloaded", lambda: self.loaded_nowhere(adapter))
        self.say(f"{adapter.name}: unloaded from every pod")
        self.wait(f"{adapter.name} gone", lambda: self.cluster.get(VLLM_ADAPTER, adapter.name) is None)
        self.say(f"{adapter.name}: finalizer removed, object gone")

    def verify(self) -> None:
        """The final truth: exactly what should be loaded is, everywhere."""
        expectations = {
            f"{MODEL_DEPLOYMENT_LABEL}={DEPLOYMENT}": ({"finance-qa"}, 5),
            f"{INFERENCE_SERVICE_LABEL}={SERVICE}": ({"support-tone"}, 2),
        }
        for selector, (wanted, count) in expectations.items():
            pods = self.cluster.pods(selector)
            if len(pods) != count:
                raise NotConverged(f"{selector}: {len(pods)} Ready pods, expected {count}")
            for pod in pods:
                listing = self.cluster.listing(pod)
                if listing != wanted:
                    raise NotConverged(f"pod {pod['metadata']['name']} lists {listing}, expected {wanted}")
        self.say("every engine lists exactly the adapters it should (finance-qa x5, support-tone x2)")
        if not self._failed_integrity(next(a for a in ADAPTERS if a.corrupt)):
            raise NotConverged("bad-checksum is not Failed/IntegrityCheckFailed")
        self.say("bad-checksum stays Failed (IntegrityCheckFailed); legal-summaries is gone")

    def run(self) -> None:
        with self.step("1. targets: Model, vLLM ModelDeployment x3, SGLang InferenceService x2"):
            self.create_targets()
        with self.step("2. adapters: created"):
            files = self.create_adapters()
        with self.step("3. files: uploaded, verified, adapters loaded"):
            self.upload(files)
            self.converge()
        with self.step("4. engine restart -> reload"):
            self.restart()
        with self.step("5. scale-up 3 -> 5 -> new replicas loaded"):
            self.scale_up()
        with self.step("6. delete an adapter -> unloaded, gone"):
            self.delete()
        with self.step("7. verify against the engines"):
            self.verify()

    def summary(self, total: float) -> None:
        self.console.print(status_table(self.cluster, "Final status"))
        timings = Table(title="Timings", title_justify="left")
        timings.add_column("STEP")
        timings.add_column("SECONDS", justify="right")
        for title, seconds in self.timings:
            timings.add_row(title, f"{seconds:.2f}")
        timings.add_row("[bold]total (stack start to end)", f"[bold]{total:.2f}")
        self.console.print(timings)
        stats = self.stack.broker.stats()
        self.console.print(
            f"broker: {stats['received']} events received, {stats['delivered']} deliveries, "
            f"{stats['replies']} replies, {stats['retried']} retries, {stats['dead_lettered']} dead-lettered"
        )


def quiet_logs() -> None:
    """Keep the narration readable: the functions' JSON logs and request logs go quiet."""
    from functions.observability import configure_logging

    configure_logging(logging.WARNING)
    for name in ("loraflow", "werkzeug", "devstack", "botocore", "kubernetes"):
        logging.getLogger(name).setLevel(logging.WARNING)


def main() -> int:
    console = Console()
    quiet_logs()
    started = time.monotonic()
    console.print("[bold]loraflow demo[/]: starting the embedded stack ...")
    with Stack(ping_period=5, filer_signing=True) as stack:
        console.print(
            f"  [green]✓[/] stack up in {time.monotonic() - started:.2f}s (broker {stack.broker.url})"
        )
        demo = Demo(stack, console)
        try:
            demo.run()
        except NotConverged as err:
            console.print(status_table(demo.cluster, "Status at failure"))
            console.print(f"[bold red]NOT CONVERGED[/]: {err}")
            return 1
        demo.summary(time.monotonic() - started)
    console.print("[bold green]everything converged[/]")
    return 0
