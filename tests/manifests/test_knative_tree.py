"""`kubectl apply -k knative/` as is: render with the real kubectl and check every object.

- Knative objects validate against Knative's own CRD schemas, vendored in
  devstack/kubernetes/knative-crds/ (copied from ../shared/reference/knative-crds, see SOURCE.md);
- core objects validate with kubernetes_validate (Kubernetes 1.32, strict);
- every Trigger filter matches a type some source or function really emits, and every type we
  emit has a subscriber (or is listed as public output only);
- every FUNCTION_TARGET exists in main.py (parsed with ast; docs/contracts.md list as fallback);
- RBAC grants only the listed verbs: no wildcard, no delete.

The optional parts (knative/components/) are rendered and checked in test_components.py.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from events.catalog import CATALOG
from events.domain import RESYNC_SHARD
from functions.settings import Settings
from tests.support.manifests import (
    K8S_VERSION,
    ROOT_FIELDS,
    crd_schemas,
    filter_types,
    is_custom,
    validator_for,
)
from tests.support.schemas import to_json_schema

ROOT = Path(__file__).resolve().parents[2]
KNATIVE_CRDS = Path(__file__).resolve().parents[2] / "devstack" / "kubernetes" / "knative-crds"
CONTRACT_FUNCTIONS = {"admit", "stat", "verify", "load", "reload", "unload", "resync", "ingest"}
# ingest's only Trigger is the SQS one (components/sqs): the webhook queue posts to it directly.
TRIGGERED_BY_DEFAULT = CONTRACT_FUNCTIONS - {"ingest"}
STORAGE_STEPS = {"stat", "verify", "load", "resync"}
"""The steps that read storage (load reads adapter_config.json): they alone get its credentials."""
# Types we emit that no step of ours consumes: outputs for platform teams' own Triggers.
PUBLIC_OUTPUT_ONLY = {
    "io.loraflow.adapter.loaded.v1",
    "io.loraflow.adapter.loaded.v2",
    "io.loraflow.adapter.unloaded.v1",
    "io.loraflow.pod.reloaded.v1",
}
APISERVER_TYPES = {f"dev.knative.apiserver.resource.{op}" for op in ("add", "update", "delete")}
ALLOWED_VERBS = {"get", "list", "watch", "patch", "update", "create"}

Obj = dict[str, Any]


@cache
def rendered() -> tuple[Obj, ...]:
    """The objects `kubectl kustomize knative/` renders."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed")
    out = subprocess.run(
        [kubectl, "kustomize", str(ROOT / "knative")], check=True, capture_output=True, text=True
    ).stdout
    return tuple(doc for doc in yaml.safe_load_all(out) if doc)


def of_kind(kind: str) -> list[Obj]:
    return [o for o in rendered() if o["kind"] == kind]


def ident(obj: Obj) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


# --- schemas -----------------------------------------------------------------------------


def test_kustomize_renders_every_file() -> None:
    kinds = {o["kind"] for o in rendered()}
    expected = {"Namespace", "CustomResourceDefinition", "ServiceAccount", "ClusterRole"}
    expected |= {"ClusterRoleBinding", "ConfigMap", "Broker", "Service", "Trigger"}
    expected |= {"ApiServerSource", "PingSource", "SinkBinding", "EventType"}
    assert expected <= kinds
    assert "IntegrationSource" not in kinds, "the SQS path is optional: components/sqs"
    assert len(of_kind("CustomResourceDefinition")) == 5


@pytest.mark.parametrize("obj", [o for o in rendered() if is_custom(o)], ids=ident)
def test_custom_object_validates_against_its_crd(obj: Obj) -> None:
    schema = to_json_schema(crd_schemas()[(obj["apiVersion"], obj["kind"])])
    # The apiserver owns apiVersion, kind and metadata; Knative's schemas leave them out.
    schema["properties"] |= {k: {"type": t} for k, t in ROOT_FIELDS.items()}
    errors = [
        f"{list(e.absolute_path)}: {e.message}" for e in jsonschema.Draft7Validator(schema).iter_errors(obj)
    ]
    assert errors == []


@pytest.mark.parametrize("obj", [o for o in rendered() if not is_custom(o)], ids=ident)
def test_core_object_validates(obj: Obj) -> None:
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_validation_can_fail() -> None:
    """A misspelt field and a wrong type are caught (the checks are not vacuous). Knative's
    Trigger `spec` preserves unknown fields, so the misspelling is at the root."""
    trigger = {**of_kind("Trigger")[0], "spek": {}}
    trigger["spec"] = {**trigger["spec"], "delivery": {"retry": "five"}}
    validator = validator_for("eventing.knative.dev/v1", "Trigger")
    messages = " ".join(e.message for e in validator.iter_errors(trigger))
    assert "spek" in messages
    assert "'five'" in messages


# --- routing -----------------------------------------------------------------------------


def source_types() -> set[str]:
    """Types the sources in the tree send."""
    types: set[str] = set()
    if of_kind("ApiServerSource"):
        types |= APISERVER_TYPES
    if of_kind("PingSource"):
        types.add("dev.knative.sources.ping")
    if any("aws" in s["spec"] and "sqs" in s["spec"]["aws"] for s in of_kind("IntegrationSource")):
        types.add("dev.knative.eventing.aws-sqs")
    return types


def emitted_types() -> set[str]:
    return {e.type for e in CATALOG if e.direction == "emitted"}


def subscriber(trigger: Obj) -> str:
    name: str = trigger["spec"]["subscriber"]["ref"]["name"]
    return name.removeprefix("loraflow-")


@pytest.mark.parametrize("trigger", of_kind("Trigger"), ids=ident)
def test_trigger_filters_name_real_types(trigger: Obj) -> None:
    spec = trigger["spec"]
    assert "filter" not in spec, "use spec.filters (exact/prefix/any), not spec.filter"
    types = filter_types(spec["filters"])
    assert types, "a Trigger without a type filter would receive everything"
    assert types <= source_types() | emitted_types()
    assert spec["broker"] == "loraflow"
    assert spec["delivery"]["deadLetterSink"]["ref"]["name"] == "loraflow-dead-letters"


def test_every_emitted_type_has_a_subscriber() -> None:
    subscribed = {t for tr in of_kind("Trigger") for t in filter_types(tr["spec"]["filters"])}
    assert emitted_types() - subscribed == PUBLIC_OUTPUT_ONLY


def test_every_function_has_a_trigger_and_a_service() -> None:
    services = {s["metadata"]["name"].removeprefix("loraflow-") for s in of_kind("Service")}
    assert services == CONTRACT_FUNCTIONS | {"dead-letters"}
    assert {subscriber(t) for t in of_kind("Trigger")} == TRIGGERED_BY_DEFAULT


def test_contract_routes() -> None:
    """Spot checks of docs/contracts.md: reload on Pods, resync on our PingSource only."""
    by_function: dict[str, list[Any]] = {}
    for trigger in of_kind("Trigger"):
        by_function.setdefault(subscriber(trigger), []).append(trigger["spec"]["filters"])
    assert {"exact": {"kind": "Pod"}} in by_function["reload"][0]
    (tick,) = [f for f in by_function["resync"] if {"exact": {"type": "dev.knative.sources.ping"}} in f]
    (parts,) = [f for f in by_function["resync"] if f is not tick]
    assert {"prefix": {"source": "/apis/v1/namespaces/loraflow/pingsources/loraflow-resync"}} in tick
    assert parts == [{"exact": {"type": RESYNC_SHARD}}, {"exact": {"source": "/loraflow/resync"}}]  # its own
    drift_steps = {
        f["exact"]["loraflowstep"]
        for filters in by_function.values()
        for group in filters
        for f in group
        if "loraflowstep" in f.get("exact", {})
    }
    assert drift_steps == {"admit", "stat", "load", "unload"}


# --- services ------------------------------------------------------------------------------


def main_py_functions() -> set[str]:
    """Names main.py serves: each must resolve to a callable, exactly as functions-framework
    resolves FUNCTION_TARGET (getattr on the loaded source module)."""
    spec = importlib.util.spec_from_file_location("loraflow_main_under_test", ROOT / "main.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {name for name in module.__all__ if callable(getattr(module, name, None))}


def container(service: Obj) -> Obj:
    (only,) = service["spec"]["template"]["spec"]["containers"]
    result: Obj = only
    return result


def env_of(service: Obj) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container(service).get("env", [])}


FUNCTION_SERVICES = [s for s in of_kind("Service") if s["metadata"]["name"] != "loraflow-dead-letters"]


@pytest.mark.parametrize("service", FUNCTION_SERVICES, ids=ident)
def test_function_service(service: Obj) -> None:
    env = env_of(service)
    name = service["metadata"]["name"]
    assert name == f"loraflow-{env['FUNCTION_TARGET']}"
    assert env["FUNCTION_TARGET"] in main_py_functions()
    assert env["FUNCTION_SIGNATURE_TYPE"] == "http"
    assert service["metadata"]["labels"]["networking.knative.dev/visibility"] == "cluster-local"
    template = service["spec"]["template"]
    assert template["metadata"]["annotations"]["autoscaling.knative.dev/min-scale"] == "0"
    assert template["spec"]["serviceAccountName"] == f"loraflow-{env['FUNCTION_TARGET']}"  # its own
    c = container(service)
    assert c["image"] == "ghcr.io/loraflow/functions:0.1.0"
    assert c["readinessProbe"]["httpGet"]["path"] == "/healthz"
    # queue-proxy probes aggressively (every 50 ms) only while periodSeconds is 0: with a period,
    # a scale from zero waits for it (knative/serving pkg/queue/readiness/probe.go IsAggressive)
    assert c["readinessProbe"].get("periodSeconds", 0) == 0
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    # the S3 backend's loraflow identity reaches only the steps that read storage
    s3 = (
        [{"secretRef": {"name": "loraflow-s3", "optional": True}}]
        if env["FUNCTION_TARGET"] in STORAGE_STEPS
        else []
    )
    assert c["envFrom"] == [{"configMapRef": {"name": "loraflow-config"}}, *s3]
    assert {"requests", "limits"} <= set(c["resources"])
    # request threads follow what queue-proxy lets in, plus a probe and a scrape beside them: the
    # server's default (4 per CPU, functions-framework's) would count the node's CPUs
    concurrency = template["spec"]["containerConcurrency"]
    assert concurrency > 0 and env["THREADS"] == str(concurrency + 2)


def test_only_verify_holds_the_filer_write_token() -> None:
    """verify alone writes the filer (it freezes and deletes frozen sets): it reads loraflow's
    write token from a file of the optional Secret loraflow-filer-token, so a rotation reaches
    the running pod; no other function gets it."""
    for service in FUNCTION_SERVICES:
        spec = service["spec"]["template"]["spec"]
        env = env_of(service)
        if service["metadata"]["name"] != "loraflow-verify":
            assert "LORAFLOW_FILER_TOKEN_FILE" not in env
            assert not any((v.get("secret") or {}).get("secretName") == "loraflow-filer-token"
                           for v in spec.get("volumes") or [])  # fmt: skip
            continue
        (volume,) = [v for v in spec["volumes"] if v["name"] == "filer-token"]
        assert volume["secret"]["secretName"] == "loraflow-filer-token"
        assert volume["secret"]["optional"] is True  # a filer without a signing key needs none
        (mount,) = [m for m in container(service)["volumeMounts"] if m["name"] == "filer-token"]
        assert mount["readOnly"] is True
        key_path = volume["secret"]["items"][0]["path"]
        assert env["LORAFLOW_FILER_TOKEN_FILE"] == f"{mount['mountPath']}/{key_path}"
        assert Settings.from_env(env).filer_token_file == env["LORAFLOW_FILER_TOKEN_FILE"]


def test_the_dead_letter_sink_is_our_function() -> None:
    (sink,) = [s for s in of_kind("Service") if s["metadata"]["name"] == "loraflow-dead-letters"]
    assert env_of(sink)["FUNCTION_TARGET"] == "dead_letters" in main_py_functions()
    assert container(sink)["image"] == "ghcr.io/loraflow/functions:0.1.0"
    assert sink["spec"]["template"]["spec"]["serviceAccountName"] == "loraflow-dead-letters"  # no role


def test_config_map_covers_settings_with_defaults() -> None:
    (config,) = of_kind("ConfigMap")
    assert all(key.startswith("LORAFLOW_") for key in config["data"])
    # Each key is a setting and says its default (the map is where an operator tunes them),
    # except the schema base URL, which a cluster points at its own ingest Service.
    defaults, configured = Settings(), Settings.from_env(config["data"])
    named = {key.removeprefix("LORAFLOW_").lower() for key in config["data"]}
    assert named <= set(Settings.model_fields)
    assert {n for n in named if getattr(configured, n) != getattr(defaults, n)} <= {"schema_base_url"}
    tuning = {"filer_page_size", "status_max_files", "load_concurrency", "list_page_size", "engine_timeout",
              "hash_max_bytes", "publish_budget", "vllm_replace"}  # fmt: skip
    assert tuning <= named
    assert "LORAFLOW_WEBHOOK_TOKEN" not in config["data"], "the token belongs in a Secret"
    ingest = next(s for s in FUNCTION_SERVICES if s["metadata"]["name"] == "loraflow-ingest")
    token = env_of(ingest)["LORAFLOW_WEBHOOK_TOKEN"]["secretKeyRef"]
    # optional in the core (SQS needs none; ingest refuses webhook posts without it), required
    # by components/webhook (test_components.py)
    assert token == {"name": "loraflow-webhook", "key": "token", "optional": True}


# --- rbac --------------------------------------------------------------------------------


def rules_of(role: str) -> set[tuple[str, str, str]]:
    (cluster_role,) = [r for r in of_kind("ClusterRole") if r["metadata"]["name"] == role]
    return {
        (group, resource, verb)
        for rule in cluster_role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_rbac_is_least_privilege() -> None:
    for role in of_kind("ClusterRole"):
        for group, resource, verb in rules_of(role["metadata"]["name"]):
            assert "*" not in (group, resource, verb)
            assert verb in ALLOWED_VERBS, (role["metadata"]["name"], resource, verb)


def test_each_function_has_its_own_account_and_ingest_none() -> None:
    """Least privilege per function: its own ServiceAccount, bound to its own ClusterRole only;
    ingest and dead_letters read nothing from Kubernetes: no binding, no token mounted
    (tests/reliability/test_rbac_used.py proves every remaining grant is used)."""
    accounts = {
        a["metadata"]["name"]: a
        for a in of_kind("ServiceAccount")
        if a["metadata"]["namespace"] == "loraflow"
    }
    bindings = {
        b["metadata"]["name"]: b
        for b in of_kind("ClusterRoleBinding")
        if b["metadata"]["name"].startswith("loraflow-")
    }
    for function in CONTRACT_FUNCTIONS | {"dead-letters"}:
        assert f"loraflow-{function}" in accounts
        if function in ("ingest", "dead-letters"):
            account = f"loraflow-{function}"
            assert accounts[account]["automountServiceAccountToken"] is False
            assert not [b for b in bindings.values() if any(s["name"] == account for s in b["subjects"])]
            continue
        binding = bindings[f"loraflow-{function}"]
        assert binding["roleRef"]["name"] == f"loraflow-{function}"
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": f"loraflow-{function}", "namespace": "loraflow"}
        ]
    assert "loraflow-functions" not in accounts


def test_source_rbac_is_read_only_on_watched_kinds() -> None:
    (source,) = of_kind("ApiServerSource")
    assert source["spec"]["serviceAccountName"] == "loraflow-sources"
    grants = rules_of("loraflow-sources")
    assert {verb for _, _, verb in grants} == {"get", "list", "watch"}
    plural = {"LoRAAdapter": "loraadapters", "Model": "models", "ModelDeployment": "modeldeployments"}
    plural |= {"InferenceService": "inferenceservices", "Pod": "pods"}
    for resource in source["spec"]["resources"]:
        group = resource["apiVersion"].rpartition("/")[0]
        assert (group, plural[resource["kind"]], "watch") in grants


def test_bindings_point_at_the_service_accounts() -> None:
    accounts = {(s["metadata"]["namespace"], s["metadata"]["name"]) for s in of_kind("ServiceAccount")}
    for binding in of_kind("ClusterRoleBinding"):
        for subject in binding["subjects"]:
            assert (subject["namespace"], subject["name"]) in accounts


def test_every_function_that_publishes_gets_the_broker_url() -> None:
    """K_SINK comes from the SinkBinding, which selects Services by label: a function that
    publishes to the Broker (besides replying) without that label would fail in a cluster."""
    publishing = {p.stem for p in (ROOT / "functions").glob("*.py") if "broker.publish" in p.read_text()}
    # the filer source is a ContainerSource, whose sink sets its K_SINK (test_filer_source_component)
    publishing -= {"filer_source"}
    assert publishing == {"admit", "ingest", "load", "resync"}
    (binding,) = of_kind("SinkBinding")
    selector = binding["spec"]["subject"]["selector"]["matchLabels"]
    labelled = {
        s["metadata"]["name"]
        for s in of_kind("Service")
        if selector.items() <= (s["metadata"].get("labels") or {}).items()
    }
    assert labelled == {f"loraflow-{name}" for name in publishing}
