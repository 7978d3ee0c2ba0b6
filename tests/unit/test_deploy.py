"""What memtop ships for Prometheus and Grafana (deploy/): the alert rules pass `promtool check
rules` and their own `promtool test rules` cases, the example scrape config passes `promtool
check config`, and the Grafana dashboard is dashboard JSON with the panels the README names,
whose every query is valid PromQL (checked by promtool) over names memtop exports. A real
Prometheus evaluating them over a real run: tests/integration/test_prometheus.py."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
from factories import ROOT

from probes.export.names import EXPORTED

DEPLOY = ROOT / "deploy"
DASHBOARD = DEPLOY / "grafana" / "memtop.json"
RULES = DEPLOY / "prometheus" / "memtop-rules.yml"
INSTALL = "apt-get install -y prometheus (Debian's package brings promtool)"


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip(f"promtool is not installed here: {INSTALL}")
    return path


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def queries(dash: dict) -> list[str]:
    """Every PromQL expression of the dashboard: panel targets and annotations."""
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [a["expr"] for a in dash["annotations"]["list"] if "expr" in a]
    return exprs


def concrete(expr: str) -> str:
    """A dashboard query as Grafana sends it with every value of every variable selected."""
    return re.sub(r"\$\{?(host|run|rank)\}?", ".*", expr).replace("$__rate_interval", "1m")


def test_the_dashboard_is_dashboard_json_with_the_panels_named():
    dash = dashboard()
    assert dash["uid"] and dash["title"] and isinstance(dash["schemaVersion"], int)
    titles = {p["title"]: p for p in dash["panels"]}
    memory = titles["Memory per rank (reserved − allocated shaded)"]
    assert memory["type"] == "timeseries" and memory["repeat"] == "rank"
    refs = {t["refId"]: t["expr"] for t in memory["targets"]}
    assert "memtop_reserved_bytes" in refs["B"] and "- memtop_allocated_bytes" in refs["B"]
    shaded = {o["matcher"]["options"]: {p["id"]: p["value"] for p in o["properties"]}
              for o in memory["fieldConfig"]["overrides"]}
    assert shaded["B"]["custom.fillOpacity"] > 0  # the band between allocated and reserved
    assert shaded["A"]["custom.stacking"] == shaded["B"]["custom.stacking"]  # stacked on it
    tokens = titles["Tokens/s per rank (straggler)"]
    assert any(t["expr"].startswith("bottomk(1, memtop_tokens_per_second")
               for t in tokens["targets"])
    split = titles["Step split (stacked)"]
    assert split["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"
    assert "memtop_phase_seconds" in split["targets"][0]["expr"]
    leak = [a for a in dash["annotations"]["list"] if a.get("name") == "Leak alerts"]
    assert leak and "memtop_leak_alert" in leak[0]["expr"] and leak[0]["enable"]


def test_every_query_names_only_exported_metrics_and_defined_variables():
    dash = dashboard()
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert {"datasource", "host", "run", "rank"} <= variables
    for expr in queries(dash):
        for name in re.findall(r"\bmemtop_\w+", expr):
            assert name in EXPORTED, f"{name} in {expr!r} is not exported"
        for var in re.findall(r"\$\{?(\w+)\}?", expr):
            assert var in variables, f"${var} in {expr!r} is not a dashboard variable"
    for panel in dash["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]


def test_no_two_panels_overlap():
    cells: dict[tuple[int, int], str] = {}
    for panel in dashboard()["panels"]:
        g = panel["gridPos"]
        assert g["x"] + g["w"] <= 24, panel["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]


def test_every_dashboard_query_is_valid_promql(tmp_path):
    """promtool parses each query as a recording rule's expression (its PromQL parser)."""
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"memtop_dashboard_query_{i}", "expr": concrete(expr)}
        for i, expr in enumerate(queries(dashboard()))]}]}
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(json.dumps(rules))  # JSON is YAML
    done = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_rules_pass_promtool_check_and_their_own_tests():
    tool = promtool()
    done = subprocess.run([tool, "check", "rules", str(RULES)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and "4 rules found" in done.stdout, done.stdout + done.stderr
    done = subprocess.run([tool, "test", "rules", "memtop-rules.test.yml"], capture_output=True,
                          text=True, timeout=60, cwd=RULES.parent)
    assert done.returncode == 0 and "SUCCESS" in done.stdout, done.stdout + done.stderr
    for name in re.findall(r"\bmemtop_\w+", RULES.read_text()):
        assert name in EXPORTED, name


def test_the_example_scrape_config_passes_promtool_check_config():
    done = subprocess.run([promtool(), "check", "config", "prometheus.yml"], capture_output=True,
                          text=True, timeout=60, cwd=DEPLOY / "prometheus")
    assert done.returncode == 0, done.stdout + done.stderr
