"""admit on fakes (tests/support/fakes.py): the finalizer, the status admission writes, the
admitted event, refusals and the races of its guarded writes, in milliseconds.

The same step over real HTTP against the API server is tests/functions/test_admit.py; the
status decisions by table are tests/unit/test_admit_decide.py and test_admission.py.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from cloudevents.http import CloudEvent

from events.domain import ADAPTER_ADMITTED, ADAPTER_DELETING, ADAPTER_DRIFTED, STEP_EXTENSION, AdapterDeleting
from events.schema_urls import schema_file
from functions import admit
from functions.edge.bootstrap import Deps
from functions.errors import KubeConflict, Reject, Retryable
from functions.logic import reasons
from functions.resources.kinds import INFERENCE_SERVICE, MODEL, SGLANG_ADAPTER, VLLM_ADAPTER, Kind
from functions.settings import Settings
from tests.support.fakes import FakeBroker, FakeKube, FakeStorage, watch_callbacks
from tests.support.objects import adapter_event, api_event, inference_service

NS = "team-a"
NOW = datetime(2026, 6, 1, tzinfo=UTC)
SCHEMAS = "https://schemas.example/loraflow/"
Obj = dict[str, Any]


def model(name: str = "m1", namespace: str = NS) -> Obj:
    return {
        "apiVersion": MODEL.api_version,
        "kind": MODEL.kind,
        "metadata": {"name": name, "namespace": namespace},
    }


def new_vllm(name: str = "a1", model_name: str = "m1", md5s: dict[str, str] | None = None) -> Obj:
    """A vllm LoRAAdapter as a user creates it: no finalizer, no status."""
    spec: Obj = {"model": model_name}
    if md5s is not None:
        spec["integrity"] = {"md5": md5s}
    return {
        "apiVersion": VLLM_ADAPTER.api_version,
        "kind": VLLM_ADAPTER.kind,
        "metadata": {"name": name, "namespace": NS},
        "spec": spec,
    }


def new_sglang(name: str = "s1", target: tuple[str, str] = (NS, "chat"), path: str = "/models/s1") -> Obj:
    return {
        "apiVersion": SGLANG_ADAPTER.api_version,
        "kind": SGLANG_ADAPTER.kind,
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "inferenceServiceRef": {"namespace": target[0], "name": target[1]},
            "name": name,
            "path": path,
        },
    }


class CountingKube(FakeKube):
    """Counts the GETs of each kind (what admission reads besides the adapter)."""

    def __init__(self, *objects: Obj) -> None:
        super().__init__(*objects)
        self.gets: dict[str, int] = {}

    def get(self, kind: Kind, namespace: str, name: str) -> Obj | None:
        self.gets[kind.kind] = self.gets.get(kind.kind, 0) + 1
        return super().get(kind, namespace, name)


class Cluster:
    def __init__(self, *objects: Obj, **settings: Any) -> None:
        self.kube = CountingKube(*objects)
        self.broker = FakeBroker()
        self.storage = FakeStorage()
        self.deps = Deps(
            Settings(schema_base_url=SCHEMAS, **settings),
            kube=self.kube,
            storage=self.storage,
            broker=self.broker,
            clock=lambda: NOW,
        )

    def run(self, event: CloudEvent) -> CloudEvent | None:
        return admit.handle(event, self.deps)

    def added(self, obj: Obj) -> CloudEvent | None:
        """The ApiServerSource's add event for the object as stored."""
        meta = obj["metadata"]
        kind = VLLM_ADAPTER if obj["apiVersion"] == VLLM_ADAPTER.api_version else SGLANG_ADAPTER
        stored = self.kube.get(kind, meta["namespace"], meta["name"])
        assert stored is not None
        return self.run(api_event("add", stored))

    def stored(self, kind: Kind = VLLM_ADAPTER, name: str = "a1") -> Obj:
        found = self.kube.get(kind, NS, name)
        assert found is not None
        return found

    def conditions(self, kind: Kind = VLLM_ADAPTER, name: str = "a1") -> dict[str, tuple[str, str]]:
        return {
            c["type"]: (c["status"], c["reason"]) for c in self.stored(kind, name)["status"]["conditions"]
        }

    def warnings(self) -> list[str]:
        return [reason for _, type_, reason, _ in self.kube.events if type_ == "Warning"]


# -- vllm ---------------------------------------------------------------------------------------
def test_a_first_admission_adds_the_finalizer_writes_the_status_and_replies() -> None:
    cluster = Cluster(model(), new_vllm())
    reply = cluster.added(new_vllm())
    assert reply is not None and reply["type"] == ADAPTER_ADMITTED
    assert reply["subject"] == VLLM_ADAPTER.path(NS, "a1") and reply["source"] == "/loraflow/admit"
    assert reply["dataschema"] == SCHEMAS + schema_file(ADAPTER_ADMITTED)
    assert reply.get_data() == {
        "adapter": {"apiVersion": VLLM_ADAPTER.api_version, "namespace": NS, "name": "a1"},
        "generation": 1,
    }
    stored = cluster.stored()
    assert stored["metadata"]["finalizers"] == ["loraflow.io/unload"]
    status = dict(stored["status"])
    (ready,) = status.pop("conditions")
    assert status == {
        "storageRef": {"path": f"/loraadapters/{NS}/m1/a1/"},
        "observedGeneration": 1,
        "phase": "Pending",
        "ready": False,
    }
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "Unknown", reasons.ADMITTED)
    assert cluster.kube.events == []


def test_its_own_writes_come_back_as_updates_answered_without_a_read() -> None:
    cluster = Cluster(model(), new_vllm())
    assert cluster.added(new_vllm()) is not None
    update = api_event("update", cluster.stored())
    writes, reads = cluster.kube.writes, dict(cluster.kube.gets)
    assert cluster.run(update) is None
    assert (cluster.kube.writes, cluster.kube.gets) == (writes, reads)


def test_an_admission_that_changes_nothing_replies_nothing() -> None:
    cluster = Cluster(model(), new_vllm())
    assert cluster.added(new_vllm()) is not None
    writes = cluster.kube.writes
    assert (
        cluster.run(adapter_event(ADAPTER_DRIFTED, VLLM_ADAPTER, NS, "a1", **{STEP_EXTENSION: "admit"}))
        is None
    )
    assert cluster.kube.writes == writes


def test_a_missing_model_is_said_once_and_its_arrival_admits_the_adapter() -> None:
    cluster = Cluster(new_vllm())
    assert cluster.added(new_vllm()) is not None
    assert cluster.conditions() == {"Ready": ("False", reasons.MODEL_NOT_FOUND)}
    assert cluster.stored()["status"]["phase"] == "Failed"
    assert cluster.warnings() == [reasons.MODEL_NOT_FOUND]
    # the same verdict again: no write, no reply, no second Warning
    drifted = adapter_event(ADAPTER_DRIFTED, VLLM_ADAPTER, NS, "a1", **{STEP_EXTENSION: "admit"})
    assert cluster.run(drifted) is None
    assert cluster.warnings() == [reasons.MODEL_NOT_FOUND]
    # the Model appears: the adapters waiting for it are admitted and their events published
    cluster.kube.put(model())
    assert cluster.run(api_event("add", cluster.kube.get(MODEL, NS, "m1") or {})) is None
    assert cluster.conditions() == {"Ready": ("Unknown", reasons.ADMITTED)}
    assert [e["type"] for e in cluster.broker.events] == [ADAPTER_ADMITTED]
    assert cluster.broker.events[0]["dataschema"] == SCHEMAS + schema_file(ADAPTER_ADMITTED)


def test_a_model_arrival_leaves_the_adapters_that_do_not_wait_for_it() -> None:
    cluster = Cluster(model(), new_vllm("a1"), new_vllm("a2", model_name="m2"))
    cluster.added(new_vllm("a1"))
    cluster.added(new_vllm("a2", model_name="m2"))
    writes = cluster.kube.writes
    other = model("m3")
    cluster.kube.put(other)
    assert cluster.run(api_event("add", cluster.kube.get(MODEL, NS, "m3") or {})) is None
    assert cluster.kube.writes == writes and cluster.broker.events == []


def test_a_model_name_that_cannot_exist_is_not_found_without_a_read() -> None:
    cluster = Cluster(new_vllm(model_name="Not_A_Name"))
    cluster.added(new_vllm(model_name="Not_A_Name"))
    assert MODEL.kind not in cluster.kube.gets
    assert cluster.conditions() == {"Ready": ("False", reasons.MODEL_NOT_FOUND)}
    assert "storageRef" not in cluster.stored()["status"]


def test_an_integrity_key_outside_the_adapter_is_refused_in_the_status() -> None:
    outside = {"/loraadapters/team-b/m1/x/w.bin": "0" * 32}
    cluster = Cluster(model(), new_vllm(md5s=outside))
    assert cluster.added(new_vllm()) is not None
    assert cluster.conditions() == {"Ready": ("False", reasons.INTEGRITY_PATH_OUTSIDE_ADAPTER)}
    assert cluster.stored()["status"]["phase"] == "Failed"
    (name, _, reason, message) = cluster.kube.events[0]
    assert (name, reason) == ("a1", reasons.INTEGRITY_PATH_OUTSIDE_ADAPTER)
    assert "/loraadapters/team-b/m1/x/w.bin" in message


def test_a_new_generation_is_admitted_and_a_lost_finalizer_put_back() -> None:
    cluster = Cluster(model(), model("m2"), new_vllm())
    cluster.added(new_vllm())
    edited = cluster.stored()
    edited["spec"]["model"] = "m2"
    edited["metadata"]["generation"] = 2
    cluster.kube.put(edited)
    reply = cluster.run(api_event("update", cluster.stored()))
    assert reply is not None and reply.get_data()["generation"] == 2  # type: ignore[index]
    assert cluster.stored()["status"]["storageRef"] == {"path": f"/loraadapters/{NS}/m2/a1/"}
    stripped = cluster.stored()
    stripped["metadata"]["finalizers"] = []
    cluster.kube.put(stripped)
    assert cluster.run(api_event("update", cluster.stored())) is not None  # the finalizer changed
    assert cluster.stored()["metadata"]["finalizers"] == ["loraflow.io/unload"]


@pytest.mark.parametrize("kind", [VLLM_ADAPTER, SGLANG_ADAPTER])
def test_a_deletion_our_finalizer_holds_is_passed_on_to_unload_from_the_event(kind: Kind) -> None:
    adapter, name = (new_vllm(), "a1") if kind == VLLM_ADAPTER else (new_sglang(), "s1")
    cluster = Cluster(model(), inference_service(NS, "chat"), adapter)
    cluster.added(adapter)
    cluster.kube.delete(kind, NS, name)
    deleting = cluster.stored(kind, name)
    writes, reads = cluster.kube.writes, dict(cluster.kube.gets)
    for verb in ("update", "add"):  # an add: the source's first listing met the deletion
        reply = cluster.run(api_event(verb, deleting))
        assert reply is not None and reply["type"] == ADAPTER_DELETING
        assert reply["subject"] == kind.path(NS, name) and reply["source"] == "/loraflow/admit"
        assert reply["dataschema"] == SCHEMAS + schema_file(ADAPTER_DELETING)
        assert AdapterDeleting.model_validate(reply.get_data()).adapter.name == name
    assert (cluster.kube.writes, cluster.kube.gets) == (writes, reads)  # from the event alone


def test_a_deletion_without_our_finalizer_gone_adapter_and_other_kinds_are_left_to_others() -> None:
    cluster = Cluster(model(), new_vllm())
    unadmitted = new_vllm()
    unadmitted["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    writes = cluster.kube.writes
    assert cluster.run(api_event("update", unadmitted)) is None  # nothing of ours waits on it
    assert (
        cluster.run(adapter_event(ADAPTER_DRIFTED, VLLM_ADAPTER, NS, "gone", **{STEP_EXTENSION: "admit"}))
        is None
    )
    service = inference_service(NS, "chat")
    assert cluster.run(api_event("add", service)) is None  # not a kind admit admits
    assert cluster.run(api_event("update", model())) is None  # a Model's update: only its add matters
    assert cluster.kube.writes == writes


# -- sglang -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("service", "adapter", "settings", "available"),
    [
        (inference_service(NS, "chat"), new_sglang(), {}, ("True", reasons.INFERENCE_SERVICE_READY)),
        (None, new_sglang(), {}, ("False", reasons.INFERENCE_SERVICE_NOT_FOUND)),
        (
            inference_service(NS, "chat", runtime="vllm"),
            new_sglang(),
            {},
            ("False", reasons.RUNTIME_MISMATCH),
        ),
        (
            inference_service("team-b", "chat"),
            new_sglang(target=("team-b", "chat")),
            {},
            ("False", reasons.REFERENCE_NOT_PERMITTED),
        ),
        (
            inference_service("team-b", "chat", accepts=NS),
            new_sglang(target=("team-b", "chat")),
            {},
            ("True", reasons.INFERENCE_SERVICE_READY),
        ),
        (
            inference_service(NS, "chat"),
            new_sglang(path="/etc/passwd"),
            {"sglang_roots": "/models"},
            ("False", reasons.PATH_NOT_ALLOWED),
        ),
        (
            inference_service(NS, "chat"),
            new_sglang(path="/models/../etc"),
            {},
            ("False", reasons.PATH_NOT_ALLOWED),
        ),
    ],
    ids=["ready", "missing", "runtime", "no-consent", "consent", "root", "dotdot"],
)
def test_sglang_availability_and_error(
    service: Obj | None, adapter: Obj, settings: dict[str, Any], available: tuple[str, str]
) -> None:
    cluster = Cluster(*([service] if service else []), adapter, **settings)
    reply = cluster.added(adapter)
    assert reply is not None and reply["type"] == ADAPTER_ADMITTED
    seen = cluster.conditions(SGLANG_ADAPTER, "s1")
    assert seen["Available"] == available
    error = ("False", reasons.NO_ERROR) if available[0] == "True" else ("True", available[1])
    assert seen["Error"] == error
    assert cluster.warnings() == ([] if available[0] == "True" else [available[1]])


def test_sglang_a_fixed_runtime_clears_admits_error_but_not_another_steps() -> None:
    service = inference_service(NS, "chat", runtime="vllm")
    cluster = Cluster(service, new_sglang())
    cluster.added(new_sglang())
    assert cluster.conditions(SGLANG_ADAPTER, "s1")["Error"] == ("True", reasons.RUNTIME_MISMATCH)
    service["spec"]["runtime"] = "sglang"
    cluster.kube.put(service)
    drifted = adapter_event(ADAPTER_DRIFTED, SGLANG_ADAPTER, NS, "s1", **{STEP_EXTENSION: "admit"})
    assert cluster.run(drifted) is not None
    assert cluster.conditions(SGLANG_ADAPTER, "s1")["Error"] == ("False", reasons.NO_ERROR)
    # an Error another step set stays as it is
    stored = cluster.stored(SGLANG_ADAPTER, "s1")
    for condition in stored["status"]["conditions"]:
        if condition["type"] == "Error":
            condition.update(status="True", reason="LoadFailed")
    cluster.kube.put(stored)
    cluster.run(drifted)
    assert cluster.conditions(SGLANG_ADAPTER, "s1")["Error"] == ("True", "LoadFailed")


def test_sglang_a_reference_that_cannot_name_anything_is_not_found_without_a_read() -> None:
    cluster = Cluster(new_sglang(target=("Bad_Namespace", "chat")))
    cluster.added(new_sglang(target=("Bad_Namespace", "chat")))
    assert INFERENCE_SERVICE.kind not in cluster.kube.gets
    assert cluster.conditions(SGLANG_ADAPTER, "s1")["Available"] == (
        "False",
        reasons.INFERENCE_SERVICE_NOT_FOUND,
    )


def test_sglang_a_stored_inference_service_that_fails_its_schema_is_a_reject() -> None:
    broken = inference_service(NS, "chat")
    broken["spec"] = "not an object"
    cluster = Cluster(broken, new_sglang())
    with pytest.raises(Reject, match="InferenceService"):
        cluster.added(new_sglang())


# -- races --------------------------------------------------------------------------------------
def stat_writes_files(obj: Obj) -> None:
    """What stat's status write, landing first, leaves in the object."""
    obj.setdefault("status", {})["files"] = [{"path": f"/loraadapters/{NS}/m1/a1/w.bin", "size": 3}]


def test_a_conflict_is_retried_from_the_newer_object_and_loses_no_field() -> None:
    cluster = Cluster(model(), new_vllm())
    inside = watch_callbacks(cluster.kube, cluster.storage, cluster.broker)
    cluster.kube.meddle(VLLM_ADAPTER, NS, "a1", stat_writes_files, times=2)
    assert cluster.added(new_vllm()) is not None and cluster.kube.conflicts == 2
    status = cluster.stored()["status"]
    assert status["files"] == [{"path": f"/loraadapters/{NS}/m1/a1/w.bin", "size": 3}]
    assert status["phase"] == "Processing"  # files seen: decided again from the newer object
    assert cluster.kube.gets[MODEL.kind] == 1  # read once, before the write
    assert inside == []


def test_a_spec_naming_another_model_after_a_conflict_is_read_before_writing_again() -> None:
    cluster = Cluster(model(), model("m2"), new_vllm())
    inside = watch_callbacks(cluster.kube)

    def renamed(obj: Obj) -> None:
        obj["spec"]["model"] = "m2"
        obj["metadata"]["generation"] = 2

    cluster.kube.meddle(VLLM_ADAPTER, NS, "a1", renamed)
    reply = cluster.added(new_vllm())
    assert reply is not None and reply.get_data()["generation"] == 2  # type: ignore[index]
    status = cluster.stored()["status"]
    assert status["storageRef"] == {"path": f"/loraadapters/{NS}/m2/a1/"}
    assert (status["observedGeneration"], status["conditions"][0]["reason"]) == (2, reasons.ADMITTED)
    assert cluster.kube.gets[MODEL.kind] == 2 and inside == []


def test_sglang_a_reference_changed_after_a_conflict_is_read_before_writing_again() -> None:
    cluster = Cluster(inference_service(NS, "chat"), new_sglang())
    inside = watch_callbacks(cluster.kube)

    def retargeted(obj: Obj) -> None:
        obj["spec"]["inferenceServiceRef"]["name"] = "gone"

    cluster.kube.meddle(SGLANG_ADAPTER, NS, "s1", retargeted)
    assert cluster.added(new_sglang()) is not None
    available = cluster.conditions(SGLANG_ADAPTER, "s1")["Available"]
    assert available == ("False", reasons.INFERENCE_SERVICE_NOT_FOUND)
    assert cluster.kube.gets[INFERENCE_SERVICE.kind] == 2 and inside == []


def test_a_spec_that_keeps_changing_under_the_write_is_retried_later() -> None:
    """Every write meets a newer spec naming another Model: each is read, and after
    READ_ROUNDS of them the event is answered 503 (the last edit's own update admits it)."""
    cluster = Cluster(*[model(f"m{i}") for i in range(1, 9)], new_vllm())
    kube, turn = cluster.kube, iter(range(2, 9))

    def renamed(obj: Obj) -> None:
        obj["spec"]["model"] = f"m{next(turn)}"

    write = kube.write_status

    def renamed_first(kind: Kind, namespace: str, name: str, desired: Any, current: Any = None) -> Any:
        kube.meddle(kind, namespace, name, renamed)
        return write(kind, namespace, name, desired, current)

    kube.write_status = renamed_first  # type: ignore[method-assign]
    with pytest.raises(KubeConflict):
        cluster.added(new_vllm())
    assert kube.conflicts == admit.READ_ROUNDS and "conditions" not in cluster.stored().get("status", {})


def test_conflicts_that_outlast_the_attempts_are_retryable_and_write_nothing() -> None:
    cluster = Cluster(model(), new_vllm())
    cluster.kube.meddle(VLLM_ADAPTER, NS, "a1", stat_writes_files, times=5)
    with pytest.raises(Retryable):
        cluster.added(new_vllm())
    assert "conditions" not in cluster.stored()["status"]


def test_a_conflict_on_the_finalizer_is_retried_too() -> None:
    cluster = Cluster(model(), new_vllm())

    def labelled(obj: Obj) -> None:
        obj["metadata"]["labels"] = {"team": "a"}

    cluster.kube.meddle(VLLM_ADAPTER, NS, "a1", labelled, write="finalizers")
    assert cluster.added(new_vllm()) is not None
    stored = cluster.stored()
    assert stored["metadata"]["finalizers"] == ["loraflow.io/unload"]
    assert stored["metadata"]["labels"] == {"team": "a"} and cluster.kube.conflicts == 1


# -- hostile input ------------------------------------------------------------------------------
def hostile_adapter(**metadata: Any) -> CloudEvent:
    obj = new_vllm()
    obj["metadata"] = {**obj["metadata"], **metadata}
    return api_event("add", {**obj, "metadata": obj["metadata"]})


@pytest.mark.parametrize(
    ("event", "needle"),
    [
        (hostile_adapter(name="../x"), "'../x'"),
        (hostile_adapter(name="a" * 254), "name"),
        (hostile_adapter(namespace="Team A"), "namespace"),
        (hostile_adapter(namespace=7), "string name and namespace"),
        (CloudEvent({"type": ADAPTER_DRIFTED, "source": "/t", "id": "1"}, {"adapter": {}}), "invalid"),
        (CloudEvent({"type": ADAPTER_DRIFTED, "source": "/t", "id": "1"}, b"{not json"), "not JSON"),
        (CloudEvent({"type": ADAPTER_DRIFTED, "source": "/t", "id": "1"}, b"[" * 100_000), "not JSON"),
        (
            CloudEvent({"type": "dev.knative.apiserver.resource.add", "source": "/t", "id": "1"}, {}),
            "invalid",
        ),
    ],
    ids=[
        "dotdot",
        "long-name",
        "bad-namespace",
        "namespace-type",
        "empty-ref",
        "not-json",
        "deep",
        "no-object",
    ],
)
def test_hostile_events_are_rejected_before_any_read(event: CloudEvent, needle: str) -> None:
    cluster = Cluster(model(), new_vllm())
    with pytest.raises(Reject, match=needle):
        cluster.run(event)
    assert cluster.kube.gets == {} and cluster.kube.writes == 0
