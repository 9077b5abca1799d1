"""The monitoring component: its alerts pass promtool's rule unit tests (and those tests can fail),
and the Grafana dashboard is well formed, names only metrics and labels we export, parses as
PromQL, and its queries answer from a real Prometheus scraping a real function's /metrics.

promtool and prometheus come from Debian's `prometheus` package (`make venv` installs it).
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import functions_framework
import httpx
import pytest
import yaml
from cloudevents.conversion import to_binary
from cloudevents.http import CloudEvent
from werkzeug.serving import make_server

from functions.metrics import Family
from functions.observability import REGISTRY, WARNING_EVENTS
from tests.support.wait import eventually

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "knative" / "components" / "monitoring"
DASHBOARD = json.loads((MONITORING / "dashboard.json").read_text())
RULES = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())
ALERT_TESTS = Path(__file__).parent / "alerts_test.yaml"
# Labels Prometheus adds to every scraped series (the PodMonitor's relabelling adds `service`).
TARGET_LABELS = {"job", "instance", "namespace", "pod", "service", "le"}
GRID_COLUMNS = 24


def tool(name: str) -> str:
    found = shutil.which(name)
    assert found, f"{name} is not installed (`make venv` installs Debian's prometheus package)"
    return found


# -- what we export --------------------------------------------------------------------------------
def exported() -> dict[str, set[str]]:
    """Every series name /metrics can carry -> its label names."""
    names: dict[str, set[str]] = {}
    for family in REGISTRY._families:
        labels = set(family.labelnames) if isinstance(family, Family) else set()
        kind = getattr(family, "kind", None)
        if kind == "histogram":
            for suffix in ("_bucket", "_sum", "_count"):
                names[family.name + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
        elif kind is not None:
            names[family.name] = labels
    for line in REGISTRY.exposition().decode().splitlines():  # the process_* collector's
        if line.startswith("# TYPE process_"):
            names[line.split()[2]] = set()
    return names


METRIC = re.compile(r"\b((?:loraflow|process)_[a-z_]+)\b")
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
MATCHER = re.compile(r"\{([^}]*)\}")


def uses(expr: str) -> tuple[set[str], set[str]]:
    """Metric names and label names an expression refers to."""
    labels = {
        label.strip() for group in GROUPING.findall(expr) for label in group.split(",") if label.strip()
    }
    for matchers in MATCHER.findall(expr):
        labels |= {m.split("=")[0].rstrip("!~").strip() for m in matchers.split(",") if "=" in m}
    return set(METRIC.findall(expr)), labels


def panel_targets() -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in DASHBOARD["panels"] for t in p.get("targets", [])]


def rule_exprs() -> list[tuple[str, str]]:
    return [(r["alert"], r["expr"]) for g in RULES["spec"]["groups"] for r in g["rules"]]


@pytest.mark.parametrize(("where", "expr"), panel_targets() + rule_exprs(), ids=lambda v: str(v)[:40])
def test_queries_name_only_exported_metrics_and_their_labels(where: str, expr: str) -> None:
    metrics, labels = uses(expr)
    names = exported()
    assert metrics, f"{where}: no metric of ours"
    assert metrics <= set(names), f"{where}: {metrics - set(names)} not exported"
    known = set().union(*(names[m] for m in metrics)) | TARGET_LABELS
    assert labels <= known, f"{where}: labels {labels - known} not on {metrics}"


def test_every_metric_of_ours_is_on_the_dashboard() -> None:
    """(Of the standard process_* ones, memory, CPU and descriptors are shown.)"""
    shown = {m for _, expr in panel_targets() for m in uses(expr)[0] if m.startswith("loraflow_")}
    families = {
        re.sub(r"_(bucket|sum|count)$", "", name) for name in exported() if name.startswith("loraflow_")
    }
    assert {re.sub(r"_(bucket|sum|count)$", "", m) for m in shown} == families


def test_the_metric_names_follow_prometheus_conventions() -> None:
    for name, labels in exported().items():
        assert re.fullmatch(r"[a-z][a-z0-9_]*", name), name
        if name.startswith("loraflow_"):
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            assert base.endswith(("_total", "_seconds", "_bytes")), f"{name}: a unit or _total"
        assert all(re.fullmatch(r"[a-z][a-z0-9_]*", label) for label in labels), name


# -- the dashboard's structure ---------------------------------------------------------------------------
def test_dashboard_structure() -> None:
    assert DASHBOARD["uid"] and len(DASHBOARD["uid"]) <= 40
    assert isinstance(DASHBOARD["schemaVersion"], int) and DASHBOARD["schemaVersion"] >= 36
    (datasource,) = DASHBOARD["templating"]["list"]
    assert datasource["type"] == "datasource" and datasource["query"] == "prometheus"
    panels = DASHBOARD["panels"]
    assert len({p["id"] for p in panels}) == len(panels), "panel ids are unique"
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= GRID_COLUMNS, panel["title"]
        area = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not area & cells, f"{panel['title']} overlaps another panel"
        cells |= area
        if panel["type"] == "row":
            continue
        assert panel["type"] == "timeseries" and panel["description"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(set(refs)) == len(refs)
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"] and target["expr"].strip()


# -- promtool ---------------------------------------------------------------------------------------------
def write_rules(directory: Path, groups: list[dict[str, Any]]) -> Path:
    path = directory / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": groups}))
    return path


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


def test_alert_rules_pass_their_unit_tests(tmp_path: Path) -> None:
    rules = write_rules(tmp_path, RULES["spec"]["groups"])
    checked = run(tool("promtool"), "check", "rules", str(rules))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    shutil.copy(ALERT_TESTS, tmp_path / "alerts_test.yaml")
    tested = run(tool("promtool"), "test", "rules", str(tmp_path / "alerts_test.yaml"))
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_every_alert_has_unit_tests() -> None:
    tested = {
        case["alertname"]
        for test in yaml.safe_load(ALERT_TESTS.read_text())["tests"]
        for case in test["alert_rule_test"]
    }
    assert tested == {alert for alert, _ in rule_exprs()}


@pytest.mark.parametrize("alert", [a for a, _ in rule_exprs()])
def test_the_unit_tests_catch_an_alert_that_never_fires(alert: str, tmp_path: Path) -> None:
    groups = json.loads(json.dumps(RULES["spec"]["groups"]))
    for rule in groups[0]["rules"]:
        if rule["alert"] == alert:
            rule["expr"] = "vector(1) > 2"
    write_rules(tmp_path, groups)
    shutil.copy(ALERT_TESTS, tmp_path / "alerts_test.yaml")
    tested = run(tool("promtool"), "test", "rules", str(tmp_path / "alerts_test.yaml"))
    assert tested.returncode != 0 and alert in tested.stdout + tested.stderr


def grafana_free(expr: str) -> str:
    """Grafana's own variables, as it substitutes them for a 30 s scrape interval."""
    return expr.replace("$__rate_interval", "2m")


def test_dashboard_queries_are_valid_promql(tmp_path: Path) -> None:
    records = [
        {"record": f"loraflow:panel{i}", "expr": grafana_free(expr)}
        for i, (_, expr) in enumerate(panel_targets())
    ]
    checked = run(
        tool("promtool"),
        "check",
        "rules",
        str(write_rules(tmp_path, [{"name": "dashboard", "rules": records}])),
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


# -- a real Prometheus, scraping a real function ---------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def dead_letters_url() -> Iterator[str]:
    """The dead_letters function, served by functions-framework as in its container."""
    app = functions_framework.create_app("dead_letters", str(ROOT / "main.py"), "http")
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


@pytest.fixture
def prometheus(tmp_path: Path, dead_letters_url: str) -> Iterator[str]:
    port = free_port()
    target = dead_letters_url.removeprefix("http://")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "loraflow/loraflow-functions",
                "static_configs": [{"targets": [target], "labels": {"service": "loraflow-dead-letters"}}],
            }
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    process = subprocess.Popen(
        [
            tool("prometheus"),
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        # the query API answers 503 until the TSDB is open: wait for /-/ready, Prometheus's
        # readiness endpoint (a loaded machine takes seconds)
        eventually(lambda: _answers_ready(url), 60, what="Prometheus ready", interval=0.2)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def _answers_ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/-/ready", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def query(prometheus: str, expr: str) -> list[Any]:
    answer = httpx.get(f"{prometheus}/api/v1/query", params={"query": expr}, timeout=10).json()
    assert answer["status"] == "success", (expr, answer)
    result: list[Any] = answer["data"]["result"]
    return result


def dead_letter() -> tuple[dict[str, str], bytes]:
    event = CloudEvent(
        {
            "type": "io.loraflow.adapter.ready.v1",
            "source": "/loraflow/verify",
            "id": "dl-1",
            "knativeerrorcode": "503",
            "knativeerrordest": "http://loraflow-load.loraflow.svc.cluster.local",
        },
        {"adapter": {"apiVersion": "rackai.rackspace.com/v1alpha1", "namespace": "a", "name": "b"}},
    )
    return to_binary(event)


def test_dashboard_queries_answer_from_a_real_prometheus(prometheus: str, dead_letters_url: str) -> None:
    headers, body = dead_letter()
    assert httpx.post(dead_letters_url, headers=headers, content=body).status_code == 204
    rejected = CloudEvent({"type": "not.ours", "source": "/x", "id": "x"}, {})
    assert httpx.post(dead_letters_url, headers=to_binary(rejected)[0], content=b"{}").status_code == 400
    WARNING_EVENTS.labels("verify", "IntegrityCheckFailed").inc()  # this process's registry is the one served
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # two scrapes after the events: enough for rate()
        try:
            if len(query(prometheus, "count_over_time(loraflow_dead_letters_total[1m])")) and query(
                prometheus, "count_over_time(loraflow_dead_letters_total[1m]) >= 3"
            ):
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    else:
        pytest.fail("Prometheus did not scrape the function")
    answered: set[str] = set()
    for title, expr in panel_targets():
        if query(prometheus, grafana_free(expr).replace("2m", "1m")):
            answered.add(title)
    assert {
        "Events handled",
        "Step latency (p50, p99)",
        "Event age at handling (p99)",
        "Dead letters",
        "Warning Events by reason",
        "Resident memory",
        "CPU",
        "Open file descriptors",
    } <= answered
    (series,) = query(prometheus, "loraflow_dead_letters_total")
    assert series["metric"]["type"] == "io.loraflow.adapter.ready.v1" and series["metric"]["code"] == "503"
