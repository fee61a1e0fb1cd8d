"""The Grafana dashboard as Grafana's own v1 dashboard schema types it (@grafana/schema's
generated `Dashboard`, checked by the TypeScript compiler), plus what the issue asks of it: a
schemaVersion Grafana 12 writes (41-42), a datasource variable that every panel and query uses,
no fixed Prometheus UID, and the panels an admin needs."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from chart_support import DASHBOARD, dashboard

from kubeseer.devcluster import binaries

GRAFANA_SCHEMA = "@grafana/schema@13.2.3"
TYPESCRIPT = "typescript@5.9.3"


def test_schema_version_and_datasource_variable():
    board = dashboard()
    assert 41 <= board["schemaVersion"] <= 42
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert board["uid"] == "kubeseer-overview"


def test_no_fixed_datasource_uid():
    board = dashboard()
    seen = []

    def walk(node):
        if isinstance(node, dict):
            if "datasource" in node and isinstance(node["datasource"], dict):
                seen.append(node["datasource"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(board)
    prometheus = [d for d in seen if d.get("type") == "prometheus"]
    assert prometheus and all(d["uid"] == "${datasource}" for d in prometheus)


def test_the_panels_the_issue_asks_for():
    titles = {p["title"] for p in dashboard()["panels"] if p["type"] != "row"}
    for wanted in (
        "GPU memory per job: predicted and observed",
        "SM activity per job: predicted and observed",
        "Median prediction error by model family",
        "Median prediction error by GPU product",
        "Placements by profile",
        "Out-of-memory escalations",
        "Stranded MIG memory",
        "Extender latency",
    ):
        assert wanted in titles


def test_panels_do_not_overlap():
    cells = set()
    for panel in dashboard()["panels"]:
        g = panel["gridPos"]
        assert g["x"] + g["w"] <= 24
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, panel["title"]
                cells.add((x, y))


@pytest.fixture(scope="module")
def grafana_types() -> Path:
    """@grafana/schema and the TypeScript compiler from npm, cached in ~/.cache/kubeseer."""
    if shutil.which("npm") is None or shutil.which("node") is None:
        pytest.skip("node and npm are not installed, so Grafana's schema types cannot be used")
    root = binaries.cache_root() / "npm" / "grafana-schema-13.2.3"
    tsc = root / "node_modules" / "typescript" / "bin" / "tsc"
    if not tsc.exists():
        root.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--prefix", str(root),
             GRAFANA_SCHEMA, TYPESCRIPT],
            check=True,
            capture_output=True,
        )  # fmt: skip
    return root


def check(root: Path, board: dict, workdir: Path) -> subprocess.CompletedProcess[str]:
    types = root / "node_modules" / "@grafana" / "schema" / "dist" / "types" / "raw"
    source = workdir / "dashboard.ts"
    source.write_text(
        f"import type {{ Dashboard }} from {json.dumps(str(types / 'dashboard/x/types.gen'))};\n"
        f"export const dashboard = {json.dumps(board, indent=1)} satisfies Dashboard;\n"
    )
    return subprocess.run(
        ["node", str(root / "node_modules" / "typescript" / "bin" / "tsc"), "--noEmit", "--strict",
         "--target", "es2022", "--moduleResolution", "node", str(source)],
        capture_output=True,
        text=True,
        check=False,
    )  # fmt: skip


def test_the_dashboard_is_a_grafana_v1_dashboard(grafana_types, tmp_path):
    result = check(grafana_types, json.loads(DASHBOARD.read_text()), tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def _no_schema_version(board):
    del board["schemaVersion"]


def _text_height(board):
    board["panels"][1]["gridPos"]["h"] = "eight"


def _unknown_panel_key(board):
    board["panels"][1]["queries"] = board["panels"][1].pop("targets")


@pytest.mark.parametrize(
    ("break_it", "error"),
    [
        (_no_schema_version, "Property 'schemaVersion' is missing"),
        (_text_height, "Type 'string' is not assignable to type 'number'"),
        (_unknown_panel_key, "'\"queries\"' does not exist in type 'Panel'"),
    ],
    ids=["no schemaVersion", "a height in words", "a key Grafana does not know"],
)
def test_the_schema_check_refuses_a_broken_dashboard(grafana_types, tmp_path, break_it, error):
    board = dashboard()
    break_it(board)
    result = check(grafana_types, board, tmp_path)
    assert result.returncode != 0
    assert error in result.stdout, result.stdout
