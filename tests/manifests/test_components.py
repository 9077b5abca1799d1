"""The optional parts of knative/ (kustomize Components): every combination renders with the real
kubectl, every object validates, and each component adds what it says and nothing else.

Also the event registry: one Knative EventType per catalog type (the core's, plus components/sqs's
aws-sqs), whose `schema` is the URI the JSON Schema is published at, the `dataschema` of our events.
"""

from __future__ import annotations

import itertools
import json
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from events import external
from events.catalog import CATALOG, SCHEMAS, sample
from events.schema_urls import schema_file, schema_url
from tests.support import manifests
from tests.support.manifests import K8S_VERSION, KNATIVE, filter_types, is_custom, validator_for

COMPONENTS = ("webhook", "sqs", "monitoring", "filer-source")
COMBINATIONS = [c for n in range(len(COMPONENTS) + 1) for c in itertools.combinations(COMPONENTS, n)]
Obj = dict[str, Any]


@cache
def render(components: tuple[str, ...], tmp: str) -> tuple[Obj, ...]:
    return manifests.render(components, Path(tmp))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("overlays"))


def key(obj: Obj) -> tuple[str, str, str, str]:
    meta = obj["metadata"]
    return (obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"])


def by_key(objects: tuple[Obj, ...]) -> dict[tuple[str, str, str, str], Obj]:
    return {key(o): o for o in objects}


def added(components: tuple[str, ...], workdir: str) -> dict[tuple[str, str, str, str], Obj]:
    core = by_key(render((), workdir))
    return {k: o for k, o in by_key(render(components, workdir)).items() if k not in core}


def of(objects: tuple[Obj, ...] | list[Obj], kind: str, name: str | None = None) -> list[Obj]:
    return [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


# -- every combination ---------------------------------------------------------------------------
@pytest.mark.parametrize("components", COMBINATIONS, ids=lambda c: "+".join(c) or "core")
def test_every_combination_renders_the_sum_of_its_parts(components: tuple[str, ...], workdir: str) -> None:
    objects = by_key(render(components, workdir))
    assert len(objects) == len(render(components, workdir)), "an object is rendered twice"
    expected = set(by_key(render((), workdir)))
    for component in components:
        expected |= set(added((component,), workdir))
    assert set(objects) == expected


def test_every_object_of_every_component_validates(workdir: str) -> None:
    everything = render(COMPONENTS, workdir)
    problems: list[str] = []
    for obj in everything:
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        if is_custom(obj):
            validator = validator_for(obj["apiVersion"], obj["kind"])
            problems += [f"{where} {list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(obj)]
        else:
            try:
                kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
            except kubernetes_validate.ValidationError as err:
                problems.append(f"{where}: {err}")
    assert problems == []
    assert {"PodMonitor", "PrometheusRule", "ContainerSource", "IntegrationSource"} <= {
        o["kind"] for o in everything
    }


def test_triggers_of_every_combination_name_types_someone_sends(workdir: str) -> None:
    emitted = {e.type for e in CATALOG if e.direction == "emitted"}
    for components in COMBINATIONS:
        objects = render(components, workdir)
        sent = set(emitted)
        if of(objects, "ApiServerSource"):
            sent |= set(external.API_TYPES)
        if of(objects, "PingSource"):
            sent.add(external.PING)
        if of(objects, "IntegrationSource"):
            sent.add(external.AWS_SQS)
        for trigger in of(objects, "Trigger"):
            assert filter_types(trigger["spec"]["filters"]) <= sent, (components, trigger["metadata"]["name"])


# -- each component --------------------------------------------------------------------------------
def test_sqs_adds_the_source_its_trigger_and_its_eventtype(workdir: str) -> None:
    new = list(added(("sqs",), workdir).values())
    assert sorted((o["kind"], o["metadata"]["name"]) for o in new) == [
        ("EventType", external.AWS_SQS),
        ("IntegrationSource", "loraflow-seaweedfs-sqs"),
        ("Trigger", "loraflow-ingest-sqs"),
    ]
    (trigger,) = of(new, "Trigger")
    assert trigger["spec"]["subscriber"]["ref"]["name"] == "loraflow-ingest"
    assert filter_types(trigger["spec"]["filters"]) == {external.AWS_SQS}
    (source,) = of(new, "IntegrationSource")
    assert source["spec"]["sink"]["ref"] == {
        "apiVersion": "eventing.knative.dev/v1",
        "kind": "Broker",
        "name": "loraflow",
    }


def token_ref(objects: tuple[Obj, ...]) -> Obj:
    (ingest,) = of(objects, "Service", "loraflow-ingest")
    (env,) = [
        e
        for e in ingest["spec"]["template"]["spec"]["containers"][0]["env"]
        if e["name"] == "LORAFLOW_WEBHOOK_TOKEN"
    ]
    ref: Obj = env["valueFrom"]["secretKeyRef"]
    return ref


def test_webhook_makes_the_token_required_and_changes_nothing_else(workdir: str) -> None:
    core, webhook = render((), workdir), render(("webhook",), workdir)
    assert token_ref(core) == {"name": "loraflow-webhook", "key": "token", "optional": True}
    assert token_ref(webhook) == {"name": "loraflow-webhook", "key": "token", "optional": False}
    token_ref(webhook)["optional"] = True  # render() is cached: compare a copy below
    changed = [k for k, o in by_key(webhook).items() if by_key(core).get(k) != o]
    token_ref(webhook)["optional"] = False
    assert changed == []


def test_monitoring_scrapes_every_function_pod(workdir: str) -> None:
    new = list(added(("monitoring",), workdir).values())
    assert sorted(o["kind"] for o in new) == ["ConfigMap", "PodMonitor", "PrometheusRule"]
    (monitor,) = of(new, "PodMonitor")
    selector = monitor["spec"]["selector"]
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "user-port" and endpoint["path"] == "/metrics"
    services = of(render((), workdir), "Service")
    assert services
    for service in services:  # Knative copies the template's labels onto the pod, and adds its own
        labels = {**service["spec"]["template"]["metadata"]["labels"], "serving.knative.dev/service": "x"}
        assert selector["matchLabels"].items() <= labels.items(), service["metadata"]["name"]
        assert all(e["key"] in labels for e in selector["matchExpressions"] if e["operator"] == "Exists")
    (dashboard,) = of(new, "ConfigMap")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = (KNATIVE / "components" / "monitoring" / "dashboard.json").read_text()
    assert json.loads(dashboard["data"]["loraflow.json"]) == json.loads(shipped)


def test_filer_source_adds_the_source_its_rbac_lease_trigger_and_eventtype(workdir: str) -> None:
    """What it adds (the details: tests/manifests/test_filer_source_component.py)."""
    new = list(added(("filer-source",), workdir).values())
    assert sorted(o["kind"] for o in new) == [
        "ContainerSource",
        "EventType",
        "Lease",
        "Role",
        "RoleBinding",
        "ServiceAccount",
        "Trigger",
    ]
    (source,) = of(new, "ContainerSource")
    (container,) = source["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["python", "-m", "functions.filer_source"]
    (function,) = of(render((), workdir), "Service", "loraflow-stat")
    assert container["image"] == function["spec"]["template"]["spec"]["containers"][0]["image"]
    assert source["spec"]["template"]["spec"]["serviceAccountName"] == "loraflow-filer-source"
    assert source["spec"]["sink"]["ref"]["kind"] == "Broker"
    (role,) = of(new, "Role")
    assert [rule["resourceNames"] for rule in role["rules"]] == [["loraflow-filer-source"]]
    for path in (KNATIVE / "components" / "filer-source").iterdir():
        assert "PLACEHOLDER" not in path.read_text(), path.name


# -- the event registry ---------------------------------------------------------------------------------
def test_one_eventtype_per_catalog_type_with_the_published_schema(workdir: str) -> None:
    eventtypes = of(render(("sqs",), workdir), "EventType")
    assert sorted(e["spec"]["type"] for e in eventtypes) == sorted(entry.type for entry in CATALOG)
    by_type = {e["spec"]["type"]: e for e in eventtypes}
    for entry in CATALOG:
        spec = by_type[entry.type]["spec"]
        assert by_type[entry.type]["apiVersion"] == "eventing.knative.dev/v1beta2"
        assert by_type[entry.type]["metadata"]["name"] == entry.type
        assert spec["reference"] == {
            "apiVersion": "eventing.knative.dev/v1",
            "kind": "Broker",
            "name": "loraflow",
        }
        assert spec["description"].startswith(entry.summary)
        assert spec["schema"] == schema_url(entry.type)
        committed = json.loads((SCHEMAS / schema_file(entry.type)).read_text())
        assert committed["$id"] == spec["schema"]
        if entry.type in external.API_TYPES:
            assert "source" not in spec  # the cluster's API server URL
        else:
            assert spec["source"] == sample(entry)["source"]
    assert external.AWS_SQS not in {e["spec"]["type"] for e in of(render((), workdir), "EventType")}


def test_the_config_maps_schema_base_is_the_eventtypes(workdir: str) -> None:
    """dataschema (LORAFLOW_SCHEMA_BASE_URL + file) and each EventType's schema agree as shipped."""
    (config,) = of(render((), workdir), "ConfigMap", "loraflow-config")
    base = config["data"]["LORAFLOW_SCHEMA_BASE_URL"]
    for eventtype in of(render(("sqs",), workdir), "EventType"):
        assert eventtype["spec"]["schema"] == schema_url(eventtype["spec"]["type"], base)
