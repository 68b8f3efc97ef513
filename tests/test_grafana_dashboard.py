"""deploy/grafana/governance.json, deploy/prometheus/prometheus.yml and the
Prometheus and Grafana services of deploy/compose.yaml: the dashboard queries
only metrics GET /metrics exports, in PromQL that Prometheus parses; the
scrape config loads; and every web and worker container writes its work
counts into the one folder GET /metrics adds up."""

from __future__ import annotations

import fcntl
import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from django.urls import resolve

from governance.rules.outbound import parse_allow_list
from tests.conftest import REPO_ROOT
from tests.metrics_names import exported_names, promql_metric_names

DEPLOY = REPO_ROOT / "deploy"
DASHBOARD_FILE = DEPLOY / "grafana" / "governance.json"
DASHBOARD = json.loads(DASHBOARD_FILE.read_text())
SCRAPE_CONFIG_FILE = DEPLOY / "prometheus" / "prometheus.yml"
SCRAPE_CONFIG = yaml.safe_load(SCRAPE_CONFIG_FILE.read_text())
COMPOSE = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
SERVICES = COMPOSE["services"]
PROMTOOL = shutil.which("promtool")
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# What Grafana puts in for its variables, where PromQL itself must parse.
VARIABLE_VALUES = {"$__rate_interval": "2m", "$__interval": "30s", "$__range": "6h"}


def panels() -> list[dict]:
    found = []
    for panel in DASHBOARD["panels"]:
        found += [panel, *panel.get("panels", [])]  # a collapsed row holds its own
    return found


def expressions() -> list[tuple[str, str]]:
    return [
        (f"{panel['title']} {target['refId']}", target["expr"])
        for panel in panels()
        for target in panel.get("targets", [])
    ]


def app_services() -> list[str]:
    """The services that run the image: web, the workers, beat and migrate."""
    return [
        name
        for name, service in SERVICES.items()
        if service.get("image") == "agent-governance:latest"
    ]


def unescaped(compose_text: str) -> str:
    return compose_text.replace("$$", "$")  # compose's escape of a literal $


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    assert PROMTOOL, "promtool not found: apt-get install prometheus (.ci/services.sh does on CI)"
    return subprocess.run(
        [PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=60
    )  # fmt: skip


# --- The PromQL reader itself ---


@pytest.mark.parametrize(
    "expression, metrics",
    [
        (
            "sum by (provider, outcome) (rate(governance_provider_attempts_total"
            '{provider=~"$provider", outcome!="accepted"}[$__rate_interval]))',
            {"governance_provider_attempts_total"},
        ),
        (
            "histogram_quantile(0.95, sum by(le, stage_kind) "
            "(rate(governance_stage_clock_seconds_bucket[${__rate_interval}])))",
            {"governance_stage_clock_seconds_bucket"},
        ),
        ("max without (instance, job) (up) or on (job) vector(0)", {"up"}),
        ("a_metric offset 5m / ignoring (x) group_left (y) b_metric", {"a_metric", "b_metric"}),
        ("a * on(x) group_left c_metric", {"a", "c_metric"}),
        ("SUM BY (le) (bar) > Inf", {"bar"}),
        ("sum(foo) by (bar)", {"foo"}),
        ("topk(5, foo) and on() bar unless baz", {"foo", "bar", "baz"}),
        ('label_replace(foo, "dst", "$1", "src", "(.*)")', {"foo"}),
        ("rate (foo[1m] @ start()) # a comment naming not_a_metric", {"foo"}),
        ('count({__name__="runs_total", status="queued"}) > bool 1e3', {"runs_total"}),
        ('rec:rule:rate5m{job="x"}[5m:30s]', {"rec:rule:rate5m"}),
    ],
)
def test_the_reader_finds_metrics_and_nothing_else(expression, metrics):
    assert promql_metric_names(expression) == metrics


def test_the_reader_refuses_what_prometheus_would_not_parse():
    with pytest.raises(ValueError):
        promql_metric_names("sum(rate(governance_turn_events_total[5m])")


# --- The dashboard ---


def test_the_dashboard_is_the_one_provisioning_loads():
    assert DASHBOARD["uid"] == "agent-governance"
    assert DASHBOARD["title"] == "Agent governance"
    assert 36 <= DASHBOARD["schemaVersion"] <= 41
    variables = {v["name"]: v for v in DASHBOARD["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [panel["id"] for panel in panels()]
    assert len(ids) == len(set(ids))


def test_every_panel_queries_prometheus_through_the_variable():
    for panel in panels():
        if panel["type"] == "row":
            assert not panel.get("targets"), panel["title"]
            continue
        assert panel.get("description"), panel["title"]
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel.get("targets"), f"{panel['title']} has no query"
        for target in panel["targets"]:
            assert target["expr"].strip(), panel["title"]
            assert target.get("datasource", DATASOURCE) == DATASOURCE, panel["title"]
        refs = [target["refId"] for target in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]


def test_on_call_sees_the_state_first():
    top = sorted(
        (p for p in panels() if p["gridPos"]["y"] == 0), key=lambda p: p["gridPos"]["x"]
    )  # fmt: skip
    assert {p["type"] for p in top} == {"stat"}
    assert sum(p["gridPos"]["w"] for p in top) <= 24
    named = " ".join(e for p in top for t in p["targets"] for e in promql_metric_names(t["expr"]))
    for gauge in (
        "governance_segments_by_refusal_state",
        "governance_incidents_open",
        "governance_incident_unacknowledged_oldest_seconds",
        "governance_provider_breaker",
        "governance_approvals_waiting",
        "governance_tool_effects_unknown",
        "governance_stages_waiting",
        "governance_stage_oldest_wait_seconds",
    ):
        assert gauge in named.split(), gauge
    below = [p for p in panels() if p["gridPos"]["y"] > 0]
    assert below and {p["type"] for p in below} == {"timeseries"}


def test_the_links_open_the_pages_the_runbooks_name():
    """Panels link to the governance dashboard's pages through ${dashboard_url},
    the address the alert runbooks name (GOVERNANCE_DASHBOARD_URL)."""
    runbook_base = "https://governance.example.com"
    variables = {v["name"]: v for v in DASHBOARD["templating"]["list"]}
    assert variables["dashboard_url"]["query"] == runbook_base
    rules = (DEPLOY / "prometheus" / "alerts.yml").read_text()
    runbook_pages = set(re.findall(re.escape(runbook_base) + r"(/[a-z/]*)", rules))
    linked = set()
    for panel in panels():
        if panel["type"] == "row":
            continue
        assert panel.get("links"), panel["title"]
        for link in panel["links"]:
            assert link["url"].startswith("${dashboard_url}/"), link
            page = link["url"].removeprefix("${dashboard_url}")
            resolve(page)  # a page of the dashboard, or Resolver404
            linked.add(page)
    assert runbook_pages and runbook_pages <= linked, sorted(runbook_pages - linked)


def test_every_query_parses_in_prometheus(tmp_path):
    """Each query as a recording rule, with Grafana's variables filled in:
    promtool parses it as Prometheus would."""
    rules = []
    for n, (_where, expr) in enumerate(expressions()):
        for variable, value in VARIABLE_VALUES.items():
            expr = expr.replace(variable, value)
        assert "$" not in expr, expr
        rules.append({"record": f"dashboard:query_{n}", "expr": expr})
    (tmp_path / "queries.yml").write_text(
        yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]})
    )
    checked = promtool("check", "rules", "queries.yml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.django_db
def test_every_metric_the_dashboard_names_is_exported(client, settings):
    exported = exported_names(client, settings)
    named = {}
    for where, expr in expressions():
        for metric in promql_metric_names(expr):
            named.setdefault(metric, where)
    assert len(named) >= 20
    missing = {metric: where for metric, where in named.items() if metric not in exported}
    assert not missing, missing


# --- Prometheus ---


def test_the_scrape_config_loads_in_prometheus(tmp_path):
    """``promtool check config`` on the compose config, its token file put
    where the secret would be (promtool checks that it exists), the rules
    file beside it as compose mounts it."""
    config = yaml.safe_load(SCRAPE_CONFIG_FILE.read_text())
    (job,) = config["scrape_configs"]
    (tmp_path / "token").write_text("test-token\n")
    job["authorization"]["credentials_file"] = str(tmp_path / "token")
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    for rule_file in config["rule_files"]:
        shutil.copy(DEPLOY / "prometheus" / rule_file, tmp_path / rule_file)
    checked = promtool("check", "config", "prometheus.yml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "1 rule files found" in checked.stdout + checked.stderr


def test_prometheus_gets_its_config_its_rules_and_the_token():
    prometheus = SERVICES["prometheus"]
    assert prometheus["image"].startswith("prom/prometheus:")
    mounts = {m.split(":")[1]: m.split(":")[0] for m in prometheus["volumes"]}
    assert mounts["/etc/prometheus/prometheus.yml"] == "./prometheus/prometheus.yml"
    for rule_file in SCRAPE_CONFIG["rule_files"]:
        source = mounts[f"/etc/prometheus/{rule_file}"]
        assert (DEPLOY / source).is_file(), source
    for source in mounts.values():
        assert not source.startswith(".") or (DEPLOY / source).exists(), source
    (job,) = SCRAPE_CONFIG["scrape_configs"]
    (secret,) = prometheus["secrets"]
    assert job["authorization"]["credentials_file"] == f"/run/secrets/{secret}"
    assert COMPOSE["secrets"][secret] == {"environment": "GOVERNANCE_METRICS_TOKEN"}
    assert "GOVERNANCE_METRICS_TOKEN" in COMPOSE["x-app"]["environment"]
    assert "GOVERNANCE_METRICS_TOKEN=" in (DEPLOY / "env.example").read_text()
    (static,) = job["static_configs"]
    assert static["targets"] == ["web:8000"]
    assert "8000" in SERVICES["web"]["command"]


@pytest.mark.django_db
def test_the_scrape_prometheus_sends_is_answered(client, settings):
    """As compose sets the web up (DJANGO_DEBUG=0, DJANGO_ALLOWED_HOSTS plus
    the names inside the deployment): the scrape of web:8000 over plain HTTP
    with the token gets the metrics, neither a redirect to https nor a 400."""
    (job,) = SCRAPE_CONFIG["scrape_configs"]
    (target,) = job["static_configs"][0]["targets"]
    allowed = COMPOSE["x-app"]["environment"]["DJANGO_ALLOWED_HOSTS"]
    allowed = re.sub(r"\$\{DJANGO_ALLOWED_HOSTS[^}]*\}", "governance.example.com", allowed)
    settings.ALLOWED_HOSTS = allowed.split(",")
    settings.SECURE_SSL_REDIRECT = True
    settings.GOVERNANCE_METRICS_TOKEN = "scrape-token"
    settings.GOVERNANCE_METRICS_ALLOW = parse_allow_list([])
    scrape = client.get(
        job["metrics_path"], HTTP_HOST=target, HTTP_AUTHORIZATION="Bearer scrape-token"
    )  # fmt: skip
    assert scrape.status_code == 200, scrape.status_code
    assert b"governance_approvals_waiting" in scrape.content
    # The web's own health check, on loopback.
    assert client.get("/healthz", HTTP_HOST="127.0.0.1:8000").status_code in (200, 503)
    assert client.get("/runs/", HTTP_HOST=target).status_code == 301  # pages: https only


# --- Grafana ---


def test_grafana_provisions_the_data_source_and_the_dashboard():
    grafana = SERVICES["grafana"]
    assert grafana["image"].startswith("grafana/grafana:")
    mounts = {m.split(":")[1]: m.split(":")[0] for m in grafana["volumes"]}
    provisioning = DEPLOY / mounts["/etc/grafana/provisioning"]
    datasources = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())
    (source,) = datasources["datasources"]
    assert source["type"] == "prometheus" and source["isDefault"]
    assert source["url"] == "http://prometheus:9090" and "prometheus" in SERVICES
    providers = yaml.safe_load((provisioning / "dashboards" / "governance.yml").read_text())
    (provider,) = providers["providers"]
    folder = provider["options"]["path"]
    dashboards = {Path(target).name: source for target, source in mounts.items()
                  if str(Path(target).parent) == folder}  # fmt: skip
    assert dashboards == {"governance.json": "./grafana/governance.json"}
    assert (DEPLOY / dashboards["governance.json"]).resolve() == DASHBOARD_FILE
    assert "GF_SECURITY_ADMIN_PASSWORD" in grafana["environment"]


# --- The work counts' folder, shared by every app container ---


def test_every_app_container_writes_its_counts_into_one_shared_volume():
    apps = app_services()
    assert {"web", "beat", "migrate", "turns", "tools", "alerts", "callbacks"} <= set(apps)
    folders = {SERVICES[name]["environment"]["PROMETHEUS_MULTIPROC_DIR"] for name in apps}
    (folder,) = folders
    volumes = set()
    for name in apps:
        mounted = [m.split(":")[0] for m in SERVICES[name]["volumes"] if m.split(":")[1] == folder]
        assert len(mounted) == 1, name
        volumes.add(mounted[0])
    (volume,) = volumes
    assert volume in COMPOSE["volumes"]  # a named volume, not a folder of one container
    # The image makes the folder for its user: a new volume takes its owner.
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert re.search(rf"mkdir -p [^&]*{re.escape(folder)}", dockerfile)
    assert re.search(rf"chown governance [^&]*{re.escape(folder)}", dockerfile)
    # Every container but migrate holds the folder's lock while it runs.
    for name in apps:
        if name != "migrate":
            assert SERVICES[name]["entrypoint"] == COMPOSE["x-app"]["entrypoint"], name
    assert all(
        SERVICES[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
        for name in apps
        if name != "migrate"
    )


def _entrypoint(name: str) -> list[str]:
    return [unescaped(part) for part in SERVICES[name]["entrypoint"]]


def _locked_alone(path: Path) -> bool:
    with path.open("a") as held:
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(held, fcntl.LOCK_UN)
        return True


def test_migrate_empties_the_counts_only_when_no_app_container_runs(tmp_path):
    """The compose entry points themselves, run here with sh and flock: a
    running app container keeps its counts; once it is gone, migrate's start
    empties the folder before the command it was given."""
    assert shutil.which("flock"), "flock not found (Debian: util-linux)"
    env = {"PATH": "/usr/bin:/bin", "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    counts = tmp_path / "counter_web-7.db"
    counts.write_bytes(b"counts")
    app = subprocess.Popen([*_entrypoint("web"), "sleep", "60"], env=env)
    try:
        deadline = time.monotonic() + 10
        while _locked_alone(tmp_path / ".in-use"):
            assert time.monotonic() < deadline, "the app container's lock was never taken"
            time.sleep(0.05)
        kept = subprocess.run(
            [*_entrypoint("migrate"), "echo", "migrated"],
            env=env, capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert kept.returncode == 0, kept.stderr
        assert "migrated" in kept.stdout and "still run" in kept.stdout
        assert counts.exists()
    finally:
        app.terminate()
        app.wait(timeout=10)
    emptied = subprocess.run(
        [*_entrypoint("migrate"), "echo", "migrated"],
        env=env, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert emptied.returncode == 0, emptied.stderr
    assert emptied.stdout.strip() == "migrated"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".in-use"]
